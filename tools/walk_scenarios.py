"""The four traced requests of `docs/request-walks.md`, each run in-process on a dev checkpoint.

Every scenario builds the real app around an `InProcessStageClient` of the real engine
(`create_engine`, as a stage process would), runs one untraced warm request, then traces:

- (a) `POST /v1/videos` on the Cosmos3 dev generator -> the job to completion ->
  `GET /v1/videos/{id}/content` (the client's status polls are not part of the walk);
- (b) one binary frame on `WS /v1/streaming/ws` (the second frame of a session: steady state)
  on the Cosmos3 dev reasoner;
- (c) an `action` event on `WS /v1/realtime_video/generate` and the chunk it lands on, on the
  dev causal model;
- (d) the same route given a video file (multipart `input_reference`, an MP4): the request's
  own pass up to the queued job (reading the body, the media policy, the upload; the job then
  runs as in (a), untraced).
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
from PIL import Image
from starlette.testclient import TestClient

from tools.walk_trace import Tracer
from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.runtime.engine import create_engine
from worldserve.runtime.inprocess import InProcessStageClient

VIDEO = {"prompt": "a robot arm", "size": "48x32", "num_frames": 9, "num_inference_steps": 1}
UPLOAD_FIELDS = {name: str(value) for name, value in VIDEO.items()}
SESSION = {"op": "create", "system_prompt": "Describe the frame.", "question": "What is here?",
           "sampling": {"max_tokens": 4}}
# Unpaced (chunks go out as soon as they are encoded), and more chunks than the walk reads: no
# wall-clock waits and no session end inside the trace.
REALTIME_INIT = {"type": "init", "prompt": "a castle", "size": "64x64", "max_chunks": 16,
                 "seed": 1, "realtime_output_pacing": False}
ACTION_EVENT = {"type": "event", "kind": "action", "payload": "w-8,d-4"}
POLL_S = 0.01


def _app(stage: str, settings: dict[str, Any]) -> tuple[Any, InProcessStageClient]:
    stages: dict[str, Any] = {"generation": {"enabled": False}, "reasoner": {"enabled": False},
                              stage: {"enabled": True, **settings}}
    config = ServerConfig.model_validate({"stages": stages})
    engine = create_engine(stage, getattr(config.stages, stage), config)
    client = InProcessStageClient(stage, engine)
    return create_app(ServerRuntime(config=config, clients={stage: client})), client


def png_bytes(seed: int, size: int = 64) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


# ---------------------------------------------------------------------- (a) a video job


async def _finished(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    while True:
        job = (await http.get(f"/v1/videos/{job_id}")).json()
        if job["status"] not in ("queued", "in_progress"):
            return job
        await asyncio.sleep(POLL_S)


async def _video_job(tracer: Tracer, model_dir: Path, output_dir: Path) -> None:
    app, client = _app("generation", {"model_path": str(model_dir),
                                      "output_dir": str(output_dir)})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://walk") as http:
        warm = (await http.post("/v1/videos", json=VIDEO)).json()
        await _finished(http, warm["id"])
        tracer.trace("submission")
        job = (await http.post("/v1/videos", json=VIDEO)).json()
        tracer.trace("waiting")  # the client's polls: not part of the walk
        job = await _finished(http, job["id"])
        tracer.trace("retrieval")
        content = await http.get(f"/v1/videos/{job['id']}/content")
        tracer.stop()
    await client.close()
    if job["status"] != "completed" or content.status_code != 200:
        raise RuntimeError(f"the traced video job did not complete: {job}")


def video_job(tracer: Tracer, models: Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        asyncio.run(_video_job(tracer, models / "generation", Path(out)))


# ---------------------------------------------------------------------- (d) a video upload


def mp4_bytes(num_frames: int = 5, width: int = 48, height: int = 32) -> bytes:
    from worldserve.media.video import encode_mp4

    frames = np.random.default_rng(0).integers(0, 255, (num_frames, height, width, 3), np.uint8)
    buf = io.BytesIO()
    encode_mp4(frames, 8, buf)
    return buf.getvalue()


async def _video_upload(tracer: Tracer, model_dir: Path, output_dir: Path) -> None:
    app, client = _app("generation", {"model_path": str(model_dir),
                                      "output_dir": str(output_dir)})
    clip = ("clip.mp4", mp4_bytes(), "video/mp4")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://walk") as http:
        warm = await http.post("/v1/videos", data=UPLOAD_FIELDS, files={"input_reference": clip})
        await _finished(http, warm.json()["id"])
        tracer.trace("submission")
        job = await http.post("/v1/videos", data=UPLOAD_FIELDS, files={"input_reference": clip})
        tracer.stop()
        done = await _finished(http, job.json()["id"])
    await client.close()
    # The stage may already have started the job inside the traced call: that part is (a)'s.
    tracer.hops[:] = [hop for hop in tracer.hops if hop.lane == "submission"]
    if done["status"] != "completed":
        raise RuntimeError(f"the traced upload job did not complete: {done}")


def video_upload(tracer: Tracer, models: Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        asyncio.run(_video_upload(tracer, models / "generation", Path(out)))


# ---------------------------------------------------------------------- (b) a streaming frame


def streaming_frame(tracer: Tracer, models: Path) -> None:
    app, client = _app("reasoner", {"model_path": str(models / "generation")})
    with TestClient(app) as http, http.websocket_connect("/v1/streaming/ws") as ws:
        ws.send_json(SESSION)
        _expect(ws.receive_json(), "created")
        ws.send_bytes(png_bytes(0))
        _expect(ws.receive_json(), "frame")
        tracer.trace("frame")
        ws.send_bytes(png_bytes(1))
        reply = ws.receive_json()
        tracer.stop()
        _expect(reply, "frame")
        ws.send_json({"op": "delete"})
        ws.receive_json()
    asyncio.run(client.close())


def _expect(reply: dict[str, Any], op: str) -> None:
    if reply.get("op") != op:
        raise RuntimeError(f"expected {op!r}, got {reply}")


# ---------------------------------------------------------------------- (c) a realtime chunk


def _read_chunk(ws: Any) -> None:
    """Messages up to the chunk's `chunk_stats`."""
    while True:
        header = msgpack.unpackb(ws.receive_bytes())
        if header["type"] == "chunk_stats":
            return
        if header["type"] not in ("frame_batch", "frame_batch_header"):
            raise RuntimeError(f"unexpected realtime message {header}")
        if not header.get("payload"):
            ws.receive_bytes()


def realtime_chunk(tracer: Tracer, models: Path) -> None:
    app, client = _app("realtime", {"model_path": str(models / "realtime")})
    with TestClient(app) as http, http.websocket_connect("/v1/realtime_video/generate") as ws:
        ws.send_bytes(msgpack.packb(REALTIME_INIT))
        _read_chunk(ws)
        tracer.trace("event and chunk")
        ws.send_bytes(msgpack.packb(ACTION_EVENT))
        _read_chunk(ws)
        _read_chunk(ws)  # chunk 1 was requested before the event: it lands on chunk 2
        tracer.stop()
    asyncio.run(client.close())


# Phases in the order a reader follows the request (default: the order they first ran): the
# action from the socket to the controls, the chunk request, the stage and runner, the frames.
PHASE_ORDER = {
    "c": ("RealtimeConnection._listen", "RealtimeConnection._generate_loop",
          "InProcessStageClient._run", "ChunkSender.send"),
}

WALKS = {
    "a": ("`POST /v1/videos` -> the job to completion -> `GET /v1/videos/{id}/content`",
          video_job),
    "b": ("one binary frame on `WS /v1/streaming/ws` (frame 2 of a session)", streaming_frame),
    "c": ("an `action` event on `WS /v1/realtime_video/generate` -> the chunk it lands on",
          realtime_chunk),
    "d": ("`POST /v1/videos` with a video upload (multipart `input_reference`) -> the job queued",
          video_upload),
}
