"""Tiny random-weight Wan 2.1 text-to-video pipeline in the standard diffusers layout.

Written by `WanPipeline.save_pretrained`: model_index.json plus one folder per component
(tokenizer, text_encoder, transformer, vae, scheduler). `DiffusionPipeline.from_pretrained`
reloads it, as it does a real Wan 2.1 T2V diffusers checkpoint. One frame is an image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diffusers import (
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from worldserve.models.dev.seeding import seeded
from worldserve.models.dev.tokenizer import build_tokenizer


@dataclass(frozen=True)
class WanDevConfig:
    """Sizes of the dev Wan pipeline. Real Wan 2.1 1.3B: DiT width 1536 x 30 layers, VAE base 96."""

    vocab_size: int = 512
    # Wan pads prompts to 512 tokens by default (`max_sequence_length`); the tokenizer agrees.
    max_text_tokens: int = 512
    text_dim: int = 32  # UMT5 width = the DiT's text_dim
    text_layers: int = 2
    text_heads: int = 4
    num_attention_heads: int = 2
    attention_head_dim: int = 12  # split 4/4/4 over the (t, h, w) rotary axes
    ffn_dim: int = 32
    num_layers: int = 2
    latent_channels: int = 16  # Wan 2.1's VAE latent width; the DiT reads and writes it
    # The causal 3-D VAE dominates CPU time: keep it tiny (see cpu-stack notes, section 8).
    vae_base_dim: int = 4
    # Wan 2.1 T2V uses shift 5 (480p) to 7; 7 is what the CPU notes verified.
    scheduler_shift: float = 7.0


def build_text_encoder(tokenizer: PreTrainedTokenizerFast, cfg: WanDevConfig) -> UMT5EncoderModel:
    """UMT5 encoder (the slot Wan fills with umt5-xxl) over the dev tokenizer."""
    config = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=cfg.text_dim,
        d_kv=cfg.text_dim // cfg.text_heads,
        d_ff=2 * cfg.text_dim,
        num_layers=cfg.text_layers,
        num_heads=cfg.text_heads,
        relative_attention_num_buckets=8,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return UMT5EncoderModel(config).eval()


def build_vae(cfg: WanDevConfig) -> AutoencoderKLWan:
    """Wan's causal 3-D VAE: 8x spatial and 4x temporal compression, like the real one."""
    return AutoencoderKLWan(
        base_dim=cfg.vae_base_dim,
        z_dim=cfg.latent_channels,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    ).eval()


def build_transformer(cfg: WanDevConfig) -> WanTransformer3DModel:
    """Wan's DiT: (1, 2, 2) patches, self-attention with 3-D RoPE, cross-attention to the text."""
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=cfg.num_attention_heads,
        attention_head_dim=cfg.attention_head_dim,
        in_channels=cfg.latent_channels,
        out_channels=cfg.latent_channels,
        text_dim=cfg.text_dim,
        freq_dim=256,
        ffn_dim=cfg.ffn_dim,
        num_layers=cfg.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024,
    ).eval()


def build_pipeline(seed: int, cfg: WanDevConfig = WanDevConfig()) -> WanPipeline:
    """Assemble the tiny pipeline in memory; each component has its own seeded stream."""
    tokenizer = build_tokenizer(cfg.vocab_size, model_max_length=cfg.max_text_tokens)
    with seeded(seed, "text_encoder"):
        text_encoder = build_text_encoder(tokenizer, cfg)
    with seeded(seed, "vae"):
        vae = build_vae(cfg)
    with seeded(seed, "transformer"):
        transformer = build_transformer(cfg)
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=cfg.scheduler_shift),
        transformer=transformer,
    )


def build_generation(target: Path, seed: int, cfg: WanDevConfig = WanDevConfig()) -> None:
    """Write the tiny Wan 2.1 T2V pipeline into `target` (diffusers layout), with a tiny
    flow-matching action head in `target/action_head/` (serves /v1/actions/*)."""
    from worldserve.models.action_head.dev import build_action_head

    build_pipeline(seed, cfg).save_pretrained(target)
    build_action_head(target / "action_head", seed)
