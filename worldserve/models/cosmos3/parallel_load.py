"""Load a Cosmos3 generator whose decoder blocks are sharded over a group of ranks, without
ever holding the whole transformer on one rank: the transformer is built on the meta device,
every tensor outside the blocks is read whole (embeddings, heads, norms: ~3 % of the
weights), and each block tensor only for this rank's rows (safetensors reads a row range
without reading the rest). The other components load as usual.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from worldserve.levers.parallel.mesh import GroupHandle
from worldserve.levers.parallel.shard import RowReader, ShardedBlocks
from worldserve.models.types import ModelLoadError

WEIGHTS = "diffusion_pytorch_model.safetensors"
BLOCKS = "layers"


def load_sharded_pipeline(model_dir: Path, dtype: str, device: str, handle: GroupHandle, *,
                          safety_checker: bool = False) -> tuple[Any, ShardedBlocks]:
    """(pipeline, its sharded blocks), the pipeline on `device`."""
    from diffusers import Cosmos3OmniPipeline

    from worldserve.models.common import require_local_dir, resolve_dtype
    from worldserve.models.cosmos3 import loader

    path = require_local_dir(model_dir)
    loader.check_layout(path)
    quant = loader.detect_quantisation(path)
    if quant is not None:
        raise ModelLoadError(f"{path}: sharded weights (stages.generation.parallel.shard) need "
                             f"an unquantised checkpoint; this one is {quant.method} "
                             f"({quant.evidence})")
    loader.check_safety_checker(safety_checker)
    torch_dtype = resolve_dtype(dtype)
    transformer, shards = _sharded_transformer(path / "transformer", torch_dtype,
                                               torch.device(device), handle)
    try:
        pipe = Cosmos3OmniPipeline.from_pretrained(
            path, transformer=transformer, dtype=torch_dtype, local_files_only=True,
            enable_safety_checker=safety_checker)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{path}: cannot load the Cosmos3 generator: {exc}") from exc
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device), shards


def _sharded_transformer(folder: Path, dtype: torch.dtype, device: torch.device,
                         handle: GroupHandle) -> tuple[Any, ShardedBlocks]:
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    config = Cosmos3OmniTransformer.load_config(folder)
    with init_empty_weights():
        transformer = Cosmos3OmniTransformer.from_config(config)
    keep_fp32 = tuple(transformer._keep_in_fp32_modules or ())
    with ExitStack() as stack:
        files = _open_weights(folder, stack)
        for name, param in list(transformer.named_parameters()):
            if name.split(".")[0] == BLOCKS:
                continue
            if name not in files:
                raise ModelLoadError(f"{folder}: the checkpoint has no weights for {name}")
            kind = torch.float32 if any(m in name.split(".") for m in keep_fp32) else dtype
            _set_parameter(transformer, name, files[name].get_tensor(name).to(device, kind))
        readers = [_block_reader(files, f"{BLOCKS}.{i}.", dtype, device)
                   for i in range(len(transformer.layers))]
        shards = ShardedBlocks.from_reader(list(transformer.layers), handle, readers,
                                           dtype=dtype, device=device)
    return transformer.eval(), shards


def _open_weights(folder: Path, stack: ExitStack) -> dict[str, Any]:
    """Tensor name -> the open safetensors file holding it (single file or sharded index)."""
    from safetensors import safe_open

    index = folder / f"{WEIGHTS}.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    elif (folder / WEIGHTS).is_file():
        weight_map, names = None, [WEIGHTS]
    else:
        raise ModelLoadError(f"{folder}: no {WEIGHTS} (or its .index.json)")
    handles = {n: stack.enter_context(safe_open(str(folder / n), "pt")) for n in names}
    if weight_map is not None:
        return {key: handles[file] for key, file in weight_map.items()}
    only = handles[WEIGHTS]
    return {key: only for key in only.keys()}


def _block_reader(files: dict[str, Any], prefix: str, dtype: torch.dtype,
                  device: torch.device) -> RowReader:
    def read(name: str, first: int, end: int) -> torch.Tensor:
        key = prefix + name
        if key not in files:
            raise ModelLoadError(f"the checkpoint has no weights for {key}")
        part = files[key].get_slice(key)
        rows = part[first:end] if part.get_shape() else part[...].reshape(1)[first:end]
        return rows.to(device, dtype)

    return read


def _set_parameter(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)

