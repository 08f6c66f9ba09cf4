"""`worldserve serve` with no model paths: which dev checkpoint each stage serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from worldserve import cli
from worldserve.config import ServerConfig


@pytest.fixture
def dev_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dev-models root whose folders are already built (markers present): nothing is built."""
    for name in ("generation", "reasoner", "realtime", "world"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "worldserve_dev.json").write_text("{}")
    monkeypatch.setenv("WORLDSERVE_DEV_MODELS_DIR", str(tmp_path))
    return tmp_path


def _stage_paths(config: ServerConfig) -> dict[str, Path | None]:
    return {name: stage.model_path for name, stage in config.stages.enabled().items()}


def test_generation_and_reasoning_come_from_the_one_trained_cosmos3_dev_directory(
        dev_root: Path) -> None:
    config = ServerConfig.model_validate({"stages": {"realtime": {"enabled": True}}})
    paths = _stage_paths(cli._fill_dev_model_paths(config))
    assert paths["generation"] == dev_root / "world"
    assert paths["reasoner"] == dev_root / "world"
    assert paths["realtime"] == dev_root / "realtime"


def test_configured_paths_and_fake_backends_are_left_alone(dev_root: Path) -> None:
    config = ServerConfig.model_validate({"stages": {
        "reasoner": {"model_path": str(dev_root / "reasoner")},
        "realtime": {"enabled": True, "backend": "fake"},
    }})
    paths = _stage_paths(cli._fill_dev_model_paths(config))
    assert paths["reasoner"] == dev_root / "reasoner"
    assert paths["generation"] == dev_root / "world"
    assert paths["realtime"] is None
