"""Step caching on a diffusers transformer, per request row (diffusers 0.42 cache hooks).

diffusers' cache hooks (`transformer.enable_cache(config)`) keep their state per *cache context
name*: a pipeline wraps each denoiser call in `transformer.cache_context("cond")` and the hooks
compare this call with the previous call of the same name. worldserve interleaves the rows of
several requests on one transformer, so the pipeline's names ("cond", "uncond") would make one
request reuse another's cached residuals. `StepCache` gives every row its own names
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
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worldserve.models.types import StepCacheSettings

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


def _bypass_hook(owner: StepCache, plain_forward: Any) -> Any:
    """A hook registered outside one module's cache hooks: while `owner.bypass` is set (a row
    that does not cache), the module runs the forward it had before the cache was enabled."""
    from diffusers.hooks import ModelHook

    class BypassHook(ModelHook):
        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if owner.bypass:
                return plain_forward(*args, **kwargs)
            return self.fn_ref.original_forward(*args, **kwargs)

    return BypassHook()


class StepCache:
    """One transformer's cache hooks, shared by every row and keyed per row."""

    def __init__(self, transformer: torch.nn.Module, settings: StepCacheSettings,
                 *, block_list: str = "layers", probe: str = "mlp_moe_gen") -> None:
        from diffusers.hooks import HookRegistry

        if settings.method not in METHODS:
            raise ValueError(f"step_cache.method {settings.method!r} is not one of "
                             f"{', '.join(METHODS)}")
        self.transformer = transformer
        self.settings = settings
        self.bypass = False
        self._row_ids = itertools.count()
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
        self._calls = 0
        # A submodule of the last block (`probe`): it runs only when the block's forward runs.
        getattr(blocks[-1], probe).register_forward_pre_hook(self._count)

    def _count(self, *_: Any) -> None:
        self._calls += 1

    def new_row_key(self) -> str:
        """A name prefix no other row has had on this transformer."""
        return f"row{next(self._row_ids)}"

    @contextlib.contextmanager
    def forward(self, cached: bool) -> Iterator[StepCacheForward]:
        """Around one transformer call: `cached` False runs it as if no cache were enabled."""
        result = StepCacheForward()
        calls = self._calls
        self.bypass = not cached
        try:
            yield result
        finally:
            self.bypass = False
        result.skipped = cached and self._calls == calls

    def release(self, names: list[str]) -> None:
        """Drop the hooks' state of these context names (a finished or cancelled row)."""
        wanted = set(names)
        for manager in self._managers:
            cache = manager._state_cache  # diffusers keeps no public per-name removal
            for name in wanted.intersection(cache):
                state = cache.pop(name)
                if hasattr(state, "reset"):
                    state.reset()

    def num_contexts(self) -> int:
        """Context states the hooks hold now, over every hook (tests: freed after a job)."""
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
