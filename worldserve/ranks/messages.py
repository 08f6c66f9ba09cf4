"""Messages between rank 0 of a generation rank group and its peer ranks (ranks/group.py).

Rank 0 runs the stage's engine; for every runner phase it sends each peer one `RankCommand`
saying what to do, runs the phase itself, and waits for every peer's `RankDone`. Peers hold
their batches by `batch_id`. `drop_batches` on any command names batches rank 0 no longer
holds (finished, cancelled, failed). Typed msgpack over a ZeroMQ socket in a private folder,
never pickle; these are not stage `Message`s (the api never sends them).
"""

from __future__ import annotations

from typing import Union

import msgspec

from worldserve.ipc.messages import GenerationParams


class RankMessage(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    """Base of the rank-group messages."""


class RankCommand(RankMessage, kw_only=True):
    seq: int
    drop_batches: list[int] = []


class PrepareBatch(RankCommand, kw_only=True):
    batch_id: int
    row_owner: list[str]
    rows: list[GenerationParams]
    seeds: list[int]


class DenoiseStep(RankCommand, kw_only=True):
    batch_id: int


class DecodeRow(RankCommand, kw_only=True):
    batch_id: int
    row: int


class KeepRows(RankCommand, kw_only=True):
    batch_id: int
    keep: list[int]


class ActivateLora(RankCommand, kw_only=True):
    selection: list[tuple[str, float]]


class LoadLora(RankCommand, kw_only=True):
    name: str
    path: str
    scale: float
    path_2: str | None = None


class UnloadLora(RankCommand, kw_only=True):
    name: str


class UpdateWeights(RankCommand, kw_only=True):
    path: str


class ReleaseMemory(RankCommand, kw_only=True):
    pass


class ResumeMemory(RankCommand, kw_only=True):
    pass


class Shutdown(RankCommand, kw_only=True):
    pass


class RankReady(RankMessage):
    """A peer loaded its model and is joining the process group."""

    rank: int
    pid: int


class RankDone(RankMessage):
    """A peer finished command `seq`; `error` is its one-line failure, if any."""

    seq: int
    rank: int
    error: str | None = None


COMMAND_TYPES = (PrepareBatch, DenoiseStep, DecodeRow, KeepRows, ActivateLora, LoadLora,
                 UnloadLora, UpdateWeights, ReleaseMemory, ResumeMemory, Shutdown)
RankCommandType = Union[COMMAND_TYPES]  # type: ignore[valid-type]
PeerReply = Union[RankReady, RankDone]


class RankCodec:
    """msgpack for the rank-group messages (typed, tagged)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._commands = msgspec.msgpack.Decoder(RankCommandType)
        self._replies = msgspec.msgpack.Decoder(PeerReply)

    def encode(self, msg: RankMessage) -> bytes:
        return self._encoder.encode(msg)

    def decode_command(self, data: bytes) -> RankCommand:
        return self._commands.decode(data)

    def decode_reply(self, data: bytes) -> RankReady | RankDone:
        return self._replies.decode(data)


class RankLaunch(msgspec.Struct, kw_only=True):
    """What a peer rank needs to start (written by rank 0 to a file in the group's private
    folder): its model, its place in the group, and where to find rank 0."""

    rank: int
    world_size: int
    model_dir: str
    dtype: str
    device: str
    layout: dict[str, int | bool]  # levers/parallel/mesh.py ParallelLayout fields
    backend: str  # gloo | nccl
    store_port: int
    command_address: str
    timeout_s: float
    torch_threads: int
    log_level: str = "info"
