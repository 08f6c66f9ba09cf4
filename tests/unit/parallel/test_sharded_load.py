"""Loading a Cosmos3 generator with sharded blocks reads each rank's rows straight from the
checkpoint (single file or an index of several files): the ranks' rows put together are the
checkpoint's tensors, every tensor outside the blocks loads whole, and no rank builds the
full transformer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from worldserve.levers.parallel.mesh import GroupHandle
from worldserve.levers.parallel.shard import BUFFER_PREFIX
from worldserve.models.cosmos3.parallel_load import load_sharded_pipeline
from worldserve.models.types import ModelLoadError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def split_into_two_files(model_dir, target):
    """The same checkpoint with its transformer weights in two files and an index."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, target)
    folder = target / "transformer"
    weights = load_file(folder / "diffusion_pytorch_model.safetensors")
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    names = sorted(weights)
    halves = {"part-1.safetensors": names[::2], "part-2.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: weights[k] for k in keys}, str(folder / file))
    index = {"weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    return weights


def test_the_ranks_rows_rebuild_the_checkpoint(cosmos3_dir, tmp_path):
    weights = split_into_two_files(cosmos3_dir, tmp_path / "split")
    torch.set_num_threads(1)
    ranks = [load_sharded_pipeline(tmp_path / "split", "float32", "cpu",
                                   GroupHandle(ranks=[0, 1], index=i)) for i in range(2)]
    for name, tensor in weights.items():
        if name.startswith("layers."):
            continue
        for pipe, _ in ranks:  # outside the blocks: whole on every rank
            assert torch.equal(pipe.transformer.get_parameter(name), tensor), name
    for layer in range(len(ranks[0][0].transformer.layers)):
        blocks = [shards.blocks[layer] for _, shards in ranks]
        for dtype, slots in blocks[0].slots.items():
            buffer = BUFFER_PREFIX + str(dtype).removeprefix("torch.")
            local = [getattr(b.block, buffer) for b in blocks]  # each rank's rows
            for slot, name in zip(slots, (n for n, _ in blocks[0].block.named_parameters())):
                rows = torch.cat([lb[slot.offset:slot.offset + slot.numel] for lb in local])
                full = weights[f"layers.{layer}.{name}"]
                assert torch.equal(rows[: full.numel()].reshape(full.shape), full), name
    assert all(p.numel() == 0 for p in ranks[0][0].transformer.layers.parameters())


def test_quantised_checkpoints_are_refused_for_sharding(cosmos3_dir, tmp_path):
    quantised = tmp_path / "fp8"
    shutil.copytree(cosmos3_dir, quantised)
    config = json.loads((quantised / "transformer" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_type": "FP8"}
    (quantised / "transformer" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="sharded weights .* need an unquantised"):
        load_sharded_pipeline(quantised, "float32", "cpu", GroupHandle(ranks=[0, 1], index=0))
