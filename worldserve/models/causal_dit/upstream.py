"""Published causal Wan checkpoints in their upstream key layout -> diffusers'
`WanTransformer3DModel` (issue 14 item 4; what was established is in docs/realtime-engine.md).

Layouts read from public sources:
- Self-Forcing / CausVid (causal Wan 2.1 T2V 1.3B): one torch pickle holding
  `{"generator": sd, "generator_ema": sd, ...}` whose keys are `model.` + the original Wan keys
  (`WanDiffusionWrapper.model` is a `CausalWanModel`, which keeps WanModel's parameter names).
- Original Wan 2.1 / 2.2 (`WanModel`): `config.json` + `diffusion_pytorch_model*.safetensors`
  with the same keys.
- LingBot-World (Wan 14B + camera control): the original keys plus camera-conditioning ones
  (`patch_embedding_wancamctrl`, `c2ws_hidden_states_layer1/2`, per block
  `cam_injector_layer1/2`, `cam_scale_layer`, `cam_shift_layer`), per SGLang's weight map.

The Wan part maps one-to-one onto diffusers names (the table below); the camera weights load
into `lingbot.CameraBranch` under their own names. `wan_causal.CausalWanDiT` runs both
block-causally.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from worldserve.models.causal_dit.lingbot import CameraBranch
from worldserve.models.types import ModelLoadError

# Original Wan key (regex) -> diffusers WanTransformer3DModel key.
WAN_TO_DIFFUSERS: tuple[tuple[str, str], ...] = (
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^img_emb\.proj\.0\.", "condition_embedder.image_embedder.norm1."),
    (r"^img_emb\.proj\.1\.", "condition_embedder.image_embedder.ff.net.0.proj."),
    (r"^img_emb\.proj\.3\.", "condition_embedder.image_embedder.ff.net.2."),
    (r"^img_emb\.proj\.4\.", "condition_embedder.image_embedder.norm2."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"^head\.head\.", "proj_out."),
    (r"^blocks\.(\d+)\.modulation$", r"blocks.\1.scale_shift_table"),
    (r"^blocks\.(\d+)\.self_attn\.([qkv])\.", r"blocks.\1.attn1.to_\2."),
    (r"^blocks\.(\d+)\.self_attn\.o\.", r"blocks.\1.attn1.to_out.0."),
    (r"^blocks\.(\d+)\.self_attn\.norm_([qk])\.", r"blocks.\1.attn1.norm_\2."),
    (r"^blocks\.(\d+)\.cross_attn\.([qkv])\.", r"blocks.\1.attn2.to_\2."),
    (r"^blocks\.(\d+)\.cross_attn\.o\.", r"blocks.\1.attn2.to_out.0."),
    (r"^blocks\.(\d+)\.cross_attn\.norm_([qk])\.", r"blocks.\1.attn2.norm_\2."),
    (r"^blocks\.(\d+)\.cross_attn\.k_img\.", r"blocks.\1.attn2.add_k_proj."),
    (r"^blocks\.(\d+)\.cross_attn\.v_img\.", r"blocks.\1.attn2.add_v_proj."),
    (r"^blocks\.(\d+)\.cross_attn\.norm_k_img\.", r"blocks.\1.attn2.norm_added_k."),
    (r"^blocks\.(\d+)\.norm3\.", r"blocks.\1.norm2."),
    (r"^blocks\.(\d+)\.ffn\.0\.", r"blocks.\1.ffn.net.0.proj."),
    (r"^blocks\.(\d+)\.ffn\.2\.", r"blocks.\1.ffn.net.2."),
    (r"^patch_embedding\.", "patch_embedding."),
)
# LingBot-World's camera conditioning (SGLang LingBotWorldArchConfig): no diffusers twin,
# loaded into `lingbot.CameraBranch`.
CAMERA_KEY_PATTERNS = (
    r"^patch_embedding_wancamctrl\.", r"^c2ws_hidden_states_layer[12]\.",
    r"^blocks\.\d+\.cam_(injector_layer[12]|scale_layer|shift_layer)\.",
)
WAN_HEAD_DIM = 128  # every published Wan 2.x DiT (1.3B: 1536 / 12, 14B: 5120 / 40)


def read_upstream_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Weights of a Self-Forcing-style pickle (EMA generator preferred) or of an original Wan
    directory (safetensors shards), with the wrapper's `model.` prefix removed."""
    path = Path(path)
    if path.is_file():
        # weights_only: a pickle from the internet must not run code.
        data = torch.load(path, map_location="cpu", weights_only=True)
        for name in ("generator_ema", "generator", "model", "state_dict"):
            if isinstance(data, dict) and isinstance(data.get(name), dict):
                data = data[name]
                break
    else:
        from safetensors.torch import load_file

        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{path}: no *.safetensors weights of a Wan DiT")
        data = {}
        for file in files:
            data.update(load_file(str(file)))
    if not isinstance(data, dict) or not data:
        raise ModelLoadError(f"{path}: no state dict found")
    return {k.removeprefix("model."): v for k, v in data.items()}


def camera_keys(state: dict[str, Any]) -> list[str]:
    return [k for k in state if any(re.match(p, k) for p in CAMERA_KEY_PATTERNS)]


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename original Wan keys; ModelLoadError names any key with no diffusers twin."""
    out, unknown = {}, []
    for key, value in state.items():
        for pattern, target in WAN_TO_DIFFUSERS:
            if re.match(pattern, key):
                out[re.sub(pattern, target, key)] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ModelLoadError(f"{len(unknown)} weights have no diffusers Wan twin, e.g. "
                             f"{unknown[:4]}")
    return out


def infer_config(state: dict[str, torch.Tensor],
                 declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """WanTransformer3DModel config from the weights' shapes (heads from `declared`
    `num_heads` when given, else Wan's head dim of 128)."""
    declared = declared or {}
    patch = state["patch_embedding.weight"]
    dim, in_channels, patch_size = patch.shape[0], patch.shape[1], tuple(patch.shape[2:])
    heads = int(declared.get("num_heads") or max(1, dim // WAN_HEAD_DIM))
    num_layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    out_channels = state["head.head.weight"].shape[0] // (patch_size[0] * patch_size[1]
                                                         * patch_size[2])
    image = state.get("img_emb.proj.1.weight")
    return {
        "patch_size": patch_size, "num_attention_heads": heads, "attention_head_dim": dim // heads,
        "in_channels": in_channels, "out_channels": out_channels,
        "text_dim": state["text_embedding.0.weight"].shape[1],
        "freq_dim": state["time_embedding.0.weight"].shape[1],
        "ffn_dim": state["blocks.0.ffn.0.weight"].shape[0], "num_layers": num_layers,
        "cross_attn_norm": "blocks.0.norm3.weight" in state,
        "qk_norm": "rms_norm_across_heads" if "blocks.0.self_attn.norm_q.weight" in state
        else None,
        "eps": float(declared.get("eps", 1e-6)),
        "image_dim": image.shape[1] if image is not None else None,
    }


def build_camera_branch(cams: dict[str, torch.Tensor], num_layers: int,
                        path: Path) -> CameraBranch:
    """LingBot-World's camera branch holding `cams` (strict: every camera weight used, every
    parameter filled; a partial set is refused naming what is missing)."""
    embed = cams.get("patch_embedding_wancamctrl.weight")
    if embed is None:
        raise ModelLoadError(f"{path}: camera weights without patch_embedding_wancamctrl.weight")
    branch = CameraBranch(embed.shape[0], embed.shape[1], num_layers)
    try:
        missing, unexpected = branch.load_state_dict(cams, strict=False)
    except RuntimeError as exc:  # a shape mismatch
        raise ModelLoadError(f"{path}: LingBot-World camera weights: {exc}") from None
    if missing or unexpected:
        raise ModelLoadError(f"{path}: LingBot-World camera weights do not match the camera "
                             f"branch (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return branch.eval()


def load_upstream(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(diffusers WanTransformer3DModel, LingBot-World `CameraBranch` or None) holding an
    upstream-layout checkpoint's weights, strictly: every weight used, every parameter filled,
    unknown keys named."""
    from diffusers import WanTransformer3DModel

    state = read_upstream_state_dict(path)
    cams = {k: state.pop(k) for k in camera_keys(state)}
    config_file = Path(path) / "config.json"
    declared = json.loads(config_file.read_text()) if config_file.is_file() else None
    config = infer_config(state, declared)
    model = WanTransformer3DModel(**config)
    missing, unexpected = model.load_state_dict(to_diffusers(state), strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{path}: weights do not match the inferred Wan config (missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]})")
    camera = build_camera_branch(cams, config["num_layers"], path).to(dtype) if cams else None
    return model.to(dtype).eval(), camera


def load_upstream_transformer(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """The Wan DiT of a checkpoint without camera weights (see `load_upstream`)."""
    model, camera = load_upstream(path, dtype)
    if camera is not None:
        raise ModelLoadError(f"{path} has LingBot-World camera weights: load it with "
                             "load_upstream(), which returns its camera branch too")
    return model
