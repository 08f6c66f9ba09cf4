"""`worldserve serve` without `--cluster` never imports Ray; the cluster flags' usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from worldserve.cli import app

SCRIPT = (
    "import sys, worldserve.cli as cli\n"
    "async def no_server(cfg, key): return 0\n"
    "cli._serve = no_server\n"
    "try:\n"
    "    cli.app(['serve', '--config', sys.argv[1]], standalone_mode=False)\n"
    "except SystemExit:\n"
    "    pass\n"
    "assert 'ray' not in sys.modules, 'ray was imported'\n"
    "print('no-ray')\n"
)


def fake_config(tmp_path: Path) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text("stages:\n  generation: {enabled: false}\n  realtime: {enabled: false}\n"
                      f"  reasoner: {{backend: fake, model_path: {tmp_path}}}\n")
    return config


def test_serve_without_cluster_never_imports_ray(tmp_path: Path) -> None:
    """The whole `serve` command path (the server itself stubbed out) leaves Ray unloaded."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(fake_config(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no-ray" in done.stdout, done.stderr


def test_cluster_flags_need_cluster_ray(tmp_path: Path) -> None:
    runner = CliRunner()
    config = str(fake_config(tmp_path))
    alone = runner.invoke(app, ["serve", "--config", config, "--replicas", "reasoner=2"])
    assert alone.exit_code == 2
    assert "--ray-address and --replicas need --cluster ray" in alone.output
    other = runner.invoke(app, ["serve", "--config", config, "--cluster", "k8s"])
    assert other.exit_code == 2 and "--cluster must be 'ray' (got 'k8s')" in other.output
