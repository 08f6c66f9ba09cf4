"""The Cosmos3 generator transformer's understanding (text) pathway is the reasoner's LLM.

`reasoner_key` maps a diffusers `Cosmos3OmniTransformer` parameter name to the transformers
reasoner's name (None for generation-only weights: `*_moe_gen`, `add_*`, `proj_in/out`, ...).
It is the inverse of transformers' load-time renaming for unified Cosmos3 checkpoints
(conversion_mapping.py, "cosmos3_omni" / "cosmos3_edge").
"""

from __future__ import annotations

import re
from typing import Any

from worldserve.models.cosmos3_reasoner.family import EDGE

_LLM_PREFIX = "model.language_model."
_ATTENTION = {"to_q": "q_proj", "to_k": "k_proj", "to_v": "v_proj", "to_out": "o_proj",
              "norm_q": "q_norm", "norm_k": "k_norm"}
_EDGE_MLP = {"up_proj": "fc1", "down_proj": "fc2"}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_PARTS = re.compile(
    r"^(self_attn\.(to_q|to_k|to_v|to_out|norm_q|norm_k)|mlp\.(gate_proj|up_proj|down_proj)"
    r"|input_layernorm|post_attention_layernorm)\.(weight|bias)$")


def reasoner_key(name: str, model_type: str) -> str | None:
    """The reasoner parameter that `name` (a generator transformer parameter) is, or None."""
    if name == "lm_head.weight":
        return name
    if name in ("embed_tokens.weight", "norm.weight"):
        return _LLM_PREFIX + name
    match = _LAYER.match(name)
    if match is None or _LAYER_PARTS.match(match.group(2)) is None:
        return None
    rest = match.group(2)
    module, _, leaf = rest.rpartition(".")
    kind, _, sub = module.partition(".")
    if kind == "self_attn":
        sub = _ATTENTION[sub]
    elif kind == "mlp" and model_type == EDGE:
        sub = _EDGE_MLP.get(sub, sub)
    module = f"{kind}.{sub}" if sub else kind
    return f"{_LLM_PREFIX}layers.{match.group(1)}.{module}.{leaf}"


def shared_pairs(generator: Any, reasoner: Any, model_type: str) -> list[tuple[str, str]]:
    """(generator name, reasoner name) of every understanding parameter both models hold."""
    reasoner_names = dict(reasoner.named_parameters())
    pairs = []
    for name, _ in generator.named_parameters():
        target = reasoner_key(name, model_type)
        if target is not None and target in reasoner_names:
            pairs.append((name, target))
    return pairs
