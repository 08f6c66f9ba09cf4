"""Tiny random-weight Cosmos3 generator (`Cosmos3OmniPipeline`) in the plain diffusers layout.

Written by `Cosmos3OmniPipeline.save_pretrained`: `model_index.json` plus `transformer/`, `vae/`,
`scheduler/`, `text_tokenizer/` and `sound_tokenizer/`. The transformer has the action heads
(`action_gen`, every embodiment domain fits in `action_dim` 64) and the sound pathway
(`sound_gen`); the sizes follow shared/notes/model-families.md §1.7. `build_cosmos3(dir, seed)`
writes into an existing directory and touches nothing else in it, so the reasoner files of the
same Cosmos3 directory can be added by another builder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from diffusers import (
    AutoencoderKLWan,
    Cosmos3AVAEAudioTokenizer,
    Cosmos3OmniPipeline,
    Cosmos3OmniTransformer,
    UniPCMultistepScheduler,
)

from worldserve.models.dev.seeding import seeded, spread_norm_weights
from worldserve.models.dev.tokenizer import build_tokenizer


@dataclass(frozen=True)
class Cosmos3DevConfig:
    """Sizes of the dev generator. Cosmos3-Nano: hidden 4096 x 36 layers, latent 48."""

    vocab_size: int = 512
    hidden_size: int = 32
    head_dim: int = 16
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    rope_axes_dim: tuple[int, int, int] = (4, 2, 2)  # sums to head_dim / 2
    latent_channels: int = 8  # the VAE's z_dim = the transformer's latent_channel
    vae_base_dim: int = 8
    action_dim: int = 64  # >= 57 (hand_pose), so every domain fits
    num_embodiment_domains: int = 32  # > the largest domain id (20)
    sound_sampling_rate: int = 400  # hop 16 -> 25 latent frames/s = sound_latent_fps
    sound_dim: int = 8
    hidden_act: str = "silu"  # Edge checkpoints: "relu2"
    sound: bool = True
    actions: bool = True
    flow_shift: float = 5.0
    # The tokenizer's training text; None: the default dev corpus (tokenizer.py).
    tokenizer_corpus: tuple[str, ...] | None = None


def build_transformer(cfg: Cosmos3DevConfig) -> Cosmos3OmniTransformer:
    """The tiny transformer; its norms get distinct non-unit weights (`spread_norm_weights`) so
    that the reasoner's copy of the text pathway can be checked tensor by tensor."""
    z = cfg.latent_channels
    transformer = Cosmos3OmniTransformer(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, head_dim=cfg.head_dim,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        rope_axes_dim=list(cfg.rope_axes_dim), latent_channel=z, latent_patch_size=2,
        patch_latent_dim=4 * z, hidden_act=cfg.hidden_act,
        action_gen=cfg.actions, action_dim=cfg.action_dim,
        num_embodiment_domains=cfg.num_embodiment_domains,
        sound_gen=cfg.sound, sound_dim=cfg.sound_dim,
    ).eval()
    spread_norm_weights(transformer)
    return transformer


def build_vae(cfg: Cosmos3DevConfig) -> AutoencoderKLWan:
    """The Wan2.2-style residual VAE: 16x spatial (patch 2 x 8), 4x temporal."""
    z = cfg.latent_channels
    return AutoencoderKLWan(
        base_dim=cfg.vae_base_dim, decoder_base_dim=cfg.vae_base_dim, z_dim=z,
        dim_mult=[1, 1, 1, 1], num_res_blocks=1, is_residual=True, in_channels=12,
        out_channels=12, patch_size=2, scale_factor_spatial=16, scale_factor_temporal=4,
        latents_mean=[0.0] * z, latents_std=[1.0] * z,
    ).eval()


def build_sound_tokenizer(cfg: Cosmos3DevConfig) -> Cosmos3AVAEAudioTokenizer:
    return Cosmos3AVAEAudioTokenizer(
        sampling_rate=cfg.sound_sampling_rate, vocoder_input_dim=cfg.sound_dim, dec_dim=4,
        dec_c_mults=(1, 2), dec_strides=(4, 4), encoder_enabled=False,
    ).eval()


def build_pipeline(seed: int, cfg: Cosmos3DevConfig = Cosmos3DevConfig()) -> Cosmos3OmniPipeline:
    """Assemble the tiny pipeline in memory; each component has its own seeded stream."""
    tokenizer = build_tokenizer(cfg.vocab_size, corpus=cfg.tokenizer_corpus)
    cfg = _with_vocab(cfg, len(tokenizer))
    with seeded(seed, "cosmos3.transformer"):
        transformer = build_transformer(cfg)
    with seeded(seed, "cosmos3.vae"):
        vae = build_vae(cfg)
    sound = None
    if cfg.sound:
        with seeded(seed, "cosmos3.sound_tokenizer"):
            sound = build_sound_tokenizer(cfg)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=cfg.flow_shift)
    return Cosmos3OmniPipeline(
        transformer=transformer, vae=vae, scheduler=scheduler, text_tokenizer=tokenizer,
        sound_tokenizer=sound, safety_checker=None, enable_safety_checker=False)


def _with_vocab(cfg: Cosmos3DevConfig, vocab_size: int) -> Cosmos3DevConfig:
    return replace(cfg, vocab_size=vocab_size)


def build_cosmos3(target: Path, seed: int, cfg: Cosmos3DevConfig = Cosmos3DevConfig()) -> None:
    """Write the tiny Cosmos3 generator into `target` (plain diffusers layout)."""
    build_pipeline(seed, cfg).save_pretrained(Path(target))


def build_generation(target: Path, seed: int) -> None:
    """The dev server's default generation checkpoint (`dev-models build` -> generation/): the
    generator plus, at the root, the reasoner whose LLM is the generator's understanding
    pathway (one directory, both stages, like the published checkpoints)."""
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files

    build_cosmos3(target, seed)
    write_reasoner_files(target, seed)


# What Cosmos3OmniPipeline writes around a prompt at the dev world's size (its system prompts and
# resolution / duration templates), so that the world tokenizer learns it as whole words.
PIPELINE_TEXT = (
    "You are a helpful assistant who will generate images from a give prompt.",
    "You are a helpful assistant who will generate videos from a give prompt.",
    "This image is of 64x64 resolution.", "This image is not of 64x64 resolution.",
    "This video is of 64x64 resolution.", "This video is not of 64x64 resolution.",
    "The video is 0.4 seconds long and is of 24 FPS.",
    "The video is not 0.4 seconds long and is not of 24 FPS.",
)


def world_config() -> Cosmos3DevConfig:
    """The dev world checkpoint's sizes: wider and deeper than the random dev generator (4
    query / 2 K/V heads, 4 layers: 0.75 M parameters), and a tokenizer trained on the world's
    grammar and the pipeline's templates, so each word of a prompt is one token."""
    from itertools import chain

    from worldserve.models.dev.tokenizer import synthetic_corpus
    from worldserve.models.dev.world.grammar import corpus

    text = tuple(chain(synthetic_corpus(), *(corpus() for _ in range(4)), PIPELINE_TEXT * 8))
    return replace(Cosmos3DevConfig(), hidden_size=64, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=192, num_hidden_layers=4,
                   tokenizer_corpus=text)


def build_world(target: Path, seed: int, weights: Path | None = None) -> None:
    """The dev world directory (`dev-models build` -> world/, what `worldserve serve` serves by
    default): the generation directory's architecture and sizes with the weights trained on the
    dev world (models/dev/world/trained.py; `weights`: another such file) for the transformer,
    the VAE and the reasoner's own tensors; the reasoner's LLM is the trained generator's
    understanding pathway."""
    from worldserve.models.cosmos3_reasoner.dev import write_reasoner_files
    from worldserve.models.dev.world import trained

    weights = weights or trained.WEIGHTS_PATH
    cfg = world_config()
    pipe = build_pipeline(seed, cfg)
    trained.apply_to_pipeline(pipe, weights)
    pipe.save_pretrained(Path(target))
    write_reasoner_files(target, seed, tokenizer_corpus=cfg.tokenizer_corpus)
    trained.apply_to_reasoner_files(target, weights)
