"""What each stage would load, read from the files alone (JSON configs and safetensors headers;
no torch, nothing loaded): the input of the placement plan and of `worldserve check`.

A stage's weights: generation and realtime take the component folders below the model
directory; the reasoner takes the directory's root (in a published Cosmos3 directory the
generator's components sit in subfolders and the reasoner at the root). A folder with a
`*.safetensors.index.json` holds exactly the tensors its weight map names, in the files it names
(what the loaders read: a shard shared with another folder, or a stale file beside the index,
is counted by the map, not by the folder); a folder without one, every `*.safetensors` in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worldserve.config import ServerConfig, StageConfig
from worldserve.models.detect import MODEL_INDEX, read_json, read_safetensors_header
from worldserve.models.types import ModelLoadError
from worldserve.runtime.placement import (
    FP8_TENSORS,
    Arch,
    StageDemand,
    Workload,
    communicators_per_rank,
)

MODELOPT_STATE = "modelopt_state.pth"
# The largest request a stage is sized for (docs/hardware.md): a 1280x720, 189-frame video; the
# Cosmos3 / Wan 2.2 VAE packs 32x32 pixels and 4 frames into one transformer token.
VIDEO_W, VIDEO_H, VIDEO_FRAMES = 1280, 720, 189
PIXELS_PER_TOKEN_SIDE, FRAMES_PER_TOKEN = 32, 4
TEXT_TOKENS = 512
REASONER_CHATS = 4  # chat completions sized for besides the streaming sessions
DEFAULT_SESSION_TOKENS = 7000  # engines/reasoner/admission.py LIBRARY_MAX_SESSION_TOKENS
REALTIME_WINDOW_TOKENS = 32_760  # KV of one world session's window at 832x480 (est.)
# What `parallel.shard` divides: the generator transformer's blocks (cosmos3/parallel_load.py
# BLOCKS); every other tensor is replicated on each rank.
SHARDED_FOLDER, SHARDED_PREFIX = "transformer", "layers."
INDEX_SUFFIX = ".safetensors.index.json"


class CheckpointError(ValueError):
    """A weight file whose header cannot be read (the message names it)."""


@dataclass(frozen=True)
class WeightFile:
    path: str  # relative to the model directory
    num_bytes: int
    dtype_numel: dict[str, int]  # of the tensors the stage reads from this file
    sharded_numel: dict[str, int] = field(default_factory=dict)  # of those, what shard divides


@dataclass(frozen=True)
class StageFacts:
    """What one stage would load."""

    stage: str
    model_path: str | None
    family: str
    layout: str
    quantisation: str | None
    files: tuple[WeightFile, ...] = ()
    arch: Arch = field(default_factory=Arch)

    @property
    def dtype_numel(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            for dtype, numel in f.dtype_numel.items():
                out[dtype] = out.get(dtype, 0) + numel
        return out

    @property
    def sharded_numel(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            for dtype, numel in f.sharded_numel.items():
                out[dtype] = out.get(dtype, 0) + numel
        return out

    @property
    def file_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "family": self.family, "layout": self.layout,
                "quantisation": self.quantisation, "file_bytes": self.file_bytes,
                "num_params": sum(self.dtype_numel.values()),
                "dtype_numel": self.dtype_numel,
                "files": [{"path": f.path, "bytes": f.num_bytes} for f in self.files]}


def header_numel(header: dict[str, Any], names: set[str] | None = None,
                 prefix: str = "") -> dict[str, int]:
    """Elements per stored dtype ("BF16", "F8_E4M3", ...) of one header: of the tensors in
    `names` (every one when None) whose name starts with `prefix`."""
    out: dict[str, int] = {}
    for key, entry in header.items():
        if key == "__metadata__" or not isinstance(entry, dict):
            continue
        if (names is not None and key not in names) or not key.startswith(prefix):
            continue
        numel = 1
        for dim in entry.get("shape", []):
            numel *= int(dim)
        out[str(entry.get("dtype"))] = out.get(str(entry.get("dtype")), 0) + numel
    return out


def weight_map(model_dir: Path, stage: str) -> dict[Path, set[str] | None]:
    """The stage's safetensors files -> the tensor names it reads from each (None: all), by
    each folder's index where it has one (module docstring)."""
    if stage == "reasoner":
        folders = [model_dir]
    else:
        folders = sorted({p.parent for p in model_dir.rglob("*.safetensors")
                          if p.parent != model_dir}
                         | {p.parent for p in model_dir.rglob("*" + INDEX_SUFFIX)
                            if p.parent != model_dir})
    out: dict[Path, set[str] | None] = {}
    for folder in folders:
        indexes = sorted(folder.glob("*" + INDEX_SUFFIX))
        if not indexes:
            out.update(dict.fromkeys(p.resolve() for p in sorted(folder.glob("*.safetensors"))))
            continue
        for index in indexes:
            entries = (read_json(index) or {}).get("weight_map") or {}
            for name, file in entries.items():
                names = out.setdefault((folder / file).resolve(), set())
                if names is not None:
                    names.add(name)
    return out


def stage_facts(stage: str, model_dir: Path | None) -> StageFacts:
    """Family, layout, quantisation, files and architecture numbers of one stage's directory."""
    if model_dir is None:
        return StageFacts(stage, None, "fake", "no checkpoint (fake backend)", None)
    from worldserve.models.registry import resolve  # JSON reads only

    model_dir = Path(model_dir)
    family = resolve(stage, model_dir).name
    files = []
    root = model_dir.resolve()
    for path, names in sorted(weight_map(model_dir, stage).items()):
        header = read_safetensors_header(path)
        relative = path.resolve().relative_to(root)
        sharded = (header_numel(header, names, SHARDED_PREFIX)
                   if stage == "generation" and relative.parts[0] == SHARDED_FOLDER else {})
        files.append(WeightFile(str(relative), path.stat().st_size,
                                header_numel(header, names), sharded))
    return StageFacts(stage, str(model_dir), family, _layout(model_dir, stage),
                      _quantisation(model_dir, stage, files), tuple(files),
                      _arch(model_dir, stage))


def _layout(model_dir: Path, stage: str) -> str:
    pipeline = (model_dir / MODEL_INDEX).is_file()
    transformers = (model_dir / "config.json").is_file()
    sharded = any(model_dir.rglob("*.safetensors.index.json"))
    if pipeline and transformers:
        kind = "published (diffusers pipeline + transformers reasoner in one directory)"
    elif pipeline:
        kind = "diffusers pipeline"
    elif transformers:
        kind = "transformers model"
    else:
        kind = "worldserve realtime layout"
    return kind + (", sharded" if sharded else "")


def _quantisation(model_dir: Path, stage: str, files: list[WeightFile]) -> str | None:
    config_path = (model_dir / "config.json" if stage == "reasoner"
                   else model_dir / "transformer" / "config.json")
    quant = (read_json(config_path) or {}).get("quantization_config")
    if isinstance(quant, dict):
        keys = ("quant_method", "quant_algo", "quant_type")
        said = ", ".join(f"{k}={quant[k]}" for k in keys if k in quant)
        return f"{said or 'unknown'} ({config_path.relative_to(model_dir)} quantization_config)"
    states = [p for p in (model_dir / MODELOPT_STATE, model_dir / "transformer" / MODELOPT_STATE)
              if p.is_file()]
    fp8 = sorted({d for f in files for d in f.dtype_numel if d in FP8_TENSORS})
    if states:
        return f"modelopt ({states[0].relative_to(model_dir)})" + (
            f", {fp8[0]} tensors" if fp8 else "")
    if fp8:
        return f"{fp8[0]} tensors without a quantization_config"
    return None


def _arch(model_dir: Path, stage: str) -> Arch:
    if stage == "reasoner":
        config = read_json(model_dir / "config.json") or {}
        config = config.get("text_config") or config
    else:
        config = read_json(model_dir / "transformer" / "config.json") or {}
    hidden = int(config.get("hidden_size") or config.get("dim") or 0)
    heads = int(config.get("num_attention_heads") or config.get("num_heads") or 0)
    head_dim = int(config.get("head_dim") or (hidden // heads if heads else 0))
    vae = (read_json(model_dir / "vae" / "config.json") or {}) if stage == "generation" else {}
    return Arch(hidden_size=hidden, vae_width=int(vae.get("decoder_base_dim")
                                                  or vae.get("base_dim") or 0),
                num_layers=int(config.get("num_hidden_layers") or config.get("num_layers") or 0),
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=head_dim)


def workload(stage: str, stage_config: StageConfig) -> Workload:
    """The largest work the stage is sized for (constants above; docs/hardware.md)."""
    if stage == "generation":
        latent_frames = (VIDEO_FRAMES - 1) // FRAMES_PER_TOKEN + 1
        side = PIXELS_PER_TOKEN_SIDE
        tokens = -(-VIDEO_H // side) * -(-VIDEO_W // side) * latent_frames + TEXT_TOKENS
        return Workload(activation_tokens=tokens,
                        output_pixels=VIDEO_W * VIDEO_H * VIDEO_FRAMES)
    if stage == "reasoner":
        streaming = getattr(stage_config, "streaming", None)
        sessions = getattr(streaming, "max_sessions", 2) + REASONER_CHATS
        per_session = getattr(streaming, "max_session_tokens", None) or DEFAULT_SESSION_TOKENS
        return Workload(kv_tokens=sessions * per_session,
                        prefill_tokens=getattr(stage_config, "max_prefill_tokens", 2048))
    sessions = getattr(stage_config, "max_sessions", 2)
    return Workload(activation_tokens=REALTIME_WINDOW_TOKENS,
                    kv_tokens=sessions * REALTIME_WINDOW_TOKENS)


def stage_demands(config: ServerConfig) -> tuple[list[StageDemand], dict[str, StageFacts]]:
    """Every enabled stage's demand and facts (CheckpointError / ModelLoadError on bad files)."""
    demands, facts = [], {}
    colocated = (config.stages.reasoner.colocate_with_generation
                 and config.stages.generation.enabled)
    for name, stage_config in config.stages.enabled().items():
        fake = getattr(stage_config, "backend", None) == "fake"
        try:
            info = stage_facts(name, None if fake else stage_config.model_path)
        except (CheckpointError, ModelLoadError, OSError) as exc:
            # the stage itself reports an unloadable directory when it starts, in its words
            info = StageFacts(name, str(stage_config.model_path), "unknown",
                              f"unreadable: {exc}", None)
        facts[name] = info
        parallel = getattr(stage_config, "parallel", None)
        demands.append(StageDemand(
            # a fake backend (protocol tests) computes nothing: it never takes a GPU
            stage=name, device="cpu" if fake else stage_config.device, dtype=stage_config.dtype,
            dtype_numel=info.dtype_numel, arch=info.arch,
            workload=workload(name, stage_config) if not fake else Workload(),
            world_size=parallel.world_size if parallel else 1,
            shard=parallel.shard if parallel else 1,
            seq_split=parallel.ulysses * parallel.ring if parallel else 1,
            colocate_with="generation" if name == "reasoner" and colocated else None,
            fp8_compute=getattr(stage_config, "fp8_compute", "auto"),
            sharded_numel=info.sharded_numel,
            num_communicators=communicators_per_rank(
                parallel.cfg, parallel.ulysses, parallel.ring, parallel.shard) if parallel else 0,
            # an unchunked VAE decode runs between steps (the engine's loop) and frees its
            # memory before the next; a chunked one interleaves with the next job's steps
            decode_interleaves=name != "generation"
            or bool(getattr(stage_config, "vae_decode_chunk_frames", 0))))
    return demands, facts
