"""Runs Cosmos3 (`Cosmos3OmniPipeline`, diffusers 0.42) one denoising step at a time.

`Cosmos3OmniPipeline.__call__` with its loop turned inside out: `prepare()` does everything
`__call__` does before the loop (input checks, prompt templates and tokens, the static
sequence packs, initial noise, conditioning latents, timesteps), `denoise_step()` runs one
iteration of the loop body (cond and uncond forwards, CFG, one scheduler step per modality),
`decode()` runs the VAE (and `extras()` the sound decoder and the action slice). One module per
phase (prepare.py, denoise.py, decode.py; their state in state.py); this one is the facade that
assembles them and attaches the levers. Each request row owns its schedulers (`__call__`
mutates `pipe.scheduler`), so rows of different requests interleave step by step and each
equals its solo `__call__` (tests/unit/models/test_cosmos3.py).

The Cosmos3 forward has no batch axis (one packed sequence per sample, CFG as two forwards),
so `max_batch_size` is 1: concurrent requests interleave, they never share a forward.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from worldserve.ipc.messages import GenerationParams
from worldserve.ipc.rules import check_generation
from worldserve.levers import shared
from worldserve.levers.diffusers_admin import DiffusersAdminOps
from worldserve.levers.lora import LoraAdapters
from worldserve.levers.speed import NATIVE, CompileTimer, apply_attention_backend, compile_blocks
from worldserve.levers.step_cache import METHODS, StepCacheBackend, StepCacheSettings
from worldserve.levers.yielding import BlockYieldOps
from worldserve.models.common import count_parameters
from worldserve.models.cosmos3 import checks
from worldserve.models.cosmos3.decode import Cosmos3Decode
from worldserve.models.cosmos3.denoise import Cosmos3Denoise
from worldserve.models.cosmos3.family import DEFAULTS, DEV_DEFAULTS, FAMILY
from worldserve.models.cosmos3.loader import load_pipeline
from worldserve.models.cosmos3.prepare import Cosmos3Prepare
from worldserve.models.dev import checkpoint_defaults
from worldserve.models.types import RowExtras, RunnerFeatures
from worldserve.models.wan.vae import TilingOptions, configure_tiling

log = logging.getLogger("worldserve.models.cosmos3")


def load_runner(model_dir: Path, *, dtype: str = "float32", device: str = "cpu",
                safety_checker: bool = False, fp8_compute: str = "auto") -> Cosmos3Runner:
    """The registry's generation loader for a Cosmos3 directory. The transformer is published
    for a reasoner loaded later in this process (a colocated stage shares its weights)."""
    pipe = load_pipeline(model_dir, dtype, device, safety_checker=safety_checker,
                         fp8_compute=fp8_compute)
    shared.publish(model_dir, shared.GENERATOR_TRANSFORMER, pipe.transformer)
    return Cosmos3Runner(pipe, Path(model_dir))


class Cosmos3Runner(Cosmos3Prepare, Cosmos3Denoise, Cosmos3Decode, DiffusersAdminOps,
                    BlockYieldOps):
    """Owns the pipeline; satisfies the generation runner contract (engines/generation): a
    facade over the three phases (`Cosmos3Prepare`, `Cosmos3Denoise`, `Cosmos3Decode`) and the
    levers attached to them (step cache, attention backend and compile, understanding K/V
    reuse, VAE tiling), with the optional LoRA / weights / memory capabilities of
    `DiffusersAdminOps` (the pipeline has no LoRA loader: adapters load through the
    transformer's `load_lora_adapter`), and yield points between its transformer blocks for a
    colocated reasoner (`BlockYieldOps`)."""

    max_batch_size: int | None = 1  # no batch axis: interleave only

    def __init__(self, pipe: Any, model_dir: Path | None = None) -> None:
        self.pipe = pipe
        self.model_dir = model_dir
        self.num_params = count_parameters(pipe)
        self.size_multiple = int(pipe.vae.config.scale_factor_spatial)
        self.temporal_stride = int(pipe.vae.config.scale_factor_temporal)
        config = pipe.transformer.config
        self.supports_sound = pipe.sound_tokenizer is not None and bool(config.sound_gen)
        self.supports_actions = bool(config.action_gen)
        self.padded_action_dim = int(config.action_dim) if self.supports_actions else None
        self.sample_rate = (int(pipe.sound_tokenizer.config.sampling_rate)
                            if pipe.sound_tokenizer is not None else None)
        self.features = self._features()
        self.declaration = checks.declaration(self)
        self.device = pipe._get_execution_device()
        self.lora = LoraAdapters(pipe)
        self.attention_backend = NATIVE
        self.compile_timer = CompileTimer(False)
        self.kv_reuse: Any = None  # an UnderstandingKVReuse once configured
        self.step_cache: StepCacheBackend | None = None

    def enable_step_cache(self, settings: StepCacheSettings) -> None:
        """Install the cache hooks (at startup); rows cache only when their request asks."""
        super().enable_step_cache(settings)
        self.declaration = msgspec.structs.replace(self.declaration, step_cache=settings.method)

    def describe(self) -> dict[str, Any]:
        """GET /admin/model_info facts."""
        return {"family": FAMILY.name, "pipeline": type(self.pipe).__name__,
                "dtype": str(self.pipe.transformer.dtype).removeprefix("torch."),
                "device": str(self.device), "lora_supported": True,
                "lora": self.lora.describe(), "sound": self.supports_sound,
                "action_generation": self.supports_actions, "speed": self.describe_speed(),
                "step_cache": (self.step_cache.settings.method if self.step_cache is not None
                               else None)}

    def describe_speed(self) -> dict[str, Any]:
        """The speed levers in force (part of /admin/model_info)."""
        timer = self.compile_timer
        return {"attention_backend": self.attention_backend,
                "compile": timer.pending or timer.seconds is not None,
                "compile_s": round(timer.seconds, 3) if timer.seconds is not None else None,
                "understanding_kv_reuse": self.kv_reuse is not None}

    def configure_speed(self, attention_backend: str = NATIVE, compile: bool = False,
                        understanding_kv_reuse: bool = False,
                        compile_backend: str | None = None) -> None:
        """Applied once after loading, before warmup (the stage config's fields). The reuse
        processors go in first so that the backend is set on them too."""
        transformer = self.pipe.transformer
        if understanding_kv_reuse:
            from worldserve.models.cosmos3.kv_reuse import UnderstandingKVReuse

            if transformer._cp_shard_fn is not None or transformer._cp_gather_fn is not None:
                log.info("understanding K/V reuse off: sequence parallelism owns the seams")
            else:
                self.kv_reuse = UnderstandingKVReuse()
                self.kv_reuse.install(transformer)
        apply_attention_backend([transformer], attention_backend, self.device,
                                transformer.dtype, gqa=True)
        self.attention_backend = attention_backend
        if compile:
            compile_blocks([transformer], backend=compile_backend)
            self.compile_timer = CompileTimer(True)

    def _features(self) -> RunnerFeatures:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
            _ACTION_RESOLUTION_BINS,
            _EMBODIMENT_TO_DOMAIN_ID,
            _EMBODIMENT_TO_RAW_ACTION_DIM,
        )

        domains = None
        if self.supports_actions:  # the domains whose width fits the model's padded width
            domains = {name: width for name, width in _EMBODIMENT_TO_RAW_ACTION_DIM.items()
                       if width <= (self.padded_action_dim or 0)}
        defaults = (checkpoint_defaults(self.model_dir, DEFAULTS, DEV_DEFAULTS)
                    if self.model_dir is not None else DEFAULTS)
        return RunnerFeatures(
            family=FAMILY.name, defaults=defaults, image_edits=False, exact_num_frames=True,
            sound=self.supports_sound,
            sound_sample_rate=self.sample_rate if self.supports_sound else None,
            video_conditioning=True, action_generation=self.supports_actions,
            flow_shift="flow_shift" in self.pipe.scheduler.config,
            padded_action_dim=self.padded_action_dim, action_domains=domains,
            action_domain_ids=({name: _EMBODIMENT_TO_DOMAIN_ID[name] for name in domains}
                               if domains is not None else None),
            action_api="world_model" if self.supports_actions else None,
            step_cache_methods=METHODS,
            action_resolution_tiers=tuple(sorted(int(k) for k in _ACTION_RESOLUTION_BINS)))

    # ------------------------------------------------------------------ checks

    def snap_frames(self, num_frames: int) -> int:
        """Cosmos3 takes any count; the api refuses counts that are not 4k+1 (spec table)."""
        return max(1, num_frames)

    def check(self, params: GenerationParams) -> None:
        """The declared rules of a request (the api checked them already; a backstop here at
        submission, -> 400 before a job exists)."""
        check_generation(params, self.declaration)

    def configure_vae(self, tiling: bool, tile_size: int | None = None,
                      tile_stride: int | None = None) -> dict[str, Any]:
        """stages.generation.vae_tiling: the Wan VAE's own spatial tiling (models/wan/vae.py)."""
        options = TilingOptions(tile_size, tile_stride) if tiling else None
        return configure_tiling(self.pipe.vae, options)

    # ------------------------------------------------------------------ one-shot

    def run_to_end(self, params: GenerationParams,
                   seed: int) -> tuple[np.ndarray, RowExtras | None]:
        """Prepare, every step and decode of one row (actions route, benchmarks)."""
        state = self.prepare(["one"], [params], [seed])
        while not state.done_denoising:
            self.denoise_step(state)
        return self.decode(state, 0), self.extras(state, 0)
