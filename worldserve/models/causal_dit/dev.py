"""Tiny random-weight causal realtime model (Self-Forcing-style causal Wan DiT with camera keys).

Layout (see worldserve/models/causal_dit/loader.py): realtime_config.json, transformer/
(config.json + model.safetensors), vae/ (AutoencoderKLWan), text_encoder/ (UMT5), tokenizer/.
Every component draws from its own seeded stream, so the build is deterministic.
"""

from __future__ import annotations

from pathlib import Path

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
    model = build_realtime_model(seed)
    model.config.save(target)
    (target / "transformer").mkdir()
    model.dit.cfg.save(target / "transformer")
    state = {k: v.contiguous() for k, v in model.dit.state_dict().items()}
    save_file(state, str(target / "transformer" / WEIGHTS_NAME))
    model.vae.save_pretrained(str(target / "vae"))
    model.text_encoder.save_pretrained(str(target / "text_encoder"))
    model.tokenizer.save_pretrained(str(target / "tokenizer"))
