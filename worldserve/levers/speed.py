"""Attention backend and regional compilation for diffusers transformers (issue 25 items 1, 2).

`apply_attention_backend` checks that this machine can run the backend before any weight
sees it: diffusers' own requirement check (the missing package, by name; a `*_hub` backend's
kernel fetched from the Hub or its cache, as `set_attention_backend` would), then one probe
call of `dispatch_attention_fn` on the stage's device and dtype with the argument shapes a
transformer uses (GQA, causal), so a backend that imports but cannot run here (`_flash_3` or
`_native_cudnn` on a CPU, `flex` where the kernel is missing) is a startup error, not a failed
first request. "native" leaves the transformer untouched (diffusers' default dispatch: torch
SDPA), so the default is today's output bit for bit.

`compile_blocks`: `compile_repeated_blocks(dynamic=True)` (packed sequence lengths vary per
request); the compilation itself happens on the first forward, i.e. during the stage's warmup,
and `CompileTimer` logs how long that forward took.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from worldserve.models.types import ModelLoadError

log = logging.getLogger("worldserve.levers.speed")

NATIVE = "native"


def apply_attention_backend(transformers: list[Any], backend: str, device: Any,
                            dtype: torch.dtype, *, gqa: bool = False) -> None:
    """Set `backend` on every transformer after checking it runs on `device` / `dtype`
    (ModelLoadError naming what is missing otherwise)."""
    if backend == NATIVE:
        return
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    check_attention_backend(backend, device, dtype, gqa=gqa)
    # set_attention_backend also makes `backend` diffusers' process-wide default; every
    # processor of these transformers passes its own, so put the default back: another model
    # in this process (a parallel rank, an engine built later) keeps the default dispatch.
    default = _AttentionBackendRegistry._active_backend
    try:
        for transformer in transformers:
            if not hasattr(transformer, "set_attention_backend"):
                raise ModelLoadError(f"attention_backend {backend!r}: "
                                     f"{type(transformer).__name__} has no "
                                     f"set_attention_backend (use native)")
            transformer.set_attention_backend(backend)
    finally:
        _AttentionBackendRegistry.set_active_backend(default)
    log.info("attention backend: %s", backend)


def check_attention_backend(backend: str, device: Any, dtype: torch.dtype, *,
                            gqa: bool = False) -> None:
    """ModelLoadError unless diffusers knows `backend`, its package is installed, and a tiny
    attention call runs on `device` in `dtype`."""
    from diffusers.models.attention_dispatch import (
        AttentionBackendName,
        _check_attention_backend_requirements,
        _maybe_download_kernel_for_backend,
        dispatch_attention_fn,
    )

    try:
        name = AttentionBackendName(backend)
    except ValueError:
        known = ", ".join(sorted(member.value for member in AttentionBackendName))
        raise ModelLoadError(f"attention_backend {backend!r}: unknown to diffusers "
                             f"(known: {known})") from None
    try:
        _check_attention_backend_requirements(name)
        # `*_hub` backends: the kernel comes from the Hugging Face Hub (the cache, offline)
        _maybe_download_kernel_for_backend(name)
    except (RuntimeError, ImportError, ValueError, OSError) as exc:
        raise ModelLoadError(f"attention_backend {backend!r} cannot run here: {exc}") from None
    heads, kv_heads = (2, 1) if gqa else (2, 2)
    q = torch.randn(1, 8, heads, 64, device=device, dtype=dtype)
    kv = torch.randn(1, 8, kv_heads, 64, device=device, dtype=dtype)
    kwargs = {"enable_gqa": True} if gqa else {}
    try:
        out = dispatch_attention_fn(q, kv, kv, is_causal=True, backend=name, **kwargs)
    except Exception as exc:  # any failure of the probe means the backend cannot serve here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(
            f"attention_backend {backend!r} cannot run on device {str(device)!r} in "
            f"{str(dtype).removeprefix('torch.')}: {type(exc).__name__}: {first}") from None
    if tuple(out.shape) != tuple(q.shape):
        raise ModelLoadError(f"attention_backend {backend!r}: probe returned shape "
                             f"{tuple(out.shape)}, expected {tuple(q.shape)}")


def compile_blocks(transformers: list[Any], *, backend: str | None = None) -> None:
    """Regional compilation of each transformer's `_repeated_blocks` with dynamic shapes;
    `backend` is torch.compile's (None: inductor; tests use "aot_eager")."""
    kwargs: dict[str, Any] = {"dynamic": True}
    if backend is not None:
        kwargs["backend"] = backend
    for transformer in transformers:
        if not getattr(transformer, "_repeated_blocks", None):
            raise ModelLoadError(f"compile: {type(transformer).__name__} declares no "
                                 f"_repeated_blocks to compile")
        transformer.compile_repeated_blocks(**kwargs)
    log.info("compile: transformer blocks marked for torch.compile (dynamic shapes, backend "
             "%s); they compile on the first forward (warmup)", backend or "inductor")


class CompileTimer:
    """Times the first forward after `compile_blocks` (where the compilation happens) and
    logs it once; `seconds` is None until then."""

    def __init__(self, enabled: bool) -> None:
        self.pending = enabled
        self.seconds: float | None = None
        self._start = 0.0

    def __enter__(self) -> CompileTimer:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.pending and exc[0] is None:
            self.pending = False
            self.seconds = time.perf_counter() - self._start
            log.info("compile: first forward (compiling the transformer blocks) took %.1f s",
                     self.seconds)
