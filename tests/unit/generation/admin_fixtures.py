"""What the admin tests build from the tiny Wan checkpoint: LoRA adapters (diffusers layout, as
`WanPipeline.save_lora_weights` writes them), updated weights of the same architecture, weights
of another shape, and the reference outputs of fresh diffusers pipelines."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from worldserve.engines.generation.outputs import to_uint8

PROMPT = "a red car turns left"
SIZE = 64
STEPS = 3


def build_lora(model_dir: Path, target: Path, seed: int, modules: list[str]) -> Path:
    """A random rank-4 adapter on `modules` of the transformer, strong enough to show."""
    import diffusers as D
    import torch
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(seed)
    transformer = D.WanTransformer3DModel.from_pretrained(model_dir / "transformer")
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=modules,
                                       init_lora_weights=False))
    state = get_peft_model_state_dict(transformer)
    state = {k: v * 10 if "lora_B" in k else v for k, v in state.items()}
    D.WanPipeline.save_lora_weights(target, transformer_lora_layers=state)
    return target


def build_updated_weights(model_dir: Path, target: Path, seed: int) -> Path:
    """The same transformer with every tensor nudged: `<target>/transformer/` (pipeline layout)."""
    import diffusers as D
    import torch

    generator = torch.Generator().manual_seed(seed)
    transformer = D.WanTransformer3DModel.from_pretrained(model_dir / "transformer")
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    transformer.save_pretrained(target / "transformer")
    return target


def build_wrong_weights(model_dir: Path, target: Path) -> Path:
    """A transformer with a wider feed-forward: same names, other shapes (flat layout)."""
    import diffusers as D

    config = dict(D.WanTransformer3DModel.load_config(model_dir / "transformer"))
    config["ffn_dim"] = 48
    D.WanTransformer3DModel.from_config(config).save_pretrained(target)
    return target


def first_mismatch(model_dir: Path, weights_dir: Path) -> str:
    """The first tensor (model order) whose shape differs, found independently of the server."""
    import diffusers as D
    from safetensors import safe_open

    live = D.WanTransformer3DModel.from_pretrained(model_dir / "transformer").state_dict()
    new = {}
    for file in weights_dir.glob("*.safetensors"):
        with safe_open(str(file), "pt") as handle:
            new.update({k: list(handle.get_slice(k).get_shape()) for k in handle.keys()})
    return next(k for k, v in live.items() if list(v.shape) != new.get(k))


def reference(model_dir: Path, seed: int, *, loras: list[tuple[Path, str, float]] = (),
              transformer_dir: Path | None = None, frames: int = 1, **kw: Any) -> np.ndarray:
    """uint8 frames of a fresh diffusers pipeline (adapters loaded, or other weights)."""
    import diffusers as D
    import torch

    pipe = D.WanPipeline.from_pretrained(model_dir)
    if transformer_dir is not None:
        pipe.transformer = D.WanTransformer3DModel.from_pretrained(transformer_dir)
    for path, name, _ in loras:
        pipe.load_lora_weights(str(path), adapter_name=name)
    if loras:
        pipe.set_adapters([n for _, n, _ in loras], adapter_weights=[s for _, _, s in loras])
    out = pipe(kw.pop("prompt", PROMPT), height=SIZE, width=SIZE, num_frames=frames,
               num_inference_steps=kw.pop("steps", STEPS), guidance_scale=1.0,
               max_sequence_length=32, generator=torch.Generator().manual_seed(seed),
               output_type="np").frames[0]
    return to_uint8(out)


def assert_close_uint8(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal up to one level of rounding (float noise at a .5 boundary)."""
    assert actual.shape == expected.shape
    diff = np.abs(actual.astype(int) - expected.astype(int)).max()
    assert diff <= 1, f"max pixel difference {diff}"


def differ(a: np.ndarray, b: np.ndarray) -> int:
    """Largest pixel difference (outputs that must differ: well above the rounding slack)."""
    return int(np.abs(a.astype(int) - b.astype(int)).max())


def build_tiny_wan22(model_dir: Path, target: Path, boundary_ratio: float = 0.9) -> Path:
    """The tiny Wan 2.1 pipeline plus a second (low-noise) expert: a Wan 2.2 A14B layout."""
    import diffusers as D
    import torch

    pipe = D.WanPipeline.from_pretrained(model_dir)
    torch.manual_seed(22)
    transformer_2 = D.WanTransformer3DModel.from_config(pipe.transformer.config)
    wan22 = D.WanPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
                          scheduler=pipe.scheduler, transformer=pipe.transformer,
                          transformer_2=transformer_2, boundary_ratio=boundary_ratio)
    wan22.save_pretrained(target)
    shutil.copy(model_dir / "worldserve_dev.json", target)  # the dev sampling defaults
    return target


def reference_two_experts(model_dir: Path, seed: int, name: str, high: Path, low: Path | None,
                          scale: float, steps: int) -> np.ndarray:
    """uint8 frames of a fresh Wan 2.2 pipeline with one adapter name on both experts."""
    import diffusers as D
    import torch

    pipe = D.WanPipeline.from_pretrained(model_dir)
    pipe.load_lora_weights(str(high), adapter_name=name)
    if low is not None:
        pipe.load_lora_weights(str(low), adapter_name=name, load_into_transformer_2=True)
    pipe.set_adapters([name], adapter_weights=[scale])
    out = pipe(PROMPT, height=SIZE, width=SIZE, num_frames=1, num_inference_steps=steps,
               guidance_scale=1.0, max_sequence_length=32,
               generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]
    return to_uint8(out)
