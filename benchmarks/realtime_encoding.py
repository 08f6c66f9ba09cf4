"""Realtime transport encodings: bytes per frame and encode/decode ms per frame.

Encodes synthetic 832x480 chunks (12 frames, as one LingBot-style chunk) with every output
format of spec realtime-video §5 and measures them against raw in the same run:

- `slow`: a slowly moving scene (textured gradient panning 1 px per frame, light noise) -
  typical of a world with a still camera;
- `fast`: the camera turning (8 px per frame pan) over the same texture;
- `noise`: incompressible random frames (worst case).

Prints a table, then one JSON line with every figure and `delta_zstd_ratio_slow_scene`
(raw bytes / delta-zstd bytes on the slow scene).

    python benchmarks/realtime_encoding.py [--width 832 --height 480 --frames 12 --repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from worldserve.media.framing import ChunkEncoder, EncodeSettings, FrameDecoder  # noqa: E402

FORMATS = ("raw", "delta-gzip", "delta-zstd", "jpeg", "webp")


def scene(kind: str, num_frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """(N, H, W, 3) uint8 synthetic frames."""
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return rng.integers(0, 256, (num_frames, height, width, 3), dtype=np.uint8)
    step = 1 if kind == "slow" else 8
    pad = step * num_frames
    ys, xs = np.mgrid[0:height, 0:width + pad]
    texture = np.stack([(xs * 0.7 + 40 * np.sin(ys / 23.0)) % 256,
                        (ys * 0.5 + 30 * np.cos(xs / 31.0)) % 256,
                        ((xs + ys) * 0.25) % 256], axis=-1)
    texture = texture + rng.normal(0, 2.0, texture.shape)  # sensor-like noise
    texture = np.clip(texture, 0, 255).astype(np.uint8)
    return np.stack([texture[:, i * step:i * step + width] for i in range(num_frames)])


def measure(frames: np.ndarray, fmt: str, repeats: int) -> dict[str, float]:
    """Second chunk of a session (so delta formats use their cross-batch reference)."""
    best_encode = best_decode = float("inf")
    size = 0
    for _ in range(repeats):
        encoder = ChunkEncoder(EncodeSettings(fmt=fmt))
        decoder = FrameDecoder()
        first = encoder.encode_chunk(frames, request_id="r0", chunk_index=0, event_id=None)
        for batch in first:
            decoder.decode(batch.header, batch.payload)
        started = time.perf_counter()
        batches = encoder.encode_chunk(frames, request_id="r1", chunk_index=1, event_id=None)
        best_encode = min(best_encode, time.perf_counter() - started)
        started = time.perf_counter()
        for batch in batches:
            decoder.decode(batch.header, batch.payload)
        best_decode = min(best_decode, time.perf_counter() - started)
        size = sum(len(b.payload) for b in batches)
    n = len(frames)
    return {"bytes_per_frame": size / n, "encode_ms_per_frame": best_encode * 1000 / n,
            "decode_ms_per_frame": best_decode * 1000 / n}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    print(f"{'scene':6} {'format':11} {'bytes/frame':>12} {'ratio':>7} {'enc ms/f':>9} "
          f"{'dec ms/f':>9}")
    for kind in ("slow", "fast", "noise"):
        frames = scene(kind, args.frames, args.height, args.width)
        results[kind] = {}
        for fmt in FORMATS:
            row = measure(frames, fmt, args.repeats)
            raw = frames[0].nbytes
            row["ratio_vs_raw"] = raw / row["bytes_per_frame"]
            results[kind][fmt] = row
            print(f"{kind:6} {fmt:11} {row['bytes_per_frame']:12.0f} {row['ratio_vs_raw']:7.1f} "
                  f"{row['encode_ms_per_frame']:9.2f} {row['decode_ms_per_frame']:9.2f}")
    summary = {
        "benchmark": "realtime_encoding", "width": args.width, "height": args.height,
        "frames_per_chunk": args.frames,
        "delta_zstd_ratio_slow_scene": round(results["slow"]["delta-zstd"]["ratio_vs_raw"], 2),
        "delta_gzip_ratio_slow_scene": round(results["slow"]["delta-gzip"]["ratio_vs_raw"], 2),
        "results": {k: {f: {m: round(v, 3) for m, v in row.items()} for f, row in rows.items()}
                    for k, rows in results.items()},
    }
    harness.emit(summary)


if __name__ == "__main__":
    main()
