"""Load a causal realtime checkpoint directory.

Layout (Hugging Face style, one folder per component, like a diffusers pipeline):

    realtime_config.json     pipeline facts and defaults (`RealtimePipelineConfig`)
    transformer/             config.json + model.safetensors (`CausalDiT`)
    vae/                     `AutoencoderKLWan` (diffusers save_pretrained)
    text_encoder/            `UMT5EncoderModel` (transformers save_pretrained)
    tokenizer/               a transformers tokenizer

A diffusers AnyFlow-FAR checkpoint (model_index.json naming AnyFlowFARPipeline) is refused with
a message: its transformer rebuilds a compressed full-history context per chunk, which does not
map onto a sink + sliding-window cache (see docs/realtime-engine.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from worldserve.models.causal_dit.model import KV, WEIGHTS_NAME, CausalDiT, CausalDiTConfig
from worldserve.models.types import ModelLoadError

PIPELINE_CONFIG_NAME = "realtime_config.json"
PIPELINE_NAME = "WorldserveCausalWanPipeline"


@dataclass(frozen=True)
class RealtimePipelineConfig:
    """Defaults a checkpoint declares. Sizes in latent frames unless named otherwise."""

    pipeline: str = PIPELINE_NAME
    frames_per_block: int = 3
    default_sink_frames: int = 3
    default_window_frames: int = 12
    default_num_inference_steps: int = 4
    default_fps: int = 16
    default_width: int = 64
    default_height: int = 64
    # Few-step DMD schedule: sigmas linspace(1, 0, steps + 1)[:-1] warped by this shift.
    timestep_shift: float = 5.0
    max_text_tokens: int = 32
    # Control-queue facts the api needs (spec 3.3): LingBot-style single-frame pulses.
    min_pulse_items: int = 1
    max_script_frames: int = 512
    # Wan-style text conditioning: encoder states zero-padded to this many tokens (Wan: 512);
    # 0 = no padding (the project's CausalDiT).
    pad_text_tokens: int = 0
    # Trained with a clean first latent frame (image-to-video): an init may carry first_frame.
    image_conditioning: bool = False
    # Few-step distilled without CFG: guidance_scale != 1 is refused. False: the model needs
    # classifier-free guidance and a session with guidance_scale != 1 runs two forwards a step.
    guidance_distilled: bool = True

    def save(self, directory: Path) -> None:
        (directory / PIPELINE_CONFIG_NAME).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "RealtimePipelineConfig":
        data = json.loads((directory / PIPELINE_CONFIG_NAME).read_text())
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class RealtimeModel:
    """The loaded components: causal DiT, streaming-capable Wan VAE, text encoder, tokenizer."""

    def __init__(self, config: RealtimePipelineConfig, dit: CausalDiT, vae: Any,
                 text_encoder: Any, tokenizer: Any, device: str = "cpu") -> None:
        self.config = config
        self.dit = dit.eval()
        self.vae = vae.eval()
        self.text_encoder = text_encoder.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        # Pixels per token side: VAE spatial factor x DiT patch.
        self.spatial_factor = int(vae.config.scale_factor_spatial) * dit.cfg.patch_size

    @property
    def dtype(self) -> torch.dtype:
        return next(self.dit.parameters()).dtype

    @staticmethod
    def resized_size(image: Any, width: int, height: int) -> tuple[int, int]:
        """The size `image` is resized to before the centre crop to width x height."""
        scale = max(width / image.width, height / image.height)
        return (max(width, round(image.width * scale)), max(height, round(image.height * scale)))

    def _pixels(self, image: Any, width: int, height: int) -> torch.Tensor:
        """(1, 3, 1, height, width) in [-1, 1]: resized to cover, centre-cropped."""
        size = self.resized_size(image, width, height)
        image = image.resize(size, resample=3)  # bicubic
        left, top = (size[0] - width) // 2, (size[1] - height) // 2
        image = image.crop((left, top, left + width, top + height))
        pixels = torch.tensor(list(image.getdata()), dtype=torch.float32)
        pixels = pixels.view(height, width, 3).permute(2, 0, 1) / 127.5 - 1.0
        return pixels[None, :, None].to(self.device, self.vae.dtype)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """VAE posterior mode, normalised like the Wan pipelines (`(z - mean) / std`)."""
        z = self.vae.encode(x).latent_dist.mode()
        dim = self.vae.config.z_dim
        mean = torch.tensor(self.vae.config.latents_mean).view(1, dim, 1, 1, 1).to(z)
        std = torch.tensor(self.vae.config.latents_std).view(1, dim, 1, 1, 1).to(z)
        return ((z - mean) / std).to(self.dtype)

    @torch.inference_mode()
    def encode_video(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels (B, 3, T, H, W) in [-1, 1] -> model-space latents (training's targets)."""
        return self._encode(pixels.to(self.device, self.vae.dtype))

    @torch.inference_mode()
    def encode_image(self, image: Any, width: int, height: int) -> torch.Tensor:
        """An RGB PIL image -> its model-space first latent frame (1, C, 1, h, w)."""
        return self._encode(self._pixels(image, width, height))

    @torch.inference_mode()
    def encode_condition(self, image: Any, width: int, height: int,
                         num_latent_frames: int) -> torch.Tensor:
        """LingBot / Wan I2V condition (1, u + C, n, h, w): a u-channel mask (1 on the first
        latent frame) and the latent of the image followed by zero frames (upstream
        image2video.py :302-309, :367-376)."""
        pixels = self._pixels(image, width, height)
        u = int(self.vae.config.scale_factor_temporal)
        zeros = pixels.new_zeros(1, 3, (num_latent_frames - 1) * u, height, width)
        z = self._encode(torch.cat([pixels, zeros], dim=2))
        mask = torch.zeros(1, u, *z.shape[2:], dtype=z.dtype, device=z.device)
        mask[:, :, 0] = 1.0
        return torch.cat([mask, z], dim=1)

    @torch.inference_mode()
    def prompt_states(self, prompt: str) -> torch.Tensor:
        """Prompt -> the text encoder's hidden states (1, L, text_dim) the DiT reads."""
        ids = self.tokenizer(prompt, max_length=self.config.max_text_tokens, truncation=True,
                             return_tensors="pt")
        input_ids = ids["input_ids"][:, : self.config.max_text_tokens]
        if input_ids.shape[1] == 0:  # an empty prompt still needs one key to attend to
            input_ids = torch.full((1, 1), self.tokenizer.pad_token_id, dtype=torch.long)
        hidden = self.text_encoder(input_ids=input_ids.to(self.device)).last_hidden_state
        pad = self.config.pad_text_tokens - hidden.shape[1]
        if pad > 0:
            hidden = torch.cat([hidden, hidden.new_zeros(hidden.shape[0], pad, hidden.shape[2])], 1)
        return hidden.to(self.dtype)

    @torch.inference_mode()
    def encode_prompt(self, prompt: str) -> list[KV]:
        """Prompt -> per-layer cross-attention K/V (the session's cross-attention cache)."""
        return self.dit.text_kv(self.prompt_states(prompt))


def _refuse_foreign_layouts(path: Path) -> None:
    index = path / "model_index.json"
    if (path / PIPELINE_CONFIG_NAME).is_file() or not index.is_file():
        return
    try:
        name = json.loads(index.read_text()).get("_class_name", "?")
    except (OSError, ValueError):
        name = "?"
    raise ModelLoadError(
        f"{path} holds a diffusers {name} checkpoint; the realtime stage serves causal DiT "
        f"checkpoints with {PIPELINE_CONFIG_NAME} (AnyFlow-FAR's compressed full-history "
        "context does not map onto a sink + sliding-window cache)")


def load_dit(directory: Path) -> Any:
    """`transformer/`: the project's CausalDiT, or an upstream causal Wan checkpoint
    (a Self-Forcing-style `*.pt` pickle, or `WanModel` config.json + safetensors) mapped onto
    diffusers' Wan DiT and run block-causally (`wan_causal.CausalWanDiT`)."""
    from safetensors.torch import load_file

    config = directory / "config.json"
    declared = json.loads(config.read_text()).get("_class_name") if config.is_file() else None
    if declared != "WorldserveCausalDiT":
        from worldserve.models.causal_dit.upstream import load_upstream
        from worldserve.models.causal_dit.wan_causal import CausalWanDiT

        pickles = sorted(directory.glob("*.pt"))
        return CausalWanDiT(*load_upstream(pickles[0] if pickles else directory))
    dit = CausalDiT(CausalDiTConfig.load(directory))
    state = load_file(str(directory / WEIGHTS_NAME))
    missing, unexpected = dit.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(f"{directory}: weights do not match the config "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return dit


def load_realtime_model(path: Path, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> RealtimeModel:
    """Load every component of a causal realtime checkpoint from `path`."""
    _refuse_foreign_layouts(path)
    if not (path / PIPELINE_CONFIG_NAME).is_file():
        raise ModelLoadError(f"{path} is not a realtime checkpoint (no {PIPELINE_CONFIG_NAME})")
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel

    try:
        config = RealtimePipelineConfig.load(path)
        dit = load_dit(path / "transformer").to(device, dtype)
        vae = AutoencoderKLWan.from_pretrained(str(path / "vae")).to(device, dtype)
        text_encoder = UMT5EncoderModel.from_pretrained(
            str(path / "text_encoder"), dtype=dtype, local_files_only=True).to(device)
        tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"), local_files_only=True)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot load a realtime checkpoint from {path}: {exc}") from exc
    _check_conditioning(path, dit, vae)
    return RealtimeModel(config, dit, vae, text_encoder, tokenizer, device)


def _check_conditioning(path: Path, dit: Any, vae: Any) -> None:
    """A LingBot-style DiT's camera rays and image condition must fit the VAE beside it."""
    stride = getattr(dit, "ray_stride", 0)
    if stride and stride != int(vae.config.scale_factor_spatial):
        raise ModelLoadError(f"{path}: the camera branch folds {stride}x{stride} pixels per "
                             "latent cell; the VAE's spatial factor is "
                             f"{vae.config.scale_factor_spatial}")
    cond = getattr(dit.cfg, "cond_channels", 0)
    want = int(vae.config.scale_factor_temporal) + int(vae.config.z_dim)
    if cond and cond != want:
        raise ModelLoadError(f"{path}: the DiT takes {cond} condition channels; an image "
                             f"condition here has {want} (mask + VAE latent)")
