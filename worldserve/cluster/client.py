"""`RayStageClient`: the `StageClient` transport over the replicas of one stage deployment.

It implements the one stage-client interface (`ipc/client.py`: call, stream, send_nowait,
handshake, info, state, down_reason), so the api services run unchanged. Per request it picks
the routing key (ids.py) the `OwnerRouter` acts on:

- a new session (`CreateSession`, a realtime chunk 0 of an unknown session): `place`;
- every later call of a session, and a cancel: `pin:<owner>`; the owner comes from the id the
  replica minted, or, for ids the api minted, from the replica that answered the first call
  (remembered here: a session's calls all come through the api replica that holds it);
- anything else (jobs, chat, stats): any replica.

Faults: a pinned call whose owner is gone raises `SessionLost` (410, "session lost, create a
new one") at once; a job stream whose replica dies ends with `ReplicaLost` (the job becomes
`failed` with code `replica_lost`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from worldserve.cluster.ids import PLACE, OwnerGone, owner_of, pin
from worldserve.errors import (
    ReplicaLost,
    RequestTimeout,
    SessionLost,
    StageUnavailable,
    WorldserveError,
    from_code,
)
from worldserve.ipc.client import ReplyStream, StageClient
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import (
    Cancel,
    CloseSession,
    CreateSession,
    ErrorReply,
    GenerationResult,
    RealtimeChunk,
    RealtimeOpen,
    RealtimeRelease,
    RealtimeReleased,
    Reply,
    Request,
    SessionClosed,
    SessionFrame,
    StageInfo,
)

log = logging.getLogger("worldserve.cluster")

SESSION_LOST = "session lost, create a new one"
REPLICA_ERRORS = (OwnerGone, RayActorError, ActorUnavailableError)


class RayStageClient(StageClient):
    def __init__(self, stage: str, handle: DeploymentHandle, *,
                 output_dir: Path | None = None) -> None:
        super().__init__(stage, f"ray://{stage}")
        self.output_dir = output_dir
        self._handle = handle
        self._codec = MessageCodec()
        self._owners: dict[str, str] = {}  # api-minted session id or request id -> replica
        self._pumps: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        pass

    async def handshake(self, timeout_s: float) -> StageInfo:
        async with asyncio.timeout(timeout_s):
            _, data = await self._handle.info.remote()
        info = self._codec.decode(data)
        assert isinstance(info, StageInfo)  # our replica's answer
        self.info = info
        self._set_state(info.state)
        return info

    async def close(self) -> None:
        for task in list(self._pumps.values()):
            task.cancel()

    # ------------------------------------------------------------------ routing

    def _key(self, request: Request) -> str:
        if isinstance(request, CreateSession):
            return PLACE
        if isinstance(request, (SessionFrame, CloseSession)):
            return self._session_key(request.session_id)
        if isinstance(request, RealtimeOpen) and request.session_id not in self._owners:
            return PLACE
        if isinstance(request, (RealtimeOpen, RealtimeChunk, RealtimeRelease)):
            return self._session_key(request.session_id)
        if isinstance(request, Cancel):
            owner = self._owners.get(request.target_id)
            return pin(owner) if owner else ""
        return ""

    def _session_key(self, session_id: str) -> str:
        owner = owner_of(session_id) or self._owners.get(session_id)
        if owner is None:
            raise SessionLost(f"{SESSION_LOST} (session '{session_id}' has no known owner)")
        return pin(owner)

    def _remember(self, request: Request, replica: str, reply: Reply) -> None:
        if isinstance(request, RealtimeOpen):
            self._owners[request.session_id] = replica
        if isinstance(reply, (RealtimeReleased, SessionClosed)):
            self._owners.pop(reply.session_id, None)

    def _lost(self, request: Request, key: str, exc: BaseException) -> WorldserveError:
        if key.startswith("pin:") and not isinstance(request, Cancel):
            return SessionLost(SESSION_LOST)
        return ReplicaLost(f"the {self.stage} replica running this request is gone "
                           f"({type(exc).__name__})")

    def _decode(self, data: bytes) -> Reply:
        reply = self._codec.decode(data)
        assert isinstance(reply, Reply)  # our replica's answer
        return reply

    # ------------------------------------------------------------------ requests

    async def call(self, request: Request, *, timeout_s: float | None = None) -> Reply:
        self._check_up()
        key = self._key(request)
        response = self._handle.options(session_id=key).call.remote(
            self._codec.encode(request), timeout_s)
        try:
            async with asyncio.timeout(None if timeout_s is None else timeout_s + 5.0):
                replica, data = await response
        except TimeoutError:
            response.cancel()
            raise RequestTimeout(
                f"stage '{self.stage}' did not answer within {timeout_s:g} s") from None
        except REPLICA_ERRORS as exc:
            raise self._lost(request, key, exc) from None
        reply = self._decode(data)
        if isinstance(reply, ErrorReply):
            raise from_code(reply.code, reply.message)
        self._remember(request, replica, reply)
        return reply

    async def stream(self, request: Request, *, max_queued: int = 64) -> ReplyStream:
        self._check_up()
        key = self._key(request)
        stream = ReplyStream(self, request.request_id, max_queued)
        self._streams[request.request_id] = stream
        generator = self._handle.options(session_id=key, stream=True).stream.remote(
            self._codec.encode(request))
        self._pumps[request.request_id] = asyncio.get_running_loop().create_task(
            self._pump(request, key, stream, generator))
        return stream

    async def _pump(self, request: Request, key: str, stream: ReplyStream, generator: Any) -> None:
        try:
            async for replica, data in generator:
                self._owners.setdefault(request.request_id, replica)
                reply = self._decode(data)
                if isinstance(reply, GenerationResult):
                    await self._fetch_outputs(replica, reply.file_names)
                if reply.terminal:  # the stream ends here: finishing it must not cancel us
                    self._pumps.pop(request.request_id, None)
                stream.push(from_code(reply.code, reply.message)
                            if isinstance(reply, ErrorReply) else reply)
        except asyncio.CancelledError:
            generator.cancel()
            raise
        except REPLICA_ERRORS as exc:
            stream.push(self._lost(request, key, exc))
        except Exception as exc:  # a failure of the Ray path itself
            log.exception("stream %s failed", request.request_id)
            stream.push(StageUnavailable(f"stage '{self.stage}' failed: {exc}", stage=self.stage))
        finally:
            self._pumps.pop(request.request_id, None)
            self._owners.pop(request.request_id, None)

    async def _fetch_outputs(self, replica: str, names: list[str]) -> None:
        """Copy a finished job's files from a replica on another machine (the api serves them)."""
        if self.output_dir is None:
            return
        missing = [n for n in names if not (self.output_dir / Path(n).name).exists()]
        if not missing:
            return
        files = await self._handle.options(session_id=pin(replica)).read_outputs.remote(missing)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (self.output_dir / name).write_bytes(content)

    def send_nowait(self, request: Request) -> None:
        """Fire-and-forget (cancellations, releases); dropped when no owner is known."""
        try:
            key = self._key(request)
        except SessionLost:
            return
        if isinstance(request, Cancel) and not key:
            return  # the target already finished (or never reached a replica)
        self._handle.options(session_id=key).send.remote(self._codec.encode(request))

    def stream_finished(self, request_id: str) -> None:
        """The stream finished or was cancelled: stop pumping it (this also stops it there)."""
        super().stream_finished(request_id)
        pump = self._pumps.get(request_id)
        if pump is not None and pump is not asyncio.current_task():
            pump.cancel()
