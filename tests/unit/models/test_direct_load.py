"""Generators load straight onto their device (diffusers `device_map`), not through a full
host copy and a `.to(device)`. On CUDA this is unverified here (no GPU): the tests check what
the loader asks diffusers for, and that the device_map path loads the same weights on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from worldserve.models.common import direct_device_map


@pytest.mark.parametrize(("device", "expected"), [
    ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:0", "cuda"), ("cuda:1", None)])
def test_device_map_for_each_device(device: str, expected: str | None) -> None:
    assert direct_device_map(device) == expected


@pytest.mark.parametrize(("device", "expected"), [
    ("cuda:2", "cuda"), ("cuda", "cuda"), ("cuda:0", None), ("cuda:1", None)])
def test_a_peer_rank_loads_straight_to_its_current_device(monkeypatch, device: str,
                                                          expected: str | None) -> None:
    """Rank 2 after `torch.cuda.set_device("cuda:2")`: its own device is the current one, so
    diffusers' "cuda" map loads there (not a full host copy); cuda:0 is not this rank's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert direct_device_map(device) == expected


class Recorder:
    """Stands in for `Cosmos3OmniPipeline.from_pretrained`'s result; records `.to` calls."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}
        self.moves: list[str] = []

    def set_progress_bar_config(self, **_: Any) -> None:
        pass

    def to(self, device: str) -> "Recorder":
        self.moves.append(device)
        return self


@pytest.mark.parametrize(("device", "device_map"), [("cuda:0", "cuda"), ("cuda:1", None)])
def test_the_cosmos3_loader_asks_diffusers_for_the_device(
        monkeypatch: pytest.MonkeyPatch, dev_models_dir: Path, device: str,
        device_map: str | None) -> None:
    import diffusers

    from worldserve.models.cosmos3 import loader

    recorder = Recorder()

    def from_pretrained(path: Path, **kwargs: Any) -> Recorder:
        recorder.kwargs = kwargs
        return recorder

    monkeypatch.setattr(diffusers.Cosmos3OmniPipeline, "from_pretrained", from_pretrained)
    loader.load_pipeline(dev_models_dir / "generation", "bfloat16", device)
    assert recorder.kwargs["device_map"] == device_map
    assert recorder.kwargs["dtype"] == torch.bfloat16
    assert recorder.moves == [device]  # a no-op move where device_map placed everything


def test_device_map_loading_equals_the_plain_load(dev_models_dir: Path) -> None:
    from diffusers import Cosmos3OmniPipeline

    from worldserve.models.cosmos3.loader import load_pipeline

    path = dev_models_dir / "generation"
    mapped = load_pipeline(path, "float32", "cpu")
    assert mapped.hf_device_map == "cpu"  # diffusers took the device_map path
    plain = Cosmos3OmniPipeline.from_pretrained(path, dtype=torch.float32,
                                                local_files_only=True)
    for name in ("transformer", "vae", "sound_tokenizer"):
        ours, theirs = getattr(mapped, name).state_dict(), getattr(plain, name).state_dict()
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert torch.equal(value, theirs[key]), (name, key)
