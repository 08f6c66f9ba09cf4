"""The static decode step converts its rotation helper to the model's device and dtype once,
not at every token (on CUDA each copy was a host-to-device transfer, a sync per token). The
tokens are unchanged: tests/unit/reasoner/test_decode_paths.py holds the static step equal to
transformers' forward."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from worldserve.models import registry


class Copies(TorchDispatchMode):
    """The storages that `_to_copy` (`.to(...)`) read."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_to_copy":
            self.sources.add(args[0].untyped_storage().data_ptr())
        return func(*args, **(kwargs or {}))


def test_the_rotation_helper_is_converted_once(tiny_dir):
    runner = registry.load_runner("reasoner", tiny_dir, dtype="bfloat16")
    assert runner.configure_decode(True) == "static"
    kv = runner.new_kv()
    runner.forward(kv, [5, 9, 13, 2])
    runner.forward_decode_batch([kv], [[3]])  # the first step converts it
    rotate = runner.static.rotate
    assert rotate.dtype == torch.bfloat16 and rotate.device == runner.device
    with Copies() as copies:
        runner.forward_decode_batch([kv], [[4]])
    assert runner.static.rotate is rotate
    assert rotate.untyped_storage().data_ptr() not in copies.sources
