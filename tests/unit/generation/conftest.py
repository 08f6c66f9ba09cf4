from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.machine import require_module


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.generation.tiny_wan import build_tiny_wan

    return build_tiny_wan(tmp_path_factory.mktemp("tiny-wan") / "generation")


@pytest.fixture(scope="session")
def admin_assets(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """LoRA adapters `a` (attention) and `b` (feed-forward), updated and wrong-shape weights."""
    require_module("peft")
    from tests.unit.generation import admin_fixtures as fx

    root = tmp_path_factory.mktemp("admin-assets")
    return {
        "lora_a": fx.build_lora(tiny_wan_dir, root / "lora_a", 1,
                                ["to_q", "to_k", "to_v", "to_out.0"]),
        "lora_b": fx.build_lora(tiny_wan_dir, root / "lora_b", 2, ["ffn.net.0.proj", "ffn.net.2"]),
        "updated": fx.build_updated_weights(tiny_wan_dir, root / "updated", 3),
        "wrong": fx.build_wrong_weights(tiny_wan_dir, root / "wrong"),
    }
