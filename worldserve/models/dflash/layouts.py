"""The checkpoint layouts DFlash drafters are published in, read into transformers'
`MuseGlimmerAssistantModel` (the DFlash drafter class transformers ships; the same network).

* transformers: `config.json` `model_type: muse_glimmer_assistant`.
* z-lab (`z-lab/Qwen3-8B-DFlash-b16` and siblings, loaded elsewhere with `trust_remote_code`):
  `model_type: qwen3`, `architectures: ["DFlashDraftModel"]`, `block_size` at the top level or
  in `dflash_config`, which also holds `mask_token_id` and `target_layer_ids`; weights
  `layers.*`, `norm`, `fc` (the context projection) and `hidden_norm` (its norm).
* vLLM speculators (`speculators_model_type: dflash`): `transformer_layer_config` (the draft
  layers' Qwen3 config), `block_size`, `mask_token_id`, `aux_hidden_state_layer_ids`; the same
  weight names (plus `verifier_norm`, a training-time term).

What the three cannot express alike is refused with a message naming it (a reduced draft
vocabulary, biased attention, sliding layers whose causality differs, DFlash2's candidate
selector, non-default logit scaling) rather than loaded into a drafter that drafts wrongly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModel, MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

from worldserve.models.common import resolve_dtype
from worldserve.models.types import ModelLoadError

TRANSFORMERS_TYPE = "muse_glimmer_assistant"
ZLAB_ARCHITECTURE = "DFlashDraftModel"
SPECULATORS_TYPE = "dflash"
# published names -> MuseGlimmerAssistantModel's
RENAMED = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
# in published checkpoints but not part of the drafting network
DROPPED = ("embed_tokens.weight", "verifier_norm.weight", "verifier_lm_head.weight")
# z-lab `dflash_config` keys that change the computation, with the values the network assumes
NEUTRAL = {"input_embedding_scale": 1.0, "output_multiplier": 1.0}
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
              "hidden_act", "attention_dropout")


def layout_of(config: dict) -> str | None:
    """"transformers", "zlab", "speculators", or None when `config` is no DFlash drafter."""
    if config.get("model_type") == TRANSFORMERS_TYPE:
        return "transformers"
    if config.get("speculators_model_type") == SPECULATORS_TYPE:
        return "speculators"
    if ZLAB_ARCHITECTURE in (config.get("architectures") or []):
        return "zlab"
    return None


def read_drafter(drafter_dir: Path, dtype: str) -> MuseGlimmerAssistantModel:
    """The drafter in `drafter_dir`, whatever its layout (ModelLoadError naming what is not
    supported)."""
    config = json.loads((drafter_dir / "config.json").read_text(encoding="utf-8"))
    layout = layout_of(config)
    if layout == "transformers":
        return AutoModel.from_pretrained(drafter_dir, dtype=resolve_dtype(dtype),
                                         local_files_only=True)
    muse = zlab_config(config) if layout == "zlab" else speculators_config(config)
    with torch.device("meta"):
        model = MuseGlimmerAssistantModel(muse)
    state = _published_weights(drafter_dir, config)
    model.load_state_dict(state, strict=True, assign=True)
    model.rotary_emb = type(model.rotary_emb)(muse)  # buffers are not in the checkpoint
    return model.to(resolve_dtype(dtype))


def zlab_config(config: dict) -> MuseGlimmerAssistantConfig:
    """z-lab's `DFlashDraftModel` config (a Qwen3 config plus `dflash_config`)."""
    dflash = config.get("dflash_config") or {}

    def value(name: str, default: Any = None) -> Any:
        return dflash.get(name, config.get(name, default))

    problems = [f"dflash_config.{key} {value(key)!r} (only {neutral} is supported)"
                for key, neutral in NEUTRAL.items() if value(key, neutral) != neutral]
    if value("final_logit_softcapping"):
        problems.append("final_logit_softcapping (logit soft-capping is not supported)")
    if "DFlash2DraftModel" in (config.get("architectures") or []) or value("selector_rank"):
        problems.append("DFlash2's candidate selector (DFlash2DraftModel)")
    if any(t == "sliding_attention" for t in config.get("layer_types") or []) and \
            value("is_causal") is not False:
        problems.append("causal sliding-window layers (transformers' drafter attends within "
                        "the block in both directions)")
    return _muse(config, value("block_size", 16), value("mask_token_id"),
                 value("target_layer_ids"), problems)


def speculators_config(config: dict) -> MuseGlimmerAssistantConfig:
    """A vLLM speculators `dflash` config (the draft layers in `transformer_layer_config`)."""
    layers = dict(config.get("transformer_layer_config") or {})
    problems = []
    target_vocab = layers.get("vocab_size")
    if config.get("draft_vocab_size") not in (None, target_vocab):
        problems.append(f"a reduced draft vocabulary (draft_vocab_size "
                        f"{config['draft_vocab_size']} of {target_vocab}, with d2t/t2d maps)")
    if config.get("projector_type", "dflash") != "dflash":
        problems.append(f"projector_type {config['projector_type']!r} (only 'dflash')")
    if config.get("sample_from_anchor"):
        problems.append("sample_from_anchor (drafts begin after the anchor here)")
    if any(t == "sliding_attention" for t in layers.get("layer_types") or []) and \
            not config.get("sliding_window_non_causal"):
        problems.append("causal sliding-window layers (sliding_window_non_causal is false)")
    return _muse(layers, config.get("block_size", 8), config.get("mask_token_id"),
                 config.get("aux_hidden_state_layer_ids"), problems)


def _muse(layers: dict, block_size: int, mask_token_id: int | None,
          target_layer_ids: list[int] | None, problems: list[str]) -> MuseGlimmerAssistantConfig:
    if layers.get("attention_bias"):
        problems.append("attention_bias (biased q/k/v/o projections)")
    if layers.get("rope_scaling"):
        problems.append(f"rope_scaling {layers['rope_scaling']!r}")
    if mask_token_id is None:
        problems.append("no mask_token_id")
    if not target_layer_ids:
        problems.append("no target_layer_ids")
    if problems:
        raise ModelLoadError(f"this DFlash drafter uses {'; '.join(problems)}, which the "
                             "reasoner's drafter does not support")
    kwargs = {key: layers[key] for key in LAYER_KEYS if layers.get(key) is not None}
    kwargs.setdefault("head_dim", layers["hidden_size"] // layers["num_attention_heads"])
    n = int(layers["num_hidden_layers"])
    kwargs["layer_types"] = layers.get("layer_types") or ["full_attention"] * n
    if layers.get("sliding_window"):
        kwargs["sliding_window"] = layers["sliding_window"]
    rope = layers.get("rope_parameters") or {"rope_type": "default",
                                             "rope_theta": layers.get("rope_theta", 10000.0)}
    return MuseGlimmerAssistantConfig(
        **kwargs, rope_parameters=dict(rope), block_size=int(block_size),
        mask_token_id=int(mask_token_id), target_layer_ids=list(target_layer_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _published_weights(drafter_dir: Path, config: dict) -> dict[str, torch.Tensor]:
    files = sorted(drafter_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"the DFlash drafter in {drafter_dir} has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    if "d2t" in state or "t2d" in state:
        raise ModelLoadError(f"the DFlash drafter in {drafter_dir} maps a reduced draft "
                             "vocabulary (d2t/t2d), which the reasoner's drafter does not support")
    lm_head = state.pop("lm_head.weight", None)
    if lm_head is not None and layout_of(config) == "zlab":
        raise ModelLoadError(f"the DFlash drafter in {drafter_dir} has its own lm_head; "
                             "drafts go through the target's")
    return {RENAMED.get(k, k): v for k, v in state.items()
            if k not in DROPPED and not k.endswith("rotary_emb.inv_freq")}


def write_published(model: MuseGlimmerAssistantModel, target: Path, layout: str) -> None:
    """Save `model` in a published layout ("zlab" or "speculators"), as those repositories do
    (tests and dev builders: a tiny drafter that loads through the published-layout path)."""
    from safetensors.torch import save_file

    c = model.config
    layers = {key: getattr(c, key) for key in LAYER_KEYS}
    layers.update(model_type="qwen3", layer_types=list(c.layer_types), attention_bias=False,
                  rope_theta=c.rope_parameters["rope_theta"], sliding_window=None,
                  use_sliding_window=False, vocab_size=None, tie_word_embeddings=False)
    if layout == "zlab":
        config = {**layers, "architectures": [ZLAB_ARCHITECTURE], "block_size": c.block_size,
                  "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
                  "dflash_config": {"mask_token_id": c.mask_token_id,
                                    "target_layer_ids": list(c.target_layer_ids)},
                  "num_target_layers": max(c.target_layer_ids) + 1}
    else:
        config = {"speculators_model_type": SPECULATORS_TYPE, "architectures": ["DFlashSpeculator"],
                  "transformer_layer_config": layers, "block_size": c.block_size,
                  "mask_token_id": c.mask_token_id,
                  "aux_hidden_state_layer_ids": list(c.target_layer_ids)}
    inverse = {v: k for k, v in RENAMED.items()}
    state = {inverse.get(k, k): v.contiguous() for k, v in model.state_dict().items()}
    if layout == "speculators":
        state["verifier_norm.weight"] = torch.ones(c.hidden_size)
    target.mkdir(parents=True, exist_ok=True)
    save_file(state, target / "model.safetensors")
    (target / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
