"""How long each surface takes on the default dev model (what `make serve` serves): one image,
one video job (the model's defaults: on the dev world, 9 frames at 64x64 in 12 steps), one
policy action, one chat reply of at most 16 tokens and one of exactly 16 (`ignore_eos`: what a
decode takes), one live-reasoning frame and one realtime chunk, each timed from the client,
`--repeats` times.

    .venv/bin/python benchmarks/surfaces.py                 # starts its own default server
    .venv/bin/python benchmarks/surfaces.py --url http://127.0.0.1:8000   # a running one

Prints one JSON line: `<surface>_s` (median wall seconds), `<surface>_all_s`,
`chat_completion_tokens` and `chat_16_tokens_completion_tokens` (how long the timed replies
were), `machine` and, for a server it
started, `torch_threads_per_stage` (`--threads N`; default torch's own, as `make
serve`: on a busy 2-core machine one thread per stage is faster). The README quotes it.
"""

from __future__ import annotations

import argparse
import base64
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgpack
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

FRAME = (harness.REPO_ROOT / "examples" / "frame.jpg").read_bytes()
FRAME_URL = "data:image/jpeg;base64," + base64.b64encode(FRAME).decode()


def image(http: httpx.Client) -> None:
    http.post("/v1/images/generations", json={"prompt": "a red car"}).raise_for_status()


def video(http: httpx.Client) -> None:
    job = http.post("/v1/videos", json={"prompt": "a red car"}).json()
    while job["status"] in ("queued", "in_progress"):
        time.sleep(0.1)
        job = http.get(f"/v1/videos/{job['id']}").json()
    if job["status"] != "completed":
        raise RuntimeError(f"video job ended {job['status']}: {job}")


def action(http: httpx.Client) -> None:
    http.post("/v1/actions/generations", json={
        "input": {"task": "pick up the cup", "image": FRAME_URL},
        "parameters": {"action_mode": "policy", "domain_name": "droid_lerobot",
                       "action_horizon": 16}}).raise_for_status()


def reasoner_name(http: httpx.Client) -> str:
    models = http.get("/v1/models").json()["data"]
    return next(model["id"] for model in models if "reasoner" in model["stages"])


def chat(http: httpx.Client, ignore_eos: bool = False) -> int:
    """One reply of at most 16 tokens (with `ignore_eos`: exactly 16); returns how many it
    had."""
    reply = http.post("/v1/chat/completions", json={
        "model": reasoner_name(http), "max_tokens": 16, "ignore_eos": ignore_eos,
        "messages": [{"role": "user", "content": "Hello"}]})
    return reply.raise_for_status().json()["usage"]["completion_tokens"]


def reasoning_frame(http: httpx.Client) -> float:
    """Seconds for one frame of a live session (the session's creation not counted)."""
    created = http.post("/v1/streaming/sessions", json={
        "system_prompt": "Describe each frame in one short sentence.",
        "question": "What is happening?", "sampling": {"max_tokens": 16}})
    sid = created.raise_for_status().json()["session_id"]
    try:
        reply, seconds = harness.timed(http.post, f"/v1/streaming/sessions/{sid}/frame",
                                       content=FRAME, headers={"content-type": "image/jpeg"})
        reply.raise_for_status()
    finally:
        http.delete(f"/v1/streaming/sessions/{sid}")
    return seconds


def realtime_chunk(ws_url: str) -> float:
    """Seconds from init to the first chunk's frames of a realtime session."""
    with connect(ws_url + "/v1/realtime_video/generate", max_size=None) as ws:
        started = time.perf_counter()
        ws.send(msgpack.packb({"type": "init", "prompt": "a castle", "max_chunks": 1}))
        for message in ws:
            if isinstance(message, bytes) and msgpack.unpackb(message).get("type") in (
                    "frame_batch_header", "frame_batch"):
                return time.perf_counter() - started
    raise RuntimeError("the realtime session closed before its first chunk")


def measure(base_url: str, repeats: int) -> dict:
    ws_url = base_url.replace("http", "ws", 1)
    result: dict = {"chat_completion_tokens": [], "chat_16_tokens_completion_tokens": []}

    def timed_chat(ignore_eos: bool) -> float:
        tokens, seconds = harness.timed(chat, http, ignore_eos)
        key = "chat_16_tokens" if ignore_eos else "chat"
        result[f"{key}_completion_tokens"].append(tokens)
        return seconds

    with httpx.Client(base_url=base_url, timeout=600) as http:
        runs = {"image": lambda: harness.timed(image, http)[1],
                "video": lambda: harness.timed(video, http)[1],
                "action": lambda: harness.timed(action, http)[1],
                "chat": lambda: timed_chat(False),
                "chat_16_tokens": lambda: timed_chat(True),
                "reasoning_frame": lambda: reasoning_frame(http),
                "realtime_chunk": lambda: realtime_chunk(ws_url)}
        for name, run in runs.items():
            seconds = [run() for _ in range(repeats)]
            result[f"{name}_s"] = round(harness.median(seconds), 2)
            result[f"{name}_all_s"] = [round(s, 2) for s in seconds]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start `make serve`'s own)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per stage of the started server (default: torch's "
                             "own, as `make serve`)")
    args = parser.parse_args()
    if args.url:
        harness.emit(measure(args.url.rstrip("/"), args.repeats))
        return
    # An empty WORLDSERVE_TORCH_THREADS is torch's default, what `make serve` runs with.
    threads = {"threads": args.threads} if args.threads else {
        "env": {"WORLDSERVE_TORCH_THREADS": ""}}
    with tempfile.TemporaryDirectory() as tmp, harness.server(
            Path(tmp), {"stages": harness.default_stages()}, **threads) as server:
        result = measure(server.base_url, args.repeats)
    harness.emit({"torch_threads_per_stage": args.threads or "default", **result})


if __name__ == "__main__":
    main()
