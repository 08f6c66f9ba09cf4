"""The stage config's levers applied to a generation runner at startup: step caching, the VAE
decode settings, the attention backend and compilation. A lever the family's runner cannot
honour is a startup error naming the setting, never silently ignored; each lever's own code is
the family's (models/<family>/) over worldserve/levers/."""

from __future__ import annotations

from typing import Any

from worldserve.config import GenerationStageConfig
from worldserve.engines.generation.contract import (
    ChunkedDecodeRunner,
    GenerationRunner,
    SpeedRunner,
    StepCacheRunner,
)
from worldserve.ipc.messages import StepCacheReport
from worldserve.models.types import ModelLoadError, StepCacheSettings


def enable_step_cache(config: GenerationStageConfig, runner: GenerationRunner) -> str | None:
    """Install the runner's step-cache hooks when its family supports them; the method in use
    (None: no step caching on this stage)."""
    wanted = config.step_cache
    methods = runner.features.step_cache_methods
    if not wanted.enabled or not methods or not isinstance(runner, StepCacheRunner):
        return None
    if wanted.method not in methods:
        raise ValueError(f"stages.generation.step_cache.method={wanted.method!r}: this model "
                         f"caches with {', '.join(methods)}")
    runner.enable_step_cache(StepCacheSettings(method=wanted.method, threshold=wanted.threshold,
                                               interval=wanted.interval))
    return wanted.method


def step_cache_report(stats: list[Any]) -> StepCacheReport | None:
    """One request's step caching over its rows (None: it did not cache)."""
    rows = [s for s in stats if s is not None]
    if not rows:
        return None
    return StepCacheReport(method=rows[0].method,
                           num_forwards=sum(s.num_forwards for s in rows),
                           num_forwards_skipped=sum(s.num_forwards_skipped for s in rows))


def configure_vae(runner: GenerationRunner, config: GenerationStageConfig) -> dict[str, Any]:
    """The stage's VAE decode settings applied to the runner; what is in force (model_info).
    A setting the runner cannot honour is a startup error, never silently ignored."""
    family = runner.features.family
    if not isinstance(runner, ChunkedDecodeRunner):
        if config.vae_tiling or config.vae_decode_chunk_frames:
            raise ValueError(f"vae_tiling / vae_decode_chunk_frames: the {family} runner "
                             f"decodes in one call only; leave them unset for this model")
        return {"tiling": False, "decode_chunk_frames": 0}
    return {**runner.configure_vae(config.vae_tiling, config.vae_tile_size,
                                   config.vae_tile_stride),
            "decode_chunk_frames": config.vae_decode_chunk_frames}


def configure_speed(runner: GenerationRunner, config: GenerationStageConfig) -> None:
    """attention_backend / compile / understanding_kv_reuse, before the warmup requests (which
    then pay the compilation); a lever the family's runner lacks fails startup."""
    if isinstance(runner, SpeedRunner):
        runner.configure_speed(attention_backend=config.attention_backend,
                               compile=config.compile,
                               understanding_kv_reuse=config.understanding_kv_reuse)
    elif config.attention_backend != "native" or config.compile:
        raise ModelLoadError(f"attention_backend / compile: the {runner.features.family} "
                             f"runner does not support them (keep attention_backend: native, "
                             f"compile: false)")
