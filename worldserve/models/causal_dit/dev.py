"""Tiny random-weight causal realtime model (Self-Forcing-style causal Wan DiT with camera keys).

Layout (see worldserve/models/causal_dit/loader.py): realtime_config.json, transformer/
(config.json + model.safetensors), vae/ (AutoencoderKLWan), text_encoder/ (UMT5), tokenizer/.
Every component draws from its own seeded stream, so the build is deterministic.
`build_lingbot_realtime` writes the same directory with a LingBot-World-style DiT in the
upstream key layout (`upstream_wan_state`, `lingbot_world_state`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from worldserve.models.causal_dit.loader import RealtimeModel, RealtimePipelineConfig
from worldserve.models.causal_dit.model import WEIGHTS_NAME, CausalDiT, CausalDiTConfig
from worldserve.models.dev.seeding import seeded
from worldserve.models.dev.tokenizer import build_tokenizer
from worldserve.models.wan.dev import WanDevConfig, build_text_encoder, build_vae

SERVED_MODEL_NAME = "worldserve-dev-causal-wan"

# 64x64 frames -> 8x8 latents -> 16 tokens per latent frame; 3-frame blocks of 48 tokens.
DIT_CONFIG = CausalDiTConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=128, text_dim=32,
                             freq_dim=64, max_rope_frames=1024)
PIPELINE_CONFIG = RealtimePipelineConfig()
WAN_CONFIG = WanDevConfig(max_text_tokens=PIPELINE_CONFIG.max_text_tokens, vae_base_dim=4)
# The trained model starts sessions from a first frame (forward dynamics of the agent).
WORLD_PIPELINE_CONFIG = dataclasses.replace(PIPELINE_CONFIG, image_conditioning=True)
# Shipped beside the Cosmos3 world's weights (models/dev/world/weights/).
REALTIME_WEIGHTS_NAME = "realtime_world.safetensors"


def build_realtime_model(
    seed: int, dit_config: CausalDiTConfig = DIT_CONFIG,
    pipeline_config: RealtimePipelineConfig = PIPELINE_CONFIG,
) -> RealtimeModel:
    """Assemble the tiny model in memory (the tests use it without touching disk)."""
    tokenizer = build_tokenizer(WAN_CONFIG.vocab_size, model_max_length=WAN_CONFIG.max_text_tokens)
    with seeded(seed, "realtime.text_encoder"):
        text_encoder = build_text_encoder(tokenizer, WAN_CONFIG)
    with seeded(seed, "realtime.vae"):
        vae = build_vae(WAN_CONFIG)
    with seeded(seed, "realtime.transformer"):
        dit = CausalDiT(dit_config)
    return RealtimeModel(pipeline_config, dit, vae, text_encoder, tokenizer)


def build_realtime(target: Path, seed: int) -> None:
    """Write the tiny causal realtime model into `target`."""
    write_realtime(build_realtime_model(seed), target)


def trained_realtime_model(seed: int, weights: Path | None = None) -> RealtimeModel:
    """The dev causal model with the DiT and VAE trained on the dev world's agent clips
    (`tools/world_training/train_realtime.py`, docs/dev-world.md "The realtime model"): a
    session from an agent frame (`first_frame`, so `image_conditioning`) moves the agent the
    way the held keys command. The text encoder and tokenizer stay the seeded ones. `weights`:
    another file in the shipped layout (train_realtime's --out)."""
    from worldserve.models.dev.world import trained

    model = build_realtime_model(seed, pipeline_config=WORLD_PIPELINE_CONFIG)
    tensors, metadata = trained.read(weights or trained.WEIGHTS_DIR / REALTIME_WEIGHTS_NAME)
    model.dit.load_state_dict(trained.part(tensors, trained.TRANSFORMER), strict=True)
    model.vae.load_state_dict(trained.part(tensors, trained.VAE), strict=True)
    model.vae.register_to_config(latents_mean=json.loads(metadata["latents_mean"]),
                                 latents_std=json.loads(metadata["latents_std"]))
    return model


def build_realtime_world(target: Path, seed: int) -> None:
    """Write the trained causal realtime model (`dev-models build` -> realtime/)."""
    write_realtime(trained_realtime_model(seed), target)


def write_realtime(model: RealtimeModel, target: Path) -> None:
    """Save every component of `model` in the realtime checkpoint layout (loader.py)."""
    model.config.save(target)
    (target / "transformer").mkdir()
    model.dit.cfg.save(target / "transformer")
    state = {k: v.contiguous() for k, v in model.dit.state_dict().items()}
    save_file(state, str(target / "transformer" / WEIGHTS_NAME))
    model.vae.save_pretrained(str(target / "vae"))
    model.text_encoder.save_pretrained(str(target / "text_encoder"))
    model.tokenizer.save_pretrained(str(target / "tokenizer"))


def upstream_wan_state(seed: int = 0, dim: int = 16, layers: int = 2, ffn: int = 32,
                       text: int = 8, freq: int = 16, channels: int = 4) -> dict[str, Any]:
    """A causal Wan DiT's weights under the original WanModel parameter names and shapes
    (patch 1x2x2), written out by hand (the upstream layout tests load)."""
    DIM, LAYERS, FFN, TEXT, FREQ = dim, layers, ffn, text, freq
    CHANNELS, PATCH = channels, (1, 2, 2)
    g = torch.Generator().manual_seed(seed)

    def t(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(*shape, generator=g)

    state = {"patch_embedding.weight": t(DIM, CHANNELS, *PATCH), "patch_embedding.bias": t(DIM),
             "text_embedding.0.weight": t(DIM, TEXT), "text_embedding.0.bias": t(DIM),
             "text_embedding.2.weight": t(DIM, DIM), "text_embedding.2.bias": t(DIM),
             "time_embedding.0.weight": t(DIM, FREQ), "time_embedding.0.bias": t(DIM),
             "time_embedding.2.weight": t(DIM, DIM), "time_embedding.2.bias": t(DIM),
             "time_projection.1.weight": t(6 * DIM, DIM), "time_projection.1.bias": t(6 * DIM),
             "head.modulation": t(1, 2, DIM), "head.head.weight": t(CHANNELS * 4, DIM),
             "head.head.bias": t(CHANNELS * 4)}
    for i in range(LAYERS):
        b = f"blocks.{i}."
        state[b + "modulation"] = t(1, 6, DIM)
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                state[f"{b}{attn}.{proj}.weight"] = t(DIM, DIM)
                state[f"{b}{attn}.{proj}.bias"] = t(DIM)
            state[f"{b}{attn}.norm_q.weight"] = t(DIM)
            state[f"{b}{attn}.norm_k.weight"] = t(DIM)
        state[b + "norm3.weight"], state[b + "norm3.bias"] = t(DIM), t(DIM)
        state[b + "ffn.0.weight"], state[b + "ffn.0.bias"] = t(FFN, DIM), t(FFN)
        state[b + "ffn.2.weight"], state[b + "ffn.2.bias"] = t(DIM, FFN), t(DIM)
    return state


def lingbot_world_state(seed: int = 0, dim: int = 24, layers: int = 2, latent: int = 16,
                        mask: int = 4, text: int = 32, ray_stride: int = 8) -> dict[str, Any]:
    """A LingBot-World-style causal DiT in the upstream key layout: the Wan keys with an
    image-conditioned patch embedding (latent + mask + latent input channels, latent out) and
    the camera keys of `wan/modules/model.py` (:220-223, :396-399)."""
    state = upstream_wan_state(seed, dim=dim, layers=layers, channels=latent, text=text)
    g = torch.Generator().manual_seed(seed + 1000)

    def t(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(*shape, generator=g)

    state["patch_embedding.weight"] = t(dim, 2 * latent + mask, 1, 2, 2)
    cams = {"patch_embedding_wancamctrl": 6 * ray_stride * ray_stride * 4,
            "c2ws_hidden_states_layer1": dim, "c2ws_hidden_states_layer2": dim}
    for i in range(layers):
        for name in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer",
                     "cam_shift_layer"):
            cams[f"blocks.{i}.{name}"] = dim
    for name, fan_in in cams.items():
        state[f"{name}.weight"], state[f"{name}.bias"] = t(dim, fan_in), t(dim)
    return state


def build_lingbot_realtime(target: Path, seed: int) -> None:
    """The tiny realtime directory with a LingBot-World-style causal DiT in the upstream key
    layout (`transformer/lingbot_causal.pt`: dim 24, 2 layers, 36 -> 16 channels, camera
    branch over 8 x 8-pixel rays) and Wan's zero-padded text."""
    build_realtime(target, seed)
    shutil.rmtree(target / "transformer")
    (target / "transformer").mkdir()
    state = lingbot_world_state(seed + 5)
    torch.save({"generator_ema": {f"model.{k}": v for k, v in state.items()}},
               target / "transformer" / "lingbot_causal.pt")
    config = json.loads((target / "realtime_config.json").read_text())
    (target / "realtime_config.json").write_text(json.dumps({**config, "pad_text_tokens": 40}))
