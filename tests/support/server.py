"""Start real `worldserve serve` processes for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "WORLDSERVE_TORCH_THREADS": "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def dev_models_dir() -> Path:
    from worldserve import envs

    return envs.dev_models_dir()


class ServerProcess:
    """One `python -m worldserve serve` child with its own port, output dir and log file."""

    def __init__(self, workdir: Path, config: dict[str, Any] | None = None,
                 args: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{self.port}.log"
        config = dict(config or {})
        generation = config.setdefault("stages", {}).setdefault("generation", {})
        generation.setdefault("output_dir", str(workdir / "outputs"))
        if "--model-path" not in (args or []):
            # The suite's servers default to the Wan dev model (what these tests were written
            # for); Cosmos3, the product default, is tested with an explicit model path.
            generation.setdefault("model_path", str(dev_models_dir() / "wan"))
            # and the reasoner stage to the Qwen2.5-VL dev reasoner (`worldserve serve`
            # alone serves the Cosmos3 dev directory's reasoner: tested explicitly).
            reasoner = config["stages"].setdefault("reasoner", {})
            if reasoner.get("backend") != "fake":
                reasoner.setdefault("model_path", str(dev_models_dir() / "reasoner"))
        self.config_path = workdir / f"config-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "worldserve", "serve", "--port", str(self.port),
               "--config", str(self.config_path), *(args or [])]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=base_env(**(env or {})))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout_s: float = 120.0,
                     ok: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if ok(httpx.get(f"{self.base_url}/health", timeout=2)):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not healthy after {timeout_s} s:\n{self.log()}")

    def stage_pids(self) -> dict[str, int]:
        info = httpx.get(f"{self.base_url}/admin/server_info", timeout=5).json()
        return {name: stage["pid"] for name, stage in info["stages"].items()}

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
