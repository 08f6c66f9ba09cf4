"""A Cosmos3 denoising step reads neither its timestep nor its fixed action mask back from the
device: the timesteps are read to the host once per row when it is prepared (a `t.item()` per
forward was a blocking device-to-host sync on CUDA, two per CFG step), and whether any action is
noisy is decided once too. The frames are unchanged: tests/unit/models/test_cosmos3.py holds
every task equal to the pipeline's own `__call__`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.unit.models.test_cosmos3 import params, png
from worldserve.ipc.messages import ActionCondition
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class Reads(TorchDispatchMode):
    """The storages each aten op read (by op name); `_local_scalar_dense` is a host read
    (`.item()`, `bool()`, `float()` of a tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[str, set[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        for arg in args:
            if isinstance(arg, torch.Tensor):
                self.storages.setdefault(name, set()).add(arg.untyped_storage().data_ptr())
        return func(*args, **(kwargs or {}))


def test_a_step_reads_no_timestep_and_no_action_mask_to_the_host(cosmos3_dir):
    torch.set_num_threads(1)
    runner = registry.load_runner("generation", cosmos3_dir)
    action = ActionCondition(mode="policy", chunk_size=4, domain_name="agibotworld",
                             resolution_tier=256)
    p = params(action=action, condition_images=[png(56, 40)], guidance_scale=4.0,
               num_inference_steps=3)
    state = runner.prepare(["r"], [p], p.seeds)
    row = state.rows[0]
    assert row.action_mask is not None and row.noisy_action
    assert row.host_timesteps == [t.item() for t in row.timesteps]
    runner.denoise_step(state)  # the schedulers find their step index at the first step
    with Reads() as reads:
        runner.denoise_step(state)
    timesteps = row.timesteps.untyped_storage().data_ptr()
    mask = row.action_mask.untyped_storage().data_ptr()
    assert timesteps not in reads.storages.get("_local_scalar_dense", set())
    assert mask not in reads.storages.get("sum", set())
    assert np.isfinite(row.latents.numpy()).all()
