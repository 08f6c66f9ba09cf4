"""`worldserve serve` with a generation attention backend this machine cannot run (or a name
diffusers does not know) exits 1 at startup with the reason, never at the first request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import base_env

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def serve(config: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldserve", "serve", "--port", "0",
                           "--config", str(config), *flags],
                          capture_output=True, text=True, timeout=180, env=base_env(), cwd=cwd)


def write_config(tmp_path: Path, model: Path, backend: str | None) -> Path:
    config = tmp_path / "c.yaml"
    setting = f"    attention_backend: {backend}\n" if backend else ""
    config.write_text("stages:\n  reasoner: {enabled: false}\n  realtime: {enabled: false}\n"
                      f"  generation:\n    model_path: {model}\n{setting}")
    return config


@pytest.mark.parametrize(("yaml_backend", "flags"), [("flash", ()),
                                                      (None, ("--attention-backend", "flash"))],
                         ids=["yaml", "flag"])
def test_unrunnable_backend_fails_startup_naming_the_missing_package(
        tmp_path, cosmos3_dir, yaml_backend, flags):
    done = serve(write_config(tmp_path, cosmos3_dir, yaml_backend), tmp_path, *flags)
    assert done.returncode == 1
    assert "stage 'generation' failed to start" in done.stderr
    assert "attention_backend 'flash' cannot run here" in done.stderr
    assert "flash-attn" in done.stderr and "Traceback" not in done.stderr


def test_unknown_backend_is_a_config_error_listing_the_choices(tmp_path, cosmos3_dir):
    done = serve(write_config(tmp_path, cosmos3_dir, "fastest"), tmp_path)
    assert done.returncode != 0
    assert "'fastest' is not a diffusers attention backend" in done.stderr
    assert "_flash_3" in done.stderr and "Traceback" not in done.stderr
