"""A model directory of no supported family fails `worldserve serve` with a message naming what
was found and the families that are supported (models/registry.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.server import base_env


def serve(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldserve", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=120, env=base_env(), cwd=cwd)


def test_unknown_model_directory_fails_startup_naming_the_families(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    config = tmp_path / "c.yaml"
    config.write_text("stages:\n  reasoner: {enabled: false}\n  realtime: {enabled: false}\n")
    done = serve("--config", str(config), "--model-path", str(model), cwd=tmp_path)
    assert done.returncode == 1
    assert "stage 'generation' failed to start" in done.stderr
    assert "model_type='llama'" in done.stderr
    assert "supported generation families: cosmos3, wan" in done.stderr
    assert "Traceback" not in done.stderr
