"""LoRA adapters on a loaded diffusers pipeline, shared by the diffusers families.

`LoraAdapters`: LoRA adapters (diffusers / PEFT layout) loaded into the pipeline's
transformer(s) by name, and the one selection of adapters active for the next forward. The
transformers are diffusers `PeftAdapterMixin`s (`load_lora_adapter`, `set_adapters`,
`delete_adapters`); LoRA needs the `peft` package (the `lora` extra). The runner side is
`DiffusersAdminOps` (levers/diffusers_admin.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worldserve.errors import Conflict, InvalidRequest, NotSupported

LORA_WEIGHT_NAMES = ("pytorch_lora_weights.safetensors", "adapter_model.safetensors")
ADAPTER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch: `$` would let a final "\n" in
TRANSFORMERS = ("transformer", "transformer_2")
# Keys PEFT adds to a wrapped module; the base weight moves under `base_layer`.
PEFT_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_", ".lora_magnitude_vector.")

# One active adapter selection: ((name, scale), ...); () = the base model.
Selection = tuple[tuple[str, float], ...]


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def path_kind(path: Path, what: str) -> str:
    """"file", "dir" or "missing"; InvalidRequest for a path the OS refuses (NUL, too long)."""
    try:
        if path.is_file():
            return "file"
        return "dir" if path.is_dir() else "missing"
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{what} path {str(path)[:200]!r} is not usable: "
                             f"{first_line(exc)}", param="path") from None


def lora_file(path: Path) -> Path:
    """The adapter's weight file: the file itself, or the known name (or only .safetensors)
    inside a directory. Raises InvalidRequest naming what is wrong."""
    kind = path_kind(path, "LoRA")
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
                                     f"{first_line(exc)}", param="path") from None
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
