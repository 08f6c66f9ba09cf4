"""The generation stage's VAE decode options on CPU (docs/generation.md "VAE decode"):
`vae_decode_chunk_frames` (a row decoded a few latent frames per engine step) and `vae_tiling`
(the Wan VAE's spatial tiles).

VAE: the dev Cosmos3 VAE (`AutoencoderKLWan`, Wan2.2 layout, random weights, base dim
`--base-dim`), one latent video of `--latent` (frames x height x width latent pixels), seeded.
In one process:
Each arm runs `--repeats` times in turn; seconds are medians.
  whole    `vae.decode(z)`: one call, the engine step a decode takes today;
  chunked  `WanDecodeJob.advance(n)` for n in `--chunks`: the longest call (what another
           job waits at most between its steps) and the sum; asserted bit-equal to `whole`;
  tiled    `vae.enable_tiling(--tile, --stride)` then `vae.decode(z)`: seconds, and the
           difference from `whole` (max and mean absolute, in [-1, 1] units); random weights,
           so the difference is an upper-bound kind of figure, not the trained VAE's.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402


def chunked_calls(vae, z, n: int, whole: torch.Tensor) -> list[float]:
    """Seconds of each call of a decode `n` latent frames at a time (the last one with the
    result's assembly); the result is asserted bit-equal to `whole`."""
    from worldserve.models.wan.vae import WanDecodeJob

    job = WanDecodeJob(vae, z)
    calls = []
    while True:
        finished, seconds = harness.timed(lambda: job.advance(n))
        calls.append(seconds)
        if finished:
            break
    result, seconds = harness.timed(job.result)
    calls[-1] += seconds
    assert torch.equal(result, whole), f"chunked ({n}) differs from one decode"
    return calls


def main() -> None:
    from dataclasses import replace

    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_vae
    from worldserve.models.wan.vae import TilingOptions, configure_tiling

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latent", default="8x12x12", help="FRAMESxHEIGHTxWIDTH latent pixels")
    parser.add_argument("--base-dim", type=int, default=8)
    parser.add_argument("--chunks", default="1,2", help="latent frames per call")
    parser.add_argument("--tile", type=int, default=128, help="tile size, output pixels")
    parser.add_argument("--stride", type=int, default=96, help="tile stride, output pixels")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    frames, height, width = (int(v) for v in args.latent.split("x"))
    torch.manual_seed(0)
    cfg = Cosmos3DevConfig()
    vae = build_vae(replace(cfg, vae_base_dim=args.base_dim))
    z = torch.randn(1, cfg.latent_channels, frames, height, width,
                    generator=torch.Generator().manual_seed(1))
    report: dict = {"benchmark": "vae_decode", "latent": args.latent, "base_dim": args.base_dim,
                    "repeats": args.repeats, "torch_threads": torch.get_num_threads()}
    chunks = [int(v) for v in args.chunks.split(",")]
    samples: dict[str, list[float]] = {}

    def sample(key: str, seconds: float) -> None:
        samples.setdefault(key, []).append(seconds)

    with torch.no_grad():
        vae.decode(z[:, :, :2])  # warm up
        for _ in range(args.repeats):  # the arms in turn, so that load drifts hit them alike
            configure_tiling(vae, None)
            whole, seconds = harness.timed(lambda: vae.decode(z).sample)
            sample("whole", seconds)
            for n in chunks:
                calls = chunked_calls(vae, z, n, whole)
                sample(f"chunk{n}.max_call", max(calls))
                sample(f"chunk{n}.total", sum(calls))
                report[f"chunk{n}"] = {"calls": len(calls), "bit_equal": True}
            configure_tiling(vae, TilingOptions(args.tile, args.stride))
            tiled, seconds = harness.timed(lambda: vae.decode(z).sample)
            sample("tiled", seconds)
    med = {key: statistics.median(values) for key, values in samples.items()}
    report["whole_s"] = round(med["whole"], 3)
    report["output"] = list(whole.shape[2:])
    for n in chunks:
        report[f"chunk{n}"].update(
            max_call_s=round(med[f"chunk{n}.max_call"], 3),
            total_s=round(med[f"chunk{n}.total"], 3),
            max_call_over_whole=round(med[f"chunk{n}.max_call"] / med["whole"], 3),
            total_over_whole=round(med[f"chunk{n}.total"] / med["whole"], 3))
    diff = (tiled - whole).abs()
    report["tiled"] = {"tile": args.tile, "stride": args.stride, "s": round(med["tiled"], 3),
                       "max_abs_diff": round(diff.max().item(), 4),
                       "mean_abs_diff": round(diff.mean().item(), 5),
                       "time_ratio": round(med["tiled"] / med["whole"], 2)}
    harness.emit(report)


if __name__ == "__main__":
    main()
