"""A colocated stage process on CPU: a 16-token reasoner reply while a video job denoises, over
the same reply alone (issue 22 item 6; docs/reasoner-engine.md "Serving with one copy").

Model: the Cosmos3 dev generator rebuilt deeper and wider (`--layers`, `--hidden`), with its
reasoner tied to the generator's understanding weights, loaded the way the colocated stage
process loads them (generation engine first, then the reasoner engine finds the published
transformer). Both stage loops run on one thread through `runtime/stage.py` `run_together`,
with in-process mailboxes as their sockets (the loops' own code; no ZeroMQ).

Arms, in one process, each run once to warm up, then `--repeats` times in turn (medians):
  alone   the reply with the generation stage idle;
  steps   `colocation_yield: steps`: a video job denoising, the stages alternate whole turns
          (the behaviour before this change);
  blocks  `colocation_yield: blocks` (default): the generation forward yields to the reasoner
          before each transformer block while it has work (`--max-yield-ms` per block).
A client thread sends the chat request at a random moment of the video's denoising (after its
first step); the reply time is from that send to the `ChatResult`. Every arm's reply is
asserted equal to the alone arm's (seeded sampling). Prints one JSON line with the medians and
the ratios `steps / alone` and `blocks / alone`.

    .venv/bin/python benchmarks/colocation.py [--layers 8 --hidden 64 --size 256x256 ...]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from worldserve import envs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.*
from benchmarks import harness  # noqa: E402


class Mailbox:
    """A stage loop's socket: an inbox other threads append to, replies to a callback."""

    def __init__(self) -> None:
        self.inbox: deque[Any] = deque()
        self.on_reply: Any = None

    def receive(self, timeout_ms: float) -> list[tuple[bytes, Any]]:
        items = []
        while self.inbox:
            items.append((b"bench", self.inbox.popleft()))
        if not items and timeout_ms > 0:
            time.sleep(min(timeout_ms, 5.0) / 1000)
        return items

    def send(self, peer: bytes, msg: Any) -> None:
        if self.on_reply is not None:
            self.on_reply(msg)

    def close(self) -> None:
        pass


def model_dir(layers: int, hidden: int) -> Path:
    """The deeper dev Cosmos3 generator plus its tied reasoner (built once into the cache)."""
    from dataclasses import replace

    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

    target = envs.cache_dir() / "bench" / f"colocation-l{layers}-h{hidden}"
    if (target / "model.safetensors").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    heads = max(2, hidden // 16)  # the dev head_dim (16) and its rope split stay
    cfg = replace(Cosmos3DevConfig(), num_hidden_layers=layers, hidden_size=hidden,
                  intermediate_size=2 * hidden, num_attention_heads=heads,
                  num_key_value_heads=max(1, heads // 2))
    build_cosmos3(target, 0, cfg)
    write_reasoner_files(target, 0)
    return target


def load_loops(model: Path, out: Path) -> tuple[Any, Any]:
    from worldserve.config import GenerationStageConfig, ReasonerStageConfig, ServerConfig
    from worldserve.engines.generation.engine import GenerationEngine
    from worldserve.engines.reasoner.engine import ReasonerEngine
    from worldserve.levers import shared
    from worldserve.runtime.stage import StageLoop

    generation = GenerationEngine(GenerationStageConfig(
        model_path=model, output_dir=out, batch_wait_ms=0, warmup_resolutions=["48x32"]),
        ServerConfig())
    while generation.has_work():  # the warm-up
        generation.step()
    reasoner = ReasonerEngine(ReasonerStageConfig(model_path=model), ServerConfig())
    shared.withdraw(model, shared.GENERATOR_TRANSFORMER)
    assert (reasoner.runner.model.get_input_embeddings().weight
            is generation.pipe.transformer.embed_tokens.weight), "the reasoner is not tied"
    return (StageLoop("generation", Mailbox(), generation),
            StageLoop("reasoner", Mailbox(), reasoner))


def chat(request_id: str) -> Any:
    from worldserve.ipc.capabilities import ReasonerSampling
    from worldserve.ipc.messages import ChatCompletion, ChatMessage, ChatPart

    return ChatCompletion(
        request_id=request_id,
        sampling=ReasonerSampling(max_tokens=16, temperature=0.8, seed=3),
        messages=[ChatMessage(role="user", parts=[ChatPart(type="text", text="Say hello.")])])


def video(request_id: str, width: int, height: int, frames: int) -> Any:
    from worldserve.ipc.messages import GenerateMedia, GenerationParams

    params = GenerationParams(prompt="a red car turns left", width=width, height=height,
                              num_frames=frames, num_inference_steps=200, guidance_scale=4.0,
                              seeds=[5], fps=24.0)
    return GenerateMedia(request_id=request_id, params=params, output_stem=request_id,
                         output_format="mp4", fps=24)


def run_arm(host: Any, guest: Any, arm: str, n: int, args: argparse.Namespace) -> dict:
    """One reply, sent at a random moment (alone: with the generation idle)."""
    from worldserve.ipc.messages import ChatResult
    from worldserve.runtime.stage import run_together

    gen = host.engine
    rid, vid = f"chat-{arm}-{n}", f"video-{arm}-{n}"
    sent: dict[str, float] = {}
    result: dict[str, Any] = {}
    steps_at: dict[str, int] = {}

    def on_guest_reply(msg: Any) -> None:
        if isinstance(msg, ChatResult) and msg.request_id == rid:
            result["t"] = time.perf_counter() - sent["t"]
            result["reply"] = (msg.text, msg.completion_tokens)
            steps_at["end"] = gen.denoise_steps
            host.running = guest.running = False

    def client() -> None:
        if arm != "alone":
            while gen.denoise_steps - steps_at["start"] < 1:  # the video is denoising
                time.sleep(0.001)
            time.sleep(random.Random(n).uniform(0, args.step_s))
        steps_at["sent"] = gen.denoise_steps
        sent["t"] = time.perf_counter()
        guest.server.inbox.append(chat(rid))

    guest.server.on_reply = on_guest_reply
    if arm != "alone":
        host.server.inbox.append(video(vid, args.width, args.height, args.frames))
    steps_at["start"] = gen.denoise_steps
    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    run_together([host, guest], "steps" if arm == "alone" else arm, args.max_yield_ms)
    thread.join()
    host.running = guest.running = True
    if arm != "alone":  # cancel the rest of the video
        gen.cancel(vid)
        while gen.has_work():
            gen.step()
    return {"reply_s": result["t"], "reply": result["reply"],
            "steps_during": steps_at["end"] - steps_at["sent"]}


def step_seconds(host: Any, args: argparse.Namespace) -> float:
    """Seconds per denoising step of the video job alone (3 steps after the first)."""
    gen = host.engine
    host.engine.submit(video("probe", args.width, args.height, args.frames), lambda _: None)
    gen.step()  # prepare
    gen.step()  # the first step
    started = time.perf_counter()
    for _ in range(3):
        gen.step()
    seconds = (time.perf_counter() - started) / 3
    gen.cancel("probe")
    while gen.has_work():
        gen.step()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--size", default="256x256", help="video WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-yield-ms", type=float, default=250.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    args.width, args.height = (int(v) for v in args.size.lower().split("x"))
    if args.threads:
        torch.set_num_threads(args.threads)
    import tempfile

    model = model_dir(args.layers, args.hidden)
    with tempfile.TemporaryDirectory() as out:
        host, guest = load_loops(model, Path(out))
        args.step_s = step_seconds(host, args)
        runs: dict[str, list[dict]] = {"alone": [], "steps": [], "blocks": []}
        for arm in runs:  # warm every arm once (first forwards at these shapes)
            run_arm(host, guest, arm, -1, args)
        for n in range(args.repeats):
            for arm in runs:
                runs[arm].append(run_arm(host, guest, arm, n, args))
    replies = {r["reply"] for arm in runs.values() for r in arm}
    assert len(replies) == 1, f"replies differ across arms: {replies}"
    med = {arm: statistics.median(r["reply_s"] for r in rs) for arm, rs in runs.items()}
    from worldserve.levers.yielding import repeated_blocks

    blocks = len(repeated_blocks(host.engine.pipe.transformer))
    harness.emit({
        "benchmark": "colocation", "reply_tokens": next(iter(replies))[1],
        "model": {"layers": args.layers, "hidden": args.hidden, "blocks_hooked": blocks},
        "video": {"size": args.size, "frames": args.frames, "step_s": round(args.step_s, 4)},
        "max_yield_ms": args.max_yield_ms, "torch_threads": torch.get_num_threads(),
        "reply_s": {arm: round(v, 4) for arm, v in med.items()},
        "steps_during_reply": {arm: [r["steps_during"] for r in rs] for arm, rs in runs.items()},
        "ratio_steps": round(med["steps"] / med["alone"], 2),
        "ratio_blocks": round(med["blocks"] / med["alone"], 2),
    })


if __name__ == "__main__":
    main()
