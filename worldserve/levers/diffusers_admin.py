"""Operator operations on a loaded diffusers pipeline, shared by the diffusers families.

- `DiffusersAdminOps`: the runner side of the optional generation-runner capabilities (LoRA
  through `LoraAdapters`, levers/lora.py; weights update; memory release).
- `update_weights`: weights of the same architecture from a directory, shapes checked from the
  safetensors headers before anything touches the live model.
- `move_pipeline`: weights off the device and back (memory release / resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch

from worldserve.errors import InvalidRequest
from worldserve.levers.lora import (
    PEFT_MARKERS,
    TRANSFORMERS,
    LoraAdapters,
    Selection,
    first_line,
    path_kind,
)


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
    if path_kind(path, "weights") != "dir":
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
            raise InvalidRequest(f"cannot read '{file}': {first_line(exc)}",
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
                                         f"{first_line(exc)}", param="path") from None
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
