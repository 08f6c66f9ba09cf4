"""Seconds per denoising step of a full-size, random-weight Cosmos3-Nano-shaped generator in
bf16 on one GPU, at 480p and 720p (`Cosmos3OmniPipeline.__call__`'s default 189 frames and
guidance 6.0: each step is a cond and an uncond forward).

    .venv/bin/python benchmarks/cosmos3_gpu_step.py [--steps 4] [--frames 189]

The transformer has the class defaults (hidden 4096, 36 layers, 32/8 heads: 15.2 B parameters,
the Nano generator's shape); the VAE is small (output_type "latent": it never runs). Prints one
JSON line: {"480p_s_per_step": ..., "720p_s_per_step": ...}. Needs CUDA; exits 0 without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402

SIZES = {"480p": (480, 832), "720p": (720, 1280)}


def build(device: str):
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    from worldserve.models.dev.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(512)
    with torch.device(device):
        torch.set_default_dtype(torch.bfloat16)
        transformer = Cosmos3OmniTransformer().eval()
        vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1, 1],
                               num_res_blocks=1, is_residual=True, in_channels=12,
                               out_channels=12, patch_size=2, scale_factor_spatial=16,
                               scale_factor_temporal=4, latents_mean=[0.0] * 48,
                               latents_std=[1.0] * 48).eval()
        torch.set_default_dtype(torch.float32)
    transformer.time_embedder.to(torch.float32)  # as from_pretrained keeps it
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=5.0)
    pipe = Cosmos3OmniPipeline(transformer=transformer, vae=vae, scheduler=scheduler,
                               text_tokenizer=tokenizer, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def seconds_per_step(pipe, height: int, width: int, frames: int, steps: int) -> float:
    import torch

    marks: list[float] = []

    def on_step(_pipe, _i, _t, kwargs):
        torch.cuda.synchronize()
        marks.append(time.perf_counter())
        return kwargs

    torch.cuda.synchronize()
    marks.append(time.perf_counter())
    pipe(prompt="a robot arm picks up the blue cup", num_frames=frames, height=height,
         width=width, num_inference_steps=steps, guidance_scale=6.0, output_type="latent",
         generator=torch.Generator("cpu").manual_seed(0), callback_on_step_end=on_step)
    durations = [b - a for a, b in zip(marks, marks[1:])]
    return statistics.median(durations[1:] or durations)  # the first step pays warm-up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--frames", type=int, default=189)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    pipe = build("cuda")
    params = sum(p.numel() for p in pipe.transformer.parameters())
    result = {"transformer_params": params, "frames": args.frames, "steps": args.steps,
              "device": torch.cuda.get_device_name()}
    for name, (h, w) in SIZES.items():
        result[f"{name}_s_per_step"] = round(seconds_per_step(pipe, h, w, args.frames,
                                                              args.steps), 3)
    harness.emit(result)


if __name__ == "__main__":
    main()
