"""Asking a live server about the dev world and reading its answers back with the world's
evaluator (the semantic tests and benchmarks/quality.py share these)."""

from __future__ import annotations

import base64
import io
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from PIL import Image
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect

from worldserve.media.framing import FrameDecoder, pack, unpack
from worldserve.media.video import decode_audio, decode_frames, encode_mp4
from worldserve.models.dev.world import evaluate
from worldserve.models.dev.world.grammar import describe
from worldserve.models.dev.world.render import png_bytes
from worldserve.models.dev.world.scenes import WorldClip, WorldConfig

WORLD = WorldConfig()
SIZE = f"{WORLD.width_px}x{WORLD.height_px}"
STREAM_SYSTEM_PROMPT = "Answer in one word."  # what the reasoner was trained with
# Action runs as tools/world_training/action_stage.py trains and evaluates them: the smallest
# action canvas (a 64x64 frame is padded, never scaled), the world's sampling (the actions
# route's own defaults are 1.0 guidance at 5 fps; /v1/videos already takes the world's).
ACTION_TIER = 256
ACTION_GUIDANCE = 3.0
ACTION_STEPS = 12
REALTIME_ENDPOINT = "/v1/realtime_video/generate"


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    reply = client.post(path, json=body)
    if not reply.is_success:
        raise RuntimeError(f"POST {path}: {reply.status_code} {reply.text[:500]}")
    return reply


def draw(client: httpx.Client, prompt: str, seed: int, **fields: Any) -> evaluate.FrameReading:
    """POST /v1/images/generations at the world's size; the evaluator's reading of the image."""
    reply = post(client, "/v1/images/generations", {
        "prompt": prompt, "size": SIZE, "seed": seed, "response_format": "b64_json", **fields})
    data = base64.b64decode(reply.json()["data"][0]["b64_json"])
    return evaluate.read_frame(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def film(client: httpx.Client, prompt: str, seed: int, sound: bool = True,
         **fields: Any) -> tuple[evaluate.ClipReading, str | None]:
    """POST /v1/videos/sync (9 frames at 24 fps): the clip's reading and its sound's tone."""
    reply = post(client, "/v1/videos/sync", {
        "prompt": prompt, "size": SIZE, "seed": seed, "num_frames": WORLD.num_frames,
        "fps": int(WORLD.fps), "generate_sound": sound, **fields})
    reading = evaluate.read_clip(np.stack(decode_frames(reply.content)))
    audio = decode_audio(reply.content) if sound else None
    tone = (evaluate.dominant_tone(*audio)[0]
            if audio is not None and audio[0].shape[-1] > 0 else None)
    return reading, tone


def reasoner_model(client: httpx.Client) -> str:
    models = client.get("/v1/models").json()["data"]
    return next(m["id"] for m in models if "reasoner" in m["stages"])


def ask(client: httpx.Client, model: str, clip: WorldClip, question: str) -> str:
    """POST /v1/chat/completions: the clip as an mp4 `video_url` (every frame: the clip's fps)
    and one question; the reply's text."""
    mp4 = io.BytesIO()
    encode_mp4(clip.frames, int(clip.fps), mp4, compression=100)
    url = "data:video/mp4;base64," + base64.b64encode(mp4.getvalue()).decode()
    content = [{"type": "video_url", "video_url": {"url": url}},
               {"type": "text", "text": question}]
    reply = post(client, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": content}],
        "max_tokens": 16, "temperature": 0.0, "media_io_kwargs": {"video": {"fps": clip.fps}}})
    return reply.json()["choices"][0]["message"]["content"] or ""


def watch(client: httpx.Client, frames: list[np.ndarray], question: str) -> list[str]:
    """A live REST session (POST /v1/streaming/sessions), one PNG frame at a time: each
    frame's reply text, in order; the session is deleted after."""
    created = post(client, "/v1/streaming/sessions", {
        "system_prompt": STREAM_SYSTEM_PROMPT, "question": question,
        # No repetition penalty: the same colour is the right reply frame after frame.
        "sampling": {"max_tokens": 8, "temperature": 0.0, "repetition_penalty": 1.0}})
    session = created.json()["session_id"]
    try:
        replies = []
        for frame in frames:
            reply = client.post(f"/v1/streaming/sessions/{session}/frame",
                                content=png_bytes(frame), headers={"content-type": "image/png"})
            reply.raise_for_status()
            replies.append(reply.json()["text"])
        return replies
    finally:
        client.delete(f"/v1/streaming/sessions/{session}")


def roll(client: httpx.Client, clip: WorldClip, seed: int) -> np.ndarray:
    """Forward dynamics, POST /v1/videos/sync: the clip's first frame and its keys as Cosmos3
    camera_pose deltas (the realtime world's `pose_deltas`); the generated frames."""
    from worldserve.models.cosmos3.world import DOMAIN, pose_deltas

    steps = len(clip.frames) - 1
    reply = post(client, "/v1/videos/sync", {
        "prompt": describe(clip.scene, "agent"), "seed": seed, "fps": int(clip.fps),
        "action_mode": "forward_dynamics", "domain_name": DOMAIN,
        "action": pose_deltas(clip.keys_per_step, steps).tolist(),
        "input_reference": _png_data_url(clip.frames[0]), "resolution_tier": ACTION_TIER})
    return np.stack(decode_frames(reply.content))


def invert(client: httpx.Client, clip: WorldClip, seed: int) -> np.ndarray:
    """Inverse dynamics, POST /v1/actions/generations with the clip as an MP4: the predicted
    camera_pose deltas, (steps, 9)."""
    from worldserve.models.cosmos3.world import DOMAIN

    mp4 = io.BytesIO()
    encode_mp4(clip.frames, int(clip.fps), mp4)
    reply = post(client, "/v1/actions/generations", {
        "input": {"task": describe(clip.scene, "agent"),
                  "video": "data:video/mp4;base64," + base64.b64encode(mp4.getvalue()).decode()},
        "parameters": {"action_mode": "inverse_dynamics", "domain_name": DOMAIN,
                       "action_horizon": len(clip.frames) - 1, "resolution_tier": ACTION_TIER,
                       "seed": seed, "fps": clip.fps, "guidance_scale": ACTION_GUIDANCE,
                       "num_inference_steps": ACTION_STEPS}})
    return np.asarray(reply.json()["data"][0]["action"]["values"], dtype=np.float32)


@dataclass(frozen=True)
class RealtimeRun:
    """What one realtime session sent: each chunk's frames, (N, H, W, 3) uint8, and when its
    chunk_stats arrived (seconds after the valid init was sent)."""

    chunks: list[np.ndarray]
    arrived_s: list[float]
    from_first_frame: bool  # the session started from the init's first_frame


def explore(base_url: str, init: dict[str, Any], *, drop_refused_first_frame: bool = False,
            timeout_s: float = 600.0) -> RealtimeRun:
    """One session of WS /v1/realtime_video/generate (raw frames) until the server closes it
    (give the init `max_chunks`). With `drop_refused_first_frame`, an init refused for its
    `first_frame` (a text-to-video model) is sent again without it on the same socket."""
    url = "ws" + base_url.removeprefix("http").rstrip("/") + REALTIME_ENDPOINT
    chunks, arrived_s, batches = [], [], []
    decoder = FrameDecoder()
    with connect(url, max_size=None, close_timeout=2) as ws:
        ws.send(pack(init))
        sent_at = time.monotonic()
        while True:
            try:
                header = unpack(ws.recv(timeout_s))
            except ConnectionClosedOK:  # 1000: max_chunks reached
                return RealtimeRun(chunks, arrived_s, "first_frame" in init)
            kind = header.get("type")
            if kind == "error":
                if (drop_refused_first_frame and "first_frame" in init
                        and header.get("code") == "invalid_init"
                        and str(header.get("detail", "")).startswith("first_frame")):
                    init = {k: v for k, v in init.items() if k != "first_frame"}
                    ws.send(pack(init))
                    sent_at = time.monotonic()
                    continue
                raise RuntimeError(f"realtime session: {header}")
            if kind == "chunk_stats":
                chunks.append(np.concatenate(batches))
                arrived_s.append(time.monotonic() - sent_at)
                batches = []
            elif kind in ("frame_batch", "frame_batch_header"):
                payload = header.pop("payload") if kind == "frame_batch" else ws.recv(timeout_s)
                batches.append(decoder.decode(header, payload))


def _png_data_url(frame: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(frame)).decode()
