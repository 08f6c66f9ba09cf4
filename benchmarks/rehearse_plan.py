"""`worldserve check`'s placement plan for a published Cosmos3 model, against the rehearsal.

`worldserve check` plans from the files alone (configs and safetensors headers:
runtime/checkpoint_facts.py). So the rehearsal writes a header-only copy of the published
directory (every tensor name, shape and dtype of the meta-built model, no data), plans it with
`server_plan` (the function behind `worldserve check`) on a stated GPU inventory, and sets each
stage's per-GPU plan beside the rehearsal's estimate of the same stage:

- generation: the largest rank's weights (transformer + VAE) plus the larger of its denoise
  step's peak and the single-device VAE decode peak (an upper bound: a group splits the decode),
  plus the NCCL communicators' buffers at the plan's own figure per process group (fake process
  groups hold none: the rehearsal cannot measure them, so this checks the rest);
- reasoner: its weights plus the KV cache the plan sizes for (its token count x the measured
  bytes per token x the plan's growth and packed-copy factors) plus the prefill peak.

The aim (issue 31): the plan within 10 % of the estimate and never below it.
"""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import rehearse_build as build
from worldserve.runtime.placement import (
    COMMUNICATOR_BYTES,
    GIB,
    KV_GROWTH_FACTOR,
    KV_PACKED_FACTOR,
    GpuInfo,
    communicators_per_rank,
)

# Total memory as torch reports it (get_device_properties(i).total_memory), approximately.
GPUS = {"h100": ("NVIDIA H100 80GB HBM3", 85_031_714_816, (9, 0)),
        "h200": ("NVIDIA H200", 150_754_705_408, (9, 0))}
WORLD = 8
SAFETENSORS_DTYPE = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}


def write_header_only(path: Path, state: dict[str, torch.Tensor]) -> None:
    """A safetensors file holding only its header (what `worldserve check` reads)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, t in state.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)


def write_published_dir(fx: dict[str, Any], root: Path) -> Path:
    """model_index.json, each component's config.json and header-only weights, and the
    reasoner's root config.json + weights (its whole model: where the published repository
    really keeps the shared LLM tensors is not known offline)."""
    with torch.device("meta"):
        parts = {"transformer": build.build_transformer(fx), "vae": build.build_vae(fx),
                 "sound_tokenizer": build.build_sound(fx)}
        reasoner = build.build_reasoner(fx)
    index = {"_class_name": "Cosmos3OmniPipeline", "_diffusers_version": "0.42.1",
             "enable_safety_checker": False, "scheduler": ["diffusers", "UniPCMultistepScheduler"],
             "text_tokenizer": ["transformers", "Qwen2TokenizerFast"]}
    for folder, module in parts.items():
        if module is None:
            index[folder] = [None, None]
            continue
        index[folder] = ["diffusers", type(module).__name__]
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "config.json").write_text(json.dumps(dict(module.config)))
        write_header_only(root / folder / "diffusion_pytorch_model.safetensors",
                          module.state_dict())
    (root / "model_index.json").write_text(json.dumps(index))
    (root / "config.json").write_text(json.dumps(fx["reasoner"]))
    write_header_only(root / "model.safetensors", reasoner.state_dict())
    return root


def plan_for(root: Path, spec: str | None, gpu: str) -> Any:
    """`server_plan` for the directory with stages.generation.parallel = spec on WORLD GPUs."""
    from worldserve.config.sources import load_config
    from worldserve.runtime.devices import server_plan

    overrides: dict[str, Any] = {"stages.generation.model_path": str(root),
                                 "stages.reasoner.model_path": str(root),
                                 "stages.realtime.enabled": False}
    if spec:
        overrides["stages.generation.parallel"] = spec
    name, total, capability = GPUS[gpu]
    gpus = [GpuInfo(index=i, name=name, total_bytes=total, capability=capability)
            for i in range(WORLD)]
    plan, _ = server_plan(load_config(None, overrides), gpus)
    return plan


def compare(plan_bytes: int, estimate_bytes: int) -> dict[str, Any]:
    ratio = plan_bytes / estimate_bytes if estimate_bytes else None
    return {"plan_gib": round(plan_bytes / GIB, 3), "rehearsal_gib": round(estimate_bytes / GIB, 3),
            "plan_over_rehearsal": round(ratio, 3) if ratio else None,
            "plan_below": plan_bytes < estimate_bytes,
            "within_10pct": ratio is not None and 1.0 <= ratio <= 1.10}


def generation_estimate(single: dict[str, Any] | None, ranks: dict[str, Any] | None,
                        spec: str | None) -> int:
    vae_peak = (single or {}).get("vae_decode_peak_gib", 0.0)
    if ranks is None:
        return int((single["weights_gib"] + max(single["step_peak_gib"], vae_peak)) * GIB)
    worst = max(ranks["ranks"], key=lambda r: r["weights_gib"] + r["step_peak_gib"])
    return (int((worst["weights_gib"] + max(worst["step_peak_gib"], vae_peak)) * GIB)
            + communicator_bytes(spec))


def compare_terms(planned: tuple[int, int], single: dict[str, Any] | None,
                  ranks: dict[str, Any] | None) -> dict[str, Any]:
    """The plan's step and decode terms beside what the rehearsal measured for each (the step
    on the largest rank, or on one device; the decode on one device): a plan whose total is
    above the rehearsal's could still be below it in a term the larger one hides."""
    source = ranks["ranks"] if ranks is not None else [single or {}]
    step = max((r.get("step_peak_gib", 0.0) for r in source), default=0.0)
    decode = (single or {}).get("vae_decode_peak_gib", 0.0)
    out = {"step_plan_gib": round(planned[0] / GIB, 3), "step_measured_gib": round(step, 3),
           "decode_plan_gib": round(planned[1] / GIB, 3),
           "decode_measured_gib": round(decode, 3)}
    out["each_at_or_above"] = planned[0] / GIB >= step and planned[1] / GIB >= decode
    return out


def communicator_bytes(spec: str | None) -> int:
    """The plan's NCCL buffers per rank for the layout (communicators_per_rank)."""
    from benchmarks.rehearse import parse_layout

    axes = {"cfg": 1, "ulysses": 1, "ring": 1, "shard": 1, **parse_layout(spec or "")}
    return COMMUNICATOR_BYTES * communicators_per_rank(
        axes["cfg"], axes["ulysses"], axes["ring"], axes["shard"])


def reasoner_estimate(reasoner: dict[str, Any], kv_tokens: int) -> int:
    """Weights + the KV cache at the plan's token count (measured bytes per token of buffer
    capacity, the plan's factors for doubling and the packed copy: not measured here) + the
    prefill's transient beyond the cache it wrote."""
    bf16 = reasoner["bf16"]
    kv = bf16["kv_bytes_per_token"] * kv_tokens * (KV_GROWTH_FACTOR + KV_PACKED_FACTOR)
    transient = max(0.0, bf16["prefill_peak_gib"] - bf16["kv_gib"])
    return int((bf16["weights_gib"] + transient) * GIB + kv)


def part_plan(name: str, layouts: list[str], gpu: str, results: dict[str, Any]) -> dict[str, Any]:
    """The plan for each layout beside the rehearsal's estimate (what ran of it)."""
    from worldserve.config.sources import load_config
    from worldserve.runtime.checkpoint_facts import workload

    fx = build.load_fixture(name)
    out: dict[str, Any] = {"part": "plan", "model": name, "gpu": GPUS[gpu][0],
                           "label": "CPU fake-tensor rehearsal vs worldserve check's plan"}
    by_layout = {r["layout"].split(" ")[0]: r for r in results.get("ranks", [])}
    with tempfile.TemporaryDirectory() as tmp:
        root = write_published_dir(fx, Path(tmp))
        cases = [None] + layouts if "single" in results else list(layouts)
        for spec in cases:
            plan = plan_for(root, spec, gpu)
            stage = plan.stages["generation"]
            entry: dict[str, Any] = {"fits": plan.fits, "notes": list(stage.notes)}
            ranks = _ranks_for(spec, by_layout)
            if spec is None or ranks is not None:
                entry.update(compare(stage.peak_bytes,
                                     generation_estimate(results.get("single"), ranks,
                                                         spec)))
                entry["terms"] = compare_terms(stage.transient_bytes, results.get("single"),
                                               ranks)
            else:
                entry["plan_gib"] = round(stage.peak_bytes / GIB, 3)
            out[spec or "one_gpu"] = entry
        if "reasoner" in results:
            config = load_config(None, {"stages.realtime.enabled": False})
            tokens = workload("reasoner", config.stages.reasoner).kv_tokens
            stage = plan_for(root, None, gpu).stages["reasoner"]
            out["reasoner"] = {"kv_tokens": tokens, **compare(
                stage.peak_bytes, reasoner_estimate(results["reasoner"], tokens))}
    return out


def _ranks_for(spec: str | None, by_layout: dict[str, Any]) -> dict[str, Any] | None:
    if spec is None:
        return None
    from benchmarks.rehearse import parse_layout
    from worldserve.levers.parallel.mesh import ParallelLayout

    key = ParallelLayout(**parse_layout(spec)).describe().split(" ")[0]
    return by_layout.get(key)
