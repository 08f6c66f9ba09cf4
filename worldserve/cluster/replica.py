"""`StageReplica`: one Serve replica wrapping one of today's stage engines (one device each).

The engine runs inside the replica through `InProcessStageClient` (the stage loop's own
dispatch, stepped on the replica's event loop), so an engine behaves exactly as in a stage
process. Calls carry msgpack-encoded messages, as on the ZeroMQ wire, and every answer names
the replica, so the api side learns who owns what. A session created here gets an id tagged with
this replica (ids.py); the replica reports its session count through `record_routing_stats`,
which the `OwnerRouter` uses to place new sessions.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, AsyncIterator

from ray import serve

from worldserve.cluster.ids import tag
from worldserve.config import ServerConfig
from worldserve.errors import WorldserveError
from worldserve.ipc.codec import MessageCodec
from worldserve.ipc.messages import CreateSession, ErrorReply, Message, Request
from worldserve.runtime.engine import Engine, create_engine
from worldserve.runtime.inprocess import InProcessStageClient
from worldserve.runtime.quiet import quiet_benign_messages

log = logging.getLogger("worldserve.cluster")

Answer = tuple[str, bytes]  # (replica id, encoded reply)


def build_engine(stage: str, config: ServerConfig, engine_target: str | None) -> Engine:
    """The configured engine, or `engine_target` ("module:Class", called like a factory entry)."""
    stage_config = getattr(config.stages, stage)
    if engine_target is None:
        return create_engine(stage, stage_config, config)
    module_name, name = engine_target.split(":")
    return getattr(importlib.import_module(module_name), name)(stage_config, config)


class StageReplica:
    def __init__(self, stage: str, config_json: str, engine_target: str | None = None) -> None:
        config = ServerConfig.model_validate_json(config_json)
        if config.log_level != "debug":
            quiet_benign_messages()
        self.stage = stage
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.engine = build_engine(stage, config, engine_target)
        self.client = InProcessStageClient(stage, self.engine)
        self.output_dir = (config.stages.generation.resolved_output_dir()
                           if stage == "generation" else None)
        self._codec = MessageCodec()
        log.info("stage %s replica %s ready", stage, self.replica)

    def _decode(self, data: bytes) -> Request:
        msg = self._codec.decode(data)
        if isinstance(msg, CreateSession):  # the session is minted here: its id names us
            msg.session_id = tag(msg.session_id, self.replica)
        assert isinstance(msg, Request)  # the api's own client sent it
        return msg

    def _answer(self, msg: Message) -> Answer:
        return self.replica, self._codec.encode(msg)

    @staticmethod
    def _error(request_id: str, exc: WorldserveError) -> ErrorReply:
        return ErrorReply(request_id=request_id, code=exc.code, message=exc.message)

    async def info(self) -> Answer:
        return self._answer(self.client.refresh_info("cluster"))

    async def call(self, data: bytes, timeout_s: float | None = None) -> Answer:
        request = self._decode(data)
        try:
            reply: Message = await self.client.call(request, timeout_s=timeout_s)
        except WorldserveError as exc:
            reply = self._error(request.request_id, exc)
        return self._answer(reply)

    async def stream(self, data: bytes) -> AsyncIterator[Answer]:
        request = self._decode(data)
        replies = await self.client.stream(request, max_queued=64)
        try:
            async for reply in replies:
                yield self._answer(reply)
        except WorldserveError as exc:
            yield self._answer(self._error(request.request_id, exc))
        finally:
            replies.cancel()  # the caller went away: stop the request (no-op once finished)

    async def send(self, data: bytes) -> None:
        self.client.start()
        self.client.send_nowait(self._decode(data))

    async def read_outputs(self, names: list[str]) -> dict[str, bytes]:
        """Output files of a finished job, for an api replica on another machine."""
        if self.output_dir is None:
            return {}
        return {name: (self.output_dir / Path(name).name).read_bytes() for name in names}

    def record_routing_stats(self) -> dict[str, Any]:
        stats = self.engine.stats()
        return {"sessions": int(stats.get("sessions") or 0),
                "queue_depth": int(stats.get("queue_depth") or 0)}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)  # None: the constructor failed
        if engine is None:
            return
        try:
            engine.shutdown()
        except Exception:  # best effort on the way out
            log.exception("engine shutdown failed")
