"""Tiny random-weight SANA-WM checkpoint (stage-1 `SanaWMPipeline` + the `SanaWMLTX2Refiner`).

Sizes follow shared notes model-families.md section 3.1: a 1-layer Gemma-2 encoder (hidden 16),
an LTX-2 VAE with 8 latent channels and explicit 32x / 8x compression, and a 2-layer
`SanaWMTransformer3DModel`. The refiner (`refiner/`, optional) is a 2-layer LTX-2 refiner DiT
with tiny LTX-2 text connectors and a 1-layer Gemma-3 text model. Layout is what
`save_pretrained` writes, so `DiffusionPipeline.from_pretrained` reloads it like a published
checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from diffusers import (
    AutoencoderKLLTX2Video,
    FlowMatchEulerDiscreteScheduler,
    SanaWMPipeline,
    SanaWMTransformer3DModel,
)
from diffusers.models.transformers.transformer_sana_wm_refiner import (
    SanaWMLTX2RefinerTransformer3DModel,
)
from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
from diffusers.pipelines.sana_wm.refiner import SanaWMLTX2Refiner
from transformers import Gemma2Config, Gemma2Model, Gemma3TextConfig, Gemma3TextModel

from worldserve.models.dev.seeding import seeded
from worldserve.models.dev.tokenizer import build_tokenizer
from worldserve.models.sana_wm.family import REFINER_DIR

SERVED_MODEL_NAME = "worldserve-dev-sana-wm"
TEXT_DIM = 16  # Gemma hidden size = the DiT's caption_channels
LATENT_CHANNELS = 8


def _gemma2(vocab_size: int, pad_id: int) -> Gemma2Model:
    config = Gemma2Config(vocab_size=vocab_size, hidden_size=TEXT_DIM, intermediate_size=32,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=8, pad_token_id=pad_id, max_position_embeddings=1024)
    return Gemma2Model(config).eval()


def _vae() -> AutoencoderKLLTX2Video:
    # Without the explicit ratios this block layout derives 64 / 16 and the pipeline breaks.
    return AutoencoderKLLTX2Video(
        latent_channels=LATENT_CHANNELS, block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1), spatial_compression_ratio=32,
        temporal_compression_ratio=8).eval()


def _transformer() -> SanaWMTransformer3DModel:
    return SanaWMTransformer3DModel(
        in_channels=LATENT_CHANNELS, num_layers=2, hidden_size=32, num_attention_heads=2,
        linear_head_dim=16, softmax_every_n=2, caption_channels=TEXT_DIM,
        chunk_plucker_post_attn_blocks=2, mlp_ratio=2).eval()


def build_pipeline(seed: int) -> SanaWMPipeline:
    """The tiny stage-1 pipeline in memory."""
    tokenizer = build_tokenizer(512, model_max_length=1024)
    with seeded(seed, "sana_wm.text_encoder"):
        text_encoder = _gemma2(len(tokenizer), tokenizer.pad_token_id)
    with seeded(seed, "sana_wm.vae"):
        vae = _vae()
    with seeded(seed, "sana_wm.transformer"):
        transformer = _transformer()
    pipe = SanaWMPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                          transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_refiner(seed: int) -> SanaWMLTX2Refiner:
    """The tiny stage-2 refiner in memory (no VAE: the session decodes with stage 1's)."""
    tokenizer = build_tokenizer(512, model_max_length=64)
    layers = 1
    with seeded(seed, "sana_wm.refiner.text_encoder"):
        text_encoder = Gemma3TextModel(Gemma3TextConfig(
            vocab_size=len(tokenizer), hidden_size=TEXT_DIM, intermediate_size=32,
            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            pad_token_id=tokenizer.pad_token_id, max_position_embeddings=1024)).eval()
    with seeded(seed, "sana_wm.refiner.connectors"):
        connectors = LTX2TextConnectors(
            caption_channels=TEXT_DIM, text_proj_in_factor=layers + 1,
            video_connector_num_attention_heads=2, video_connector_attention_head_dim=8,
            video_connector_num_layers=1, video_connector_num_learnable_registers=None,
            audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
            video_hidden_dim=TEXT_DIM, audio_hidden_dim=TEXT_DIM).eval()
    with seeded(seed, "sana_wm.refiner.transformer"):
        transformer = SanaWMLTX2RefinerTransformer3DModel(
            in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=2,
            attention_head_dim=8, cross_attention_dim=TEXT_DIM, num_layers=2,
            caption_channels=TEXT_DIM, audio_in_channels=8, audio_out_channels=8,
            audio_num_attention_heads=2, audio_attention_head_dim=8,
            audio_cross_attention_dim=TEXT_DIM).eval()
    refiner = SanaWMLTX2Refiner(transformer=transformer, connectors=connectors,
                                tokenizer=tokenizer, text_encoder=text_encoder,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
                                text_max_sequence_length=64)
    refiner.set_progress_bar_config(disable=True)
    return refiner


def build_sana_wm(target: Path, seed: int, *, with_refiner: bool = True) -> None:
    """Write the tiny SANA-WM checkpoint into `target` (the refiner under `refiner/`)."""
    build_pipeline(seed).save_pretrained(str(target))
    if with_refiner:
        build_refiner(seed).save_pretrained(str(target / REFINER_DIR))
