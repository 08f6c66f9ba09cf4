"""Operator operations on a loaded diffusers pipeline, shared by the diffusers families.

- `LoraAdapters`: LoRA adapters (diffusers / PEFT layout) loaded into the pipeline's
  transformer(s) by name, and the one selection of adapters active for the next forward.
- `update_weights`: weights of the same architecture from a directory, shapes checked from the
  safetensors headers before anything touches the live model.
- `move_pipeline`: weights off the device and back (memory release / resume).

The transformers are diffusers `PeftAdapterMixin`s (`load_lora_adapter`, `set_adapters`,
`delete_adapters`); LoRA needs the `peft` package (the `lora` extra).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from worldserve.errors import Conflict, InvalidRequest, NotSupported

LORA_WEIGHT_NAMES = ("pytorch_lora_weights.safetensors", "adapter_model.safetensors")
ADAPTER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let a final "\n" in
TRANSFORMERS = ("transformer", "transformer_2")
# Keys PEFT adds to a wrapped module; the base weight moves under `base_layer`.
PEFT_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_", ".lora_magnitude_vector.")

# One active adapter selection: ((name, scale), ...); () = the base model.
Selection = tuple[tuple[str, float], ...]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _kind(path: Path, what: str) -> str:
    """"file", "dir" or "missing"; InvalidRequest for a path the OS refuses (NUL, too long)."""
    try:
        if path.is_file():
            return "file"
        return "dir" if path.is_dir() else "missing"
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{what} path {str(path)[:200]!r} is not usable: "
                             f"{_first_line(exc)}", param="path") from None


def lora_file(path: Path) -> Path:
    """The adapter's weight file: the file itself, or the known name (or only .safetensors)
    inside a directory. Raises InvalidRequest naming what is wrong."""
    kind = _kind(path, "LoRA")
    if kind == "missing":
        raise InvalidRequest(f"LoRA path '{path}' does not exist", param="path")
    if kind == "file":
        if path.suffix != ".safetensors":
            raise InvalidRequest(f"LoRA file '{path}' is not a .safetensors file", param="path")
        return path
    for name in LORA_WEIGHT_NAMES:
        if (path / name).is_file():
            return path / name
    found = sorted(path.glob("*.safetensors"))
    if len(found) == 1:
        return found[0]
    raise InvalidRequest(
        f"LoRA directory '{path}' has no adapter weights: expected "
        f"{' or '.join(LORA_WEIGHT_NAMES)} (diffusers / PEFT layout)", param="path")


@dataclass
class LoadedAdapter:
    name: str
    path: str
    scale: float
    path_2: str | None = None  # Wan 2.2 A14B: the low-noise expert's file


class LoraAdapters:
    """Adapters loaded into the pipeline's transformer(s) by name, and the active selection.

    Loading goes through the pipeline's `load_lora_weights` when it has one (diffusers'
    `*LoraLoaderMixin`, which also converts community formats, e.g. Wan's), else through the
    transformer's own `load_lora_adapter` (every diffusers `PeftAdapterMixin`, e.g. Cosmos3).
    Selection and deletion act on each transformer directly.
    """

    def __init__(self, pipe: Any, *, via_pipeline: bool | None = None) -> None:
        self.pipe = pipe
        self.via_pipeline = (hasattr(pipe, "load_lora_weights") if via_pipeline is None
                             else via_pipeline)
        self.models = {name: getattr(pipe, name) for name in TRANSFORMERS
                       if getattr(pipe, name, None) is not None}
        self.loaded: dict[str, LoadedAdapter] = {}
        self._active: Selection | None = ()

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": a.name, "path": a.path, "scale": a.scale,
                 **({"path_2": a.path_2} if a.path_2 else {})} for a in self.loaded.values()]

    def load(self, name: str, path: str, scale: float,
             path_2: str | None = None) -> dict[str, Any]:
        """Load `path` into the transformer (and `path_2`, when given, into `transformer_2`)."""
        if not ADAPTER_NAME.fullmatch(name):
            raise InvalidRequest("LoRA name must be 1-64 letters, digits, '_' or '-'",
                                 param="name")
        if name in self.loaded:
            raise Conflict(f"a LoRA adapter named '{name}' is already loaded; unload it first")
        files = {"transformer": lora_file(Path(path))}
        if path_2 is not None:
            if "transformer_2" not in self.models:
                raise InvalidRequest("path_2 needs a model with a transformer_2 (Wan 2.2 A14B)",
                                     param="path_2")
            files["transformer_2"] = lora_file(Path(path_2))
        _require_peft()
        for component, weights in files.items():
            try:
                self._load_file(name, weights, component)
            except Exception as exc:  # operator input: any loader failure is the file's fault
                self._drop_partial(name)
                raise InvalidRequest(f"cannot load LoRA '{name}' from '{weights}': "
                                     f"{_first_line(exc)}", param="path") from None
        self.loaded[name] = LoadedAdapter(name=name, path=str(path), scale=scale, path_2=path_2)
        self._active = None  # loading activates the new adapter: select again before a step
        return {"name": name, "path": str(path), "scale": scale,
                "files": {c: str(f) for c, f in files.items()},
                "components": [c for c, m in self.models.items() if _holds(m, name)]}

    def _load_file(self, name: str, weights: Path, component: str) -> None:
        if self.via_pipeline:
            self.pipe.load_lora_weights(str(weights.parent), weight_name=weights.name,
                                        adapter_name=name,
                                        **({"load_into_transformer_2": True}
                                           if component == "transformer_2" else {}))
        else:
            self.models[component].load_lora_adapter(
                str(weights.parent), weight_name=weights.name, adapter_name=name,
                prefix=_key_prefix(weights))
        if not _holds(self.models[component], name):
            raise ValueError(f"the file holds no LoRA weights for this model's {component}")

    def _drop_partial(self, name: str) -> None:
        """A failed load may have injected layers already: take them out again."""
        for model in self.models.values():
            if _holds(model, name):
                model.delete_adapters(name)
        self._active = None

    def unload(self, name: str) -> None:
        self.require([name])
        self._drop_partial(name)
        del self.loaded[name]

    def require(self, names: list[str]) -> None:
        for name in names:
            if name not in self.loaded:
                known = ", ".join(self.loaded) or "none"
                raise InvalidRequest(f"unknown LoRA adapter '{name}' (loaded: {known})",
                                     param="lora")

    def resolve(self, refs: list[tuple[str, float | None]]) -> Selection:
        """Names and scales of a request's selection, defaults filled in (InvalidRequest for an
        unknown name)."""
        self.require([name for name, _ in refs])
        return tuple((name, self.loaded[name].scale if scale is None else float(scale))
                     for name, scale in refs)

    def activate(self, selection: Selection) -> None:
        """Make exactly `selection` active in every transformer (none for ()); cheap when it
        already is."""
        if selection == self._active:
            return
        for model in self.models.values():
            if not getattr(model, "peft_config", None):
                continue  # no adapter was ever loaded into this one
            mine = [(n, s) for n, s in selection if _holds(model, n)]
            if mine:
                model.enable_lora()
                model.set_adapters([n for n, _ in mine], weights=[s for _, s in mine])
            else:
                model.disable_lora()
        self._active = selection


def _holds(model: Any, name: str) -> bool:
    return name in (getattr(model, "peft_config", None) or {})


def _key_prefix(weights: Path) -> str | None:
    """The prefix the file's keys carry: `transformer.` (diffusers), `base_model.model.`
    (PEFT), or none."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as handle:
        keys = list(handle.keys())
    for prefix in ("transformer", "base_model.model"):
        if keys and all(k.startswith(prefix + ".") for k in keys):
            return prefix
    return None


def _require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError:
        raise NotSupported("LoRA needs the 'peft' package: pip install 'worldserve[lora]'") \
            from None


class DiffusersAdminOps:
    """The optional generation-runner capabilities (engines/generation/contract.py: LoRA,
    weights update, memory release) for a runner that holds a diffusers pipeline in `pipe`, a
    `LoraAdapters` in `lora` and its load device in `device`."""

    pipe: Any
    lora: LoraAdapters
    device: Any

    def load_lora(self, name: str, path: str, scale: float,
                  path_2: str | None = None) -> dict[str, Any]:
        return self.lora.load(name, path, scale, path_2)

    def unload_lora(self, name: str) -> None:
        self.lora.unload(name)

    def list_lora(self) -> list[dict[str, Any]]:
        return self.lora.describe()

    def resolve_lora(self, refs: list[tuple[str, float | None]]) -> Selection:
        return self.lora.resolve(refs)

    def activate_lora(self, selection: Selection) -> None:
        self.lora.activate(selection)

    def update_weights(self, path: str) -> dict[str, Any]:
        return update_weights(self.pipe, path)

    def release_memory(self) -> dict[str, Any]:
        move_pipeline(self.pipe, "cpu")
        return {"device": "cpu", "bytes": parameter_bytes(self.pipe)}

    def resume_memory(self) -> dict[str, Any]:
        move_pipeline(self.pipe, self.device)
        return {"device": str(self.device), "bytes": parameter_bytes(self.pipe)}


# --------------------------------------------------------------------------- weights


def _component_dirs(pipe: Any, path: Path) -> dict[str, Path]:
    """Which folder holds the new weights of each transformer of the pipeline."""
    if _kind(path, "weights") != "dir":
        raise InvalidRequest(f"weights path '{path}' is not a directory", param="path")
    if (path / "transformer").is_dir():
        return {name: path / name for name in TRANSFORMERS
                if getattr(pipe, name, None) is not None and (path / name).is_dir()}
    return {"transformer": path}


def live_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's checkpoint tensors by checkpoint name (PEFT wrapping undone)."""
    out = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        if any(marker in key for marker in PEFT_MARKERS):
            continue
        out[key.replace(".base_layer.", ".")] = tensor
    return out


def _headers(folder: Path) -> dict[str, tuple[Path, list[int]]]:
    """Tensor name -> (file, shape), read from the safetensors headers only."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidRequest(f"'{folder}' has no .safetensors files", param="path")
    found: dict[str, tuple[Path, list[int]]] = {}
    for file in files:
        try:
            with safe_open(str(file), "pt") as handle:
                for key in handle.keys():
                    found[key] = (file, list(handle.get_slice(key).get_shape()))
        except Exception as exc:  # a truncated or foreign file
            raise InvalidRequest(f"cannot read '{file}': {_first_line(exc)}",
                                 param="path") from None
    return found


def check_shapes(live: dict[str, torch.Tensor], new: dict[str, tuple[Path, list[int]]],
                 folder: Path, component: str) -> None:
    """InvalidRequest naming the first tensor (in model order) that does not match."""
    for key, tensor in live.items():
        if key not in new:
            raise InvalidRequest(f"{component} tensor '{key}' is missing from '{folder}'",
                                 param="path")
        if list(tensor.shape) != new[key][1]:
            raise InvalidRequest(
                f"{component} tensor '{key}' has shape {new[key][1]} in '{folder}' but "
                f"{list(tensor.shape)} in the model", param="path")
    extra = sorted(set(new) - set(live))
    if extra:
        raise InvalidRequest(f"{component} tensor '{extra[0]}' in '{folder}' is not in the model",
                             param="path")


def update_weights(pipe: Any, path: str) -> dict[str, Any]:
    """Validate every component's shapes, read every new tensor (host memory: one copy of the
    new weights), then copy them in place: a file that fails to read changes nothing."""
    plan = []
    for component, folder in _component_dirs(pipe, Path(path)).items():
        live = live_tensors(getattr(pipe, component))
        new = _headers(folder)
        check_shapes(live, new, folder, component)
        plan.append((component, live, _read_all(new)))
    counts = {}
    with torch.no_grad():
        for component, live, staged in plan:
            for key, tensor in staged.items():
                live[key].copy_(tensor)
            counts[component] = len(staged)
    return {"path": path, "tensors": counts}


def _read_all(new: dict[str, tuple[Path, list[int]]]) -> dict[str, torch.Tensor]:
    """Every tensor of `new`, read on the host; InvalidRequest naming the first unreadable one."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for key, (file, _) in new.items():
        by_file.setdefault(file, []).append(key)
    staged = {}
    for file, keys in by_file.items():
        with safe_open(str(file), "pt") as handle:
            for key in keys:
                try:
                    staged[key] = handle.get_tensor(key)
                except Exception as exc:  # a truncated or corrupt tensor body
                    raise InvalidRequest(f"cannot read tensor '{key}' from '{file}': "
                                         f"{_first_line(exc)}", param="path") from None
    return staged


# --------------------------------------------------------------------------- memory


def parameter_bytes(pipe: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(pipe))


def _tensors(pipe: Any) -> Iterator[torch.Tensor]:
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            yield from component.parameters()
            yield from component.buffers()


def move_pipeline(pipe: Any, device: str | torch.device) -> None:
    """Every module of the pipeline to `device`; frees the accelerator's cache after."""
    pipe.to(device)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
