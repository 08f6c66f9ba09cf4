"""A tiny streaming-reasoner stand-in for client behaviours a real worldserve never shows.

It logs every request (to prove the client refused flags without contacting it), can refuse raw
REST frame bodies with 415 like the standalone NIM, and can inject non-fatal or fatal WebSocket
errors at chosen frames. Runs uvicorn in a thread on a free loopback port.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

from tests.support.server import free_port

MODEL = "mini-reasoner"


@dataclass
class MiniBehaviour:
    refuse_raw_frames: bool = True
    streaming_status: int = 200            # 404/501: streaming unavailable
    model_type: str = "reasoner"
    ws_nonfatal_errors_at: set[int] = field(default_factory=set)  # 0-based frames received
    ws_fatal_error_at: int | None = None
    delete_status: int = 200               # REST DELETE; anything else fails the cleanup


@dataclass
class MiniState:
    requests: list[str] = field(default_factory=list)
    sessions: dict[str, int] = field(default_factory=dict)   # live session id -> frames answered
    deleted: list[str] = field(default_factory=list)


def _reply(index: int) -> dict:
    return {"frame_index": index, "text": f"reply {index}", "finish_reason": "stop",
            "token_count": 3, "ttft_s": 0.01, "latency_s": 0.02}


def create_app(behaviour: MiniBehaviour, state: MiniState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def log_requests(request: Request, call_next):
        state.requests.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    @app.get("/v1/health/ready")
    @app.get("/health")
    async def ready() -> dict:
        return {"message": "Service is ready."}

    @app.get("/v1/metadata")
    async def metadata() -> dict:
        return {"model_type": behaviour.model_type, "inference_endpoint": "/v1/chat/completions",
                "selectedModelProfileId": "mini:profile"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.get("/v1/streaming/config")
    async def config() -> JSONResponse:
        return JSONResponse({"model": MODEL}, status_code=behaviour.streaming_status)

    @app.post("/v1/streaming/sessions", status_code=201)
    async def create() -> dict:
        session_id = f"sess-{uuid.uuid4()}"
        state.sessions[session_id] = 0
        return {"session_id": session_id, "model": MODEL}

    @app.post("/v1/streaming/sessions/{session_id}/frame")
    async def frame(session_id: str, request: Request) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if behaviour.refuse_raw_frames and not kind.startswith("application/json"):
            return JSONResponse({"error": {"message": f"unsupported media type '{kind}'",
                                           "code": 415}}, status_code=415)
        state.sessions[session_id] += 1
        return JSONResponse(_reply(state.sessions[session_id] - 1))

    @app.delete("/v1/streaming/sessions/{session_id}")
    async def delete(session_id: str) -> JSONResponse:
        if behaviour.delete_status != 200:
            return JSONResponse({"error": {"message": "cleanup broke", "code": 500}},
                                status_code=behaviour.delete_status)
        state.deleted.append(session_id)
        return JSONResponse({"session_id": session_id, "frames": state.sessions.pop(session_id),
                             "closed": True})

    @app.websocket("/v1/streaming/ws")
    async def ws(websocket: WebSocket) -> None:
        state.requests.append("WS /v1/streaming/ws")
        await websocket.accept()
        await websocket.receive_json()
        session_id = f"sess-{uuid.uuid4()}"
        state.sessions[session_id] = 0
        await websocket.send_json({"op": "created", "session_id": session_id, "model": MODEL})
        received = 0
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                state.sessions.pop(session_id, None)
                return
            if message.get("text") and '"delete"' in message["text"]:
                state.deleted.append(session_id)
                await websocket.send_json({"op": "closed", "session_id": session_id,
                                           "frames": state.sessions.pop(session_id),
                                           "closed": True})
                await websocket.close(1000)
                return
            received += 1
            if received - 1 == behaviour.ws_fatal_error_at:
                state.sessions.pop(session_id)
                await websocket.send_json({"op": "error", "message": "engine failed",
                                           "code": 500, "fatal": True})
                await websocket.close(1011)
                return
            if received - 1 in behaviour.ws_nonfatal_errors_at:
                await websocket.send_json({"op": "error", "message": "frame too large",
                                           "code": 413, "fatal": False})
                continue
            state.sessions[session_id] += 1
            await websocket.send_json({"op": "frame", **_reply(state.sessions[session_id] - 1)})

    return app


class MiniServer:
    """`with MiniServer(behaviour) as server: server.base_url, server.state`."""

    def __init__(self, behaviour: MiniBehaviour | None = None) -> None:
        self.behaviour = behaviour or MiniBehaviour()
        self.state = MiniState()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(self.behaviour, self.state), host="127.0.0.1",
                                port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> "MiniServer":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("mini server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
