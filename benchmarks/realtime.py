"""Realtime engine benchmark: chunk latency with a sink + sliding window vs an unbounded cache,
frames/s with 1 and 2 concurrent sessions, and payload encoding figures.

    python benchmarks/realtime.py [--chunks 200] [--size 64x64] [--threads 1] [--model-path DIR]
    python benchmarks/realtime.py --model sana_wm [--chunks 200] [--no-refiner] [--steps 2]
    python benchmarks/realtime.py --model cosmos3 [--chunks 80] [--steps 2]
    python benchmarks/realtime.py --model lingbot [--chunks 200] [--steps 2] [--size 64x64]
    python benchmarks/realtime.py --protocols [--backend causal|fake] [--sessions 3]
        [--protocol-chunks 12]   # cadence of both WebSocket protocols (realtime_protocols.py)

The engine runs in-process (no sockets). Flatness = p95 of the last 20 chunks / p95 of the first
20 (1.0 = flat). Prints progress to stderr and one JSON line to stdout.

`--model sana_wm` runs the tiny SANA-WM family (random weights, in memory, with its refiner
unless --no-refiner): per-chunk latency of one session, flatness = p95 of the last 50 chunks /
p95 of chunks 10-60, and aggregate chunks/s of 2 sessions vs 1 through the engine.
`--model cosmos3` measures the same for Cosmos3 world sessions (the tiny random Cosmos3
generator with action heads, camera_pose forward dynamics, 8 new frames per chunk).
`--model lingbot` measures the same for a LingBot-World-style causal checkpoint (the tiny
upstream-layout pickle of `causal_dit.dev.build_lingbot_realtime`, written to a temporary
directory and loaded like a real one: camera branch over Plücker rays, 36-channel image
condition, sink + window cache at the checkpoint's defaults).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worldserve.config import RealtimeStageConfig, ServerConfig
from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.ipc.messages import RealtimeChunk, RealtimeOpen
from worldserve.models.causal_dit.loader import RealtimeModel, load_realtime_model
from worldserve.models.causal_dit.runner import CausalRunner
from worldserve.models.types import WorldSessionSettings as SessionSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.*
from benchmarks import harness  # noqa: E402
from benchmarks.harness import p95  # noqa: E402


def _open(engine: Any, session_id: str, **settings: Any) -> None:
    """The session-open message (its settings, once); chunk 0 follows."""
    engine.submit(RealtimeOpen(request_id=f"{session_id}-open", session_id=session_id,
                               **settings), lambda _reply: None)


def latency_run(model: RealtimeModel, num_chunks: int, width: int, height: int,
                sink: int, window: int) -> dict[str, Any]:
    """Per-chunk times of one session over `num_chunks` chunks."""
    runner = CausalRunner(model)
    settings = SessionSettings(seed=0, width=width, height=height,
                               num_inference_steps=model.config.default_num_inference_steps,
                               sink_frames=sink, window_frames=window,
                               frames_per_block=model.config.frames_per_block)
    session = runner.new_session("bench", settings, "a red car drives down a street")
    total, dit = [], []
    for k in range(num_chunks):
        out = runner.run_chunk(session, [["w"]] * 12 if k % 4 else None)
        total.append(out.forward_ms)
        dit.append(out.dit_ms)
    session.release()
    return {
        "flatness": p95(total[-20:]) / p95(total[:20]),
        "dit_flatness": p95(dit[-20:]) / p95(dit[:20]),
        "p95_first20_ms": p95(total[:20]), "p95_last20_ms": p95(total[-20:]),
        "dit_p95_first20_ms": p95(dit[:20]), "dit_p95_last20_ms": p95(dit[-20:]),
    }


def fps_run(model: RealtimeModel, num_sessions: int, num_chunks: int, width: int,
            height: int) -> tuple[float, list[bytes]]:
    """Aggregate output frames/s of `num_sessions` sessions interleaved by the engine."""
    engine = RealtimeEngine(RealtimeStageConfig(max_sessions=max(2, num_sessions)), ServerConfig(),
                            runner=CausalRunner(model))
    frames, chunks = 0, []

    def reply(msg: Any) -> None:
        nonlocal frames
        frames += msg.num_frames
        chunks.append(msg.frames)

    start = time.perf_counter()
    for k in range(num_chunks):
        for s in range(num_sessions):
            if k == 0:
                _open(engine, f"s{s}", prompt="a red car", seed=s, width=width, height=height)
            engine.submit(RealtimeChunk(request_id=f"{s}-{k}", session_id=f"s{s}", chunk_index=k),
                          reply)
        while engine.has_work():
            engine.step()
    return frames / (time.perf_counter() - start), chunks


# --------------------------------------------------------------------------- encoding hook
# Spec realtime-video.md section 5. The rt-api helper owns worldserve/media/framing.py; these are
# the spec's reference algorithms so the figures exist before (and independently of) it.


def _delta_bytes(frames: list[bytes]) -> bytes:
    prev, parts = None, []
    for f in frames:
        cur = np.frombuffer(f, np.uint8)
        parts.append(f if prev is None else (cur ^ prev).tobytes())
        prev = cur
    return b"".join(parts)


def _timed_ms(fn) -> tuple[Any, float]:
    out, seconds = harness.timed(fn)
    return out, seconds * 1000


def encoding_figures(frames: list[bytes], width: int, height: int) -> dict[str, float]:
    """Bytes per frame and encode ms for raw / delta-gzip / delta-zstd / jpeg over one batch."""
    import zstandard
    from PIL import Image

    n, raw = len(frames), b"".join(frames)
    gz, gz_ms = _timed_ms(lambda: gzip.compress(_delta_bytes(frames), compresslevel=1))
    zs, zs_ms = _timed_ms(lambda: zstandard.ZstdCompressor(level=3).compress(_delta_bytes(frames)))

    def jpeg() -> int:
        size = 0
        for f in frames:
            buf = io.BytesIO()
            Image.frombytes("RGB", (width, height), f).save(buf, "JPEG", quality=95, subsampling=0)
            size += buf.tell()
        return size

    jp, jp_ms = _timed_ms(jpeg)
    assert zlib.decompress(gz, wbits=31) == _delta_bytes(frames)
    return {
        "raw_bytes_per_frame": len(raw) / n,
        "delta_gzip_bytes_per_frame": len(gz) / n, "delta_gzip_encode_ms": gz_ms,
        "delta_zstd_bytes_per_frame": len(zs) / n, "delta_zstd_encode_ms": zs_ms,
        "jpeg_bytes_per_frame": jp / n, "jpeg_encode_ms": jp_ms,
        "delta_zstd_ratio": len(raw) / len(zs),
    }


def slow_scene(width: int = 832, height: int = 480, n: int = 16) -> list[bytes]:
    """A mostly static synthetic scene: a gradient and a square moving 2 px per frame."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], -1).astype(np.uint8)
    frames = []
    for i in range(n):
        f = base.copy()
        f[200:240, 100 + 2 * i:140 + 2 * i] = (250, 40, 40)
        frames.append(f.tobytes())
    return frames


# --------------------------------------------------------------------------- SANA-WM


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    pixels = (np.random.RandomState(0).rand(height, width, 3) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _world_engine(runner: Any, steps: int, sessions: int) -> RealtimeEngine:
    return RealtimeEngine(RealtimeStageConfig(max_sessions=max(2, sessions),
                                              num_inference_steps=steps), ServerConfig(),
                          runner=runner)


def world_latency_run(runner: Any, num_chunks: int, width: int, height: int,
                     steps: int) -> dict[str, Any]:
    """Per-chunk times of one image-started session (camera keys change every 4 chunks)."""
    engine = _world_engine(runner, steps, 1)
    times: list[float] = []
    state_bytes: list[int] = []

    def reply(msg: Any) -> None:
        assert msg.num_frames > 0, msg
        times.append(msg.forward_ms)

    frames = runner.chunk_frames(1, runner.facts.frames_per_block)
    _open(engine, "bench", seed=0, prompt="a road through a forest", width=width, height=height,
          first_frame=_png(width, height))
    for k in range(num_chunks):
        engine.submit(RealtimeChunk(
            request_id=f"c{k}", session_id="bench", chunk_index=k,
            camera=[["w"] if (k // 4) % 2 else ["l"]] * frames), reply)
        while engine.has_work():
            engine.step()
        state_bytes.append(engine.stats()["extra"]["kv_bytes"])
        if k % 10 == 9:
            print(f"  chunk {k + 1}/{num_chunks}: {times[-1]:.0f} ms", file=sys.stderr)
    early = times[10:60]
    return {"flatness": p95(times[-50:]) / p95(early), "p95_chunks_10_60_ms": p95(early),
            "p95_last50_ms": p95(times[-50:]), "state_bytes_first": state_bytes[0],
            "state_bytes_last": state_bytes[-1], "state_bytes_max": max(state_bytes)}


def world_throughput(runner: Any, num_sessions: int, num_chunks: int, width: int, height: int,
                    steps: int) -> float:
    """Aggregate chunks/s of `num_sessions` image-started sessions interleaved by the engine."""
    engine = _world_engine(runner, steps, num_sessions)
    done = 0

    def reply(msg: Any) -> None:
        nonlocal done
        assert msg.num_frames > 0, msg
        done += 1

    image = _png(width, height)
    start = time.perf_counter()
    for k in range(num_chunks):
        for s in range(num_sessions):
            if k == 0:
                _open(engine, f"s{s}", seed=s, prompt="a road", width=width, height=height,
                      first_frame=image)
            engine.submit(RealtimeChunk(request_id=f"{s}-{k}", session_id=f"s{s}", chunk_index=k),
                          reply)
        while engine.has_work():
            engine.step()
    return done / (time.perf_counter() - start)


def world_main(args: argparse.Namespace, width: int, height: int) -> None:
    """A family whose sessions start from an image (sana_wm, cosmos3, lingbot)."""
    if args.model == "lingbot":
        import tempfile

        from worldserve.models.causal_dit.dev import build_lingbot_realtime
        from worldserve.models.causal_dit.runner import load_runner

        directory = Path(tempfile.mkdtemp(prefix="lingbot-bench-"))
        build_lingbot_realtime(directory, 0)
        runner = load_runner(directory)
    elif args.model == "sana_wm":
        from worldserve.models.sana_wm.dev import build_pipeline, build_refiner
        from worldserve.models.sana_wm.runner import SanaWMRunner

        runner = SanaWMRunner(build_pipeline(0), None if args.no_refiner else build_refiner(0))
    else:
        from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_pipeline
        from worldserve.models.cosmos3.world import Cosmos3World

        pipe = build_pipeline(0, Cosmos3DevConfig(sound=False))
        pipe.set_progress_bar_config(disable=True)
        runner = Cosmos3World(pipe)
    result: dict[str, Any] = {"model": args.model, "pipeline": runner.facts.pipeline,
                              "size": args.size, "chunks": args.chunks, "steps": args.steps,
                              "threads": args.threads,
                              "frames_per_chunk": runner.chunk_frames(
                                  1, runner.facts.frames_per_block)}
    with torch.inference_mode():
        world_throughput(runner, 1, 3, width, height, args.steps)  # warm-up
        result.update(world_latency_run(runner, args.chunks, width, height, args.steps))
        one = world_throughput(runner, 1, args.fps_chunks, width, height, args.steps)
        two = world_throughput(runner, 2, args.fps_chunks, width, height, args.steps)
    result.update({"chunks_per_s_1": one, "chunks_per_s_2": two, "ratio_2_vs_1": two / one})
    harness.emit(harness.rounded(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("causal_dit", "sana_wm", "cosmos3", "lingbot"),
                    default="causal_dit")
    ap.add_argument("--no-refiner", action="store_true", help="sana_wm: stage 1 only")
    ap.add_argument("--steps", type=int, default=2,
                    help="sana_wm / cosmos3 / lingbot: denoising steps per chunk")
    ap.add_argument("--chunks", type=int, default=200)
    ap.add_argument("--fps-chunks", type=int, default=20)
    ap.add_argument("--size", default="64x64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model-path", type=Path, default=None)
    ap.add_argument("--protocols", action="store_true",
                    help="cadence of both realtime WebSocket protocols through a live server "
                    "(benchmarks/realtime_protocols.py)")
    ap.add_argument("--backend", choices=("causal", "fake"), default="causal",
                    help="--protocols: the realtime backend (causal: the dev checkpoint)")
    ap.add_argument("--sessions", type=int, default=3, help="--protocols: sessions each")
    ap.add_argument("--protocol-chunks", type=int, default=12,
                    help="--protocols: chunks per session")
    args = ap.parse_args()
    if args.protocols:
        from benchmarks.realtime_protocols import protocols_main

        protocols_main(args)
        return
    torch.set_num_threads(args.threads)
    width, height = (int(v) for v in args.size.split("x"))
    if args.model in ("sana_wm", "cosmos3", "lingbot"):
        world_main(args, width, height)
        return
    if args.model_path:
        model = load_realtime_model(args.model_path)
    else:
        from worldserve.models.causal_dit.dev import build_realtime_model

        model = build_realtime_model(0)
    mc = model.config
    result: dict[str, Any] = {"size": args.size, "chunks": args.chunks,
                              "steps": mc.default_num_inference_steps,
                              "sink": mc.default_sink_frames, "window": mc.default_window_frames}
    with torch.inference_mode():
        # Warm-up (first-call kernel and allocator costs for every cache shape the runs see).
        latency_run(model, 30, width, height, mc.default_sink_frames, mc.default_window_frames)
        for name, sink, window in (("window", mc.default_sink_frames, mc.default_window_frames),
                                   ("unbounded", 0, 3 * args.chunks)):
            run = latency_run(model, args.chunks, width, height, sink, window)
            print(name, json.dumps(run), file=sys.stderr)
            result[f"flatness_{name}"] = run["flatness"]
            result.update({f"{name}_{k}": v for k, v in run.items() if k != "flatness"})
        result["fps_1"], chunks = fps_run(model, 1, args.fps_chunks, width, height)
        result["fps_2"], _ = fps_run(model, 2, args.fps_chunks, width, height)
    dev = encoding_figures(_split(chunks[-1], width, height), width, height)
    slow = encoding_figures(slow_scene(), 832, 480)
    result.update({f"dev_{k}": v for k, v in dev.items()})
    result.update({f"slow_scene_{k}": v for k, v in slow.items()})
    result["delta_zstd_ratio_slow_scene"] = slow["delta_zstd_ratio"]
    harness.emit(harness.rounded(result))


def _split(chunk: bytes, width: int, height: int) -> list[bytes]:
    size = width * height * 3
    return [chunk[i:i + size] for i in range(0, len(chunk), size)]


if __name__ == "__main__":
    main()
