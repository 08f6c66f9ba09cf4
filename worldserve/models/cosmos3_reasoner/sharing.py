"""One copy of the understanding weights for both Cosmos3 stages in one process.

`tie_text_pathway` makes the reasoner's LLM parameters *be* the generator transformer's
understanding-pathway parameters (the same `Parameter` objects, so one storage). The two are
the same tensors by design (model-families.md 2.4); tying checks shapes and values first, so a
directory whose reasoner and generator disagree is refused instead of silently changed.
"""

from __future__ import annotations

from typing import Any

import torch

from worldserve.models.cosmos3_reasoner.text_pathway import shared_pairs


class WeightMismatch(ValueError):
    """The reasoner's LLM is not the generator's understanding pathway."""


@torch.no_grad()
def tie_text_pathway(reasoner: Any, generator: Any, model_type: str) -> int:
    """Point every reasoner LLM parameter at the generator's; returns how many were tied."""
    generator_params = dict(generator.named_parameters())
    pairs = shared_pairs(generator, reasoner, model_type)
    if not pairs:
        raise WeightMismatch("the generator has no parameters the reasoner shares")
    reasoner_params = dict(reasoner.named_parameters())
    for source, target in pairs:
        mine, theirs = reasoner_params[target], generator_params[source]
        if (mine.dtype, mine.device) != (theirs.dtype, theirs.device):
            raise WeightMismatch(f"reasoner {target} is {mine.dtype} on {mine.device}, the "
                                 f"generator's {theirs.dtype} on {theirs.device}: load both "
                                 "with one dtype on one device")
        if mine.shape != theirs.shape or not torch.equal(mine, theirs):
            raise WeightMismatch(f"reasoner {target} differs from generator {source}")
    for source, target in pairs:
        module_name, _, leaf = target.rpartition(".")
        setattr(reasoner.get_submodule(module_name) if module_name else reasoner, leaf,
                generator_params[source])
    return len(pairs)


def unique_parameter_bytes(*modules: Any) -> int:
    """Bytes of parameter storage held by `modules` together, shared storage counted once."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for param in module.parameters():
            storage = param.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total
