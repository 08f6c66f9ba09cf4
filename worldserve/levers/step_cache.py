"""Step caching on a diffusers transformer, per request row (diffusers 0.42 cache hooks).

diffusers' cache hooks (`transformer.enable_cache(config)`) keep their state per *cache context
name*: a pipeline wraps each denoiser call in `transformer.cache_context("cond")` and the hooks
compare this call with the previous call of the same name. worldserve interleaves the rows of
several requests on one transformer, so the pipeline's names ("cond", "uncond") would make one
request reuse another's cached residuals. `DiffusersStepCache` gives every row its own names
(`<row key>/cond`), drops their state when the row finishes or leaves (`release`), and lets a row
that did not ask for caching run the transformer as if no hook were installed (`forward(cached=
False)`: every hooked module calls the forward it had before `enable_cache`, bit for bit).

It also counts, per forward, whether the transformer's last block ran: a forward whose last block
did not run reused cached work (`StepCacheForward.skipped`).

Methods (`METHODS`): SeaCache (SeaCacheConfig with its Cosmos3 adapter: reuse the decoder
stack's residual while the spectrally weighted input change stays under `threshold`) and
TaylorSeer (TaylorSeerCacheConfig on whole decoder blocks: a full forward every `interval` steps,
Taylor-extrapolated block outputs between). Two of diffusers' block caches do not run on Cosmos3
in 0.42.1: FBCache reads the block input by the hard-coded name `hidden_states` (Cosmos3's
decoder layer takes `gen_seq`: "Parameter 'hidden_states' not found"), and MagCache needs
magnitude ratios calibrated per checkpoint, of which diffusers publishes none for Cosmos3.

The shape is vLLM-Omni's diffusion cache backends': a `StepCacheBackend` is enabled once on a
loaded pipeline (`enable`) and refreshed per request row (`refresh`: fresh context names);
`StepCacheOps` is the runner side (as `BlockYieldOps` is for yield points): it attaches a row's
`StepCacheRow`, wraps each transformer call and reports the row's `StepCacheStats`.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worldserve.errors import InvalidRequest
from worldserve.models.types import StepCacheSettings, StepCacheStats

if TYPE_CHECKING:  # torch and diffusers load when the hooks are installed
    import torch

METHODS = ("seacache", "taylorseer")
DEFAULT_METHOD = "seacache"
# SeaCache's threshold when none is configured (diffusers' own default); TaylorSeer's knob is
# its refresh interval.
DEFAULT_THRESHOLDS = {"seacache": 0.25}
DEFAULT_INTERVAL = 3
_BYPASS_HOOK = "worldserve_step_cache_bypass"


def diffusers_config(settings: StepCacheSettings, block_list: str) -> Any:
    """The diffusers cache config of `settings` (`block_list`: the transformer's ModuleList of
    repeated blocks, e.g. "layers")."""
    import torch
    from diffusers.hooks import SeaCacheConfig, TaylorSeerCacheConfig

    if settings.method == "seacache":
        threshold = settings.threshold
        return SeaCacheConfig(threshold=threshold if threshold is not None
                              else DEFAULT_THRESHOLDS["seacache"])
    if settings.method == "taylorseer":
        # Whole blocks, refreshed every `interval` steps after two warm-up steps (diffusers'
        # default identifiers name attention modules Cosmos3 does not have).
        return TaylorSeerCacheConfig(cache_interval=settings.interval or DEFAULT_INTERVAL,
                                     disable_cache_before_step=2, max_order=1,
                                     taylor_factors_dtype=torch.float32,
                                     cache_identifiers=[rf"^{block_list}\.\d+$"])
    raise ValueError(f"step_cache.method {settings.method!r} is not one of "
                     f"{', '.join(METHODS)}")


@dataclass
class StepCacheForward:
    """What one forward did: `skipped` when the last block never ran (cached work reused)."""

    skipped: bool = False


class StepCacheBackend(ABC):
    """One step-caching method on one loaded pipeline, shared by every request row."""

    settings: StepCacheSettings

    @abstractmethod
    def enable(self, pipeline: Any) -> None:
        """Install the cache on the pipeline's denoiser (once, at startup)."""

    @abstractmethod
    def refresh(self) -> str:
        """A new request row: a context-name prefix no other row has had (its state starts
        empty)."""

    @abstractmethod
    def forward(self, cached: bool) -> AbstractContextManager[StepCacheForward]:
        """Around one denoiser call: `cached` False runs it as if no cache were enabled."""

    @abstractmethod
    def release(self, names: list[str]) -> None:
        """Drop the state of these context names (a finished or cancelled row)."""

    @abstractmethod
    def num_contexts(self) -> int:
        """Context states held now (tests: freed after a job)."""


def _bypass_hook(owner: DiffusersStepCache, plain_forward: Any) -> Any:
    """A hook registered outside one module's cache hooks: while `owner.bypass` is set (a row
    that does not cache), the module runs the forward it had before the cache was enabled."""
    from diffusers.hooks import ModelHook

    class BypassHook(ModelHook):
        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if owner.bypass:
                return plain_forward(*args, **kwargs)
            return self.fn_ref.original_forward(*args, **kwargs)

    return BypassHook()


class DiffusersStepCache(StepCacheBackend):
    """diffusers' cache hooks on one transformer, shared by every row and keyed per row.
    `block_list` names the transformer's repeated blocks and `probe` a submodule of the last
    one (Cosmos3's: "layers", "mlp_moe_gen")."""

    def __init__(self, settings: StepCacheSettings, *, block_list: str = "layers",
                 probe: str = "mlp_moe_gen") -> None:
        if settings.method not in METHODS:
            raise ValueError(f"step_cache.method {settings.method!r} is not one of "
                             f"{', '.join(METHODS)}")
        self.settings = settings
        self.block_list = block_list
        self.probe = probe
        self.bypass = False
        self._row_ids = itertools.count()
        self._calls = 0

    def enable(self, pipeline: Any) -> None:
        from diffusers.hooks import HookRegistry

        transformer = pipeline.transformer
        self.transformer = transformer
        block_list, probe, settings = self.block_list, self.probe, self.settings
        plain = {id(m): m.forward for m in transformer.modules()}
        before = {id(m): m.__dict__.get("forward") for m in transformer.modules()}
        transformer.enable_cache(diffusers_config(settings, block_list))
        self.hooked = [m for m in transformer.modules()
                       if m.__dict__.get("forward") is not before[id(m)]]
        for module in self.hooked:  # outermost: registered after the cache hooks
            HookRegistry.check_if_exists_or_initialize(module).register_hook(
                _bypass_hook(self, plain[id(module)]), _BYPASS_HOOK)
        HookRegistry.check_if_exists_or_initialize(transformer) \
            .invalidate_child_registries_cache()
        self._managers = self._find_state_managers()  # the hooks never change after this
        blocks = getattr(transformer, block_list)
        # A submodule of the last block (`probe`): it runs only when the block's forward runs.
        getattr(blocks[-1], probe).register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self._calls += 1

    def refresh(self) -> str:
        return f"row{next(self._row_ids)}"

    @contextlib.contextmanager
    def forward(self, cached: bool) -> Iterator[StepCacheForward]:
        result = StepCacheForward()
        calls = self._calls
        self.bypass = not cached
        try:
            yield result
        finally:
            self.bypass = False
        result.skipped = cached and self._calls == calls

    def release(self, names: list[str]) -> None:
        wanted = set(names)
        for manager in self._managers:
            cache = manager._state_cache  # diffusers keeps no public per-name removal
            for name in wanted.intersection(cache):
                state = cache.pop(name)
                if hasattr(state, "reset"):
                    state.reset()

    def num_contexts(self) -> int:
        return sum(len(manager._state_cache) for manager in self._managers)

    def _find_state_managers(self) -> list[Any]:
        from diffusers.hooks.hooks import StateManager

        managers: dict[int, Any] = {}
        for module in self.transformer.modules():
            registry = getattr(module, "_diffusers_hook", None)
            if registry is None:
                continue
            for hook in registry.hooks.values():
                for value in vars(hook).values():
                    if isinstance(value, StateManager):
                        managers[id(value)] = value
        return list(managers.values())


# ---------------------------------------------------------------- the runner side


@dataclass
class StepCacheRow:
    """One request row's step caching: its context-name prefix, whether it caches, and its
    denoiser forwards so far (skipped: cached work reused)."""

    key: str = ""
    cached: bool = False
    num_forwards: int = 0
    num_forwards_skipped: int = 0

    @property
    def names(self) -> list[str]:
        return [f"{self.key}/cond", f"{self.key}/uncond"]


class StepCacheOps:
    """The runner side of step caching (engines/generation/contract.py `enable_step_cache`,
    `step_cache_stats`) for a runner that owns a diffusers pipeline as `self.pipe` and whose
    rows carry a `StepCacheRow` as `row.cache`."""

    pipe: Any
    step_cache: StepCacheBackend | None = None

    def enable_step_cache(self, settings: StepCacheSettings) -> None:
        """Install the cache hooks (at startup); rows cache only when their request asks."""
        if self.step_cache is not None:
            raise RuntimeError("step caching is already enabled on this runner")
        backend = DiffusersStepCache(settings)
        backend.enable(self.pipe)
        self.step_cache = backend

    def attach_step_cache(self, row: Any, cached: bool) -> None:
        """Give a row its own cache context names; their state goes when the row does."""
        cache = self.step_cache
        if cache is None:
            if cached:
                raise InvalidRequest("step caching is not enabled on this server",
                                     param="enable_teacache")
            return
        row.cache.key, row.cache.cached = cache.refresh(), cached
        weakref.finalize(row, cache.release, row.cache.names)  # a batch dropped on failure

    def release_step_cache(self, row: Any) -> None:
        if self.step_cache is not None:
            self.step_cache.release(row.cache.names)

    @contextlib.contextmanager
    def cache_forward(self, row: Any, name: str, i: int, sigma: float,
                      num_steps: int) -> Iterator[None]:
        """One transformer call under the row's own cache context (`<row key>/cond`), counted;
        a row that did not ask for caching runs as if no cache hook were installed."""
        transformer = self.pipe.transformer
        context = f"{row.cache.key}/{name}" if row.cache.key else name
        with transformer.cache_context(context, step_index=i, sigma=sigma,
                                       num_inference_steps=num_steps):
            if self.step_cache is None:
                yield
                return
            with self.step_cache.forward(row.cache.cached) as forward:
                yield
        row.cache.num_forwards += 1
        row.cache.num_forwards_skipped += int(forward.skipped)

    def step_cache_stats(self, state: Any, row: int) -> StepCacheStats | None:
        """A row's transformer forwards and how many reused cached work (None: not cached)."""
        cache = state.rows[row].cache
        if not cache.cached or self.step_cache is None:
            return None
        return StepCacheStats(method=self.step_cache.settings.method,
                              num_forwards=cache.num_forwards,
                              num_forwards_skipped=cache.num_forwards_skipped)
