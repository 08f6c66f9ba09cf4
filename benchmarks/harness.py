"""What every benchmark shares: the dev checkpoints, a real server, timing, the machine's facts
and the one JSON line a benchmark prints.

A benchmark is a short script on this module:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root
    from benchmarks import harness

    with harness.server(workdir, {"stages": harness.default_stages()}) as server:
        _, seconds = harness.timed(httpx.post, server.base_url + "/v1/images/generations", ...)
    harness.emit({"image_s": seconds})

`emit` adds `machine` (CPU count, load average, Python and torch versions, GPU name) to the
line, so a figure never travels without the machine that produced it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.server import ServerProcess
from worldserve import envs
from worldserve.cli import DEV_STAGE_DEFAULTS

REPO_ROOT = Path(__file__).resolve().parents[1]


def dev_models_dir(quiet: bool = False) -> Path:
    """The dev checkpoints, built first if missing (a child process, as `worldserve serve`)."""
    root = envs.dev_models_dir()
    subprocess.run([sys.executable, "-m", "worldserve", "dev-models", "build", str(root)],
                   check=True, stdout=subprocess.DEVNULL if quiet else None)
    return root


def dev_model(name: str, quiet: bool = False) -> Path:
    """One dev checkpoint directory: `generation` (Cosmos3), `wan`, `reasoner`, `realtime`..."""
    return dev_models_dir(quiet) / name


def default_stages() -> dict[str, Any]:
    """The `stages` config of `make serve` (every stage on its dev checkpoint)."""
    root = dev_models_dir(quiet=True)
    return {name: {"model_path": str(root / folder)} for name, folder in DEV_STAGE_DEFAULTS.items()}


def start_server(workdir: Path, config: dict[str, Any] | None = None, *,
                 args: list[str] | None = None, threads: int | None = None,
                 env: dict[str, str] | None = None, timeout_s: float = 300.0) -> ServerProcess:
    """A `worldserve serve` child on a free port, healthy; `threads` sets the torch threads of
    each stage process (the test servers' default is 1)."""
    env = dict(env or {})
    if threads is not None:
        env["WORLDSERVE_TORCH_THREADS"] = str(threads)
    server = ServerProcess(workdir, config, args=args, env=env)
    try:
        server.wait_healthy(timeout_s=timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@contextmanager
def server(workdir: Path, config: dict[str, Any] | None = None, **kwargs: Any
           ) -> Iterator[ServerProcess]:
    """`start_server`, stopped (SIGTERM) on the way out."""
    process = start_server(workdir, config, **kwargs)
    try:
        yield process
    finally:
        process.stop()


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """fn's result and its wall seconds."""
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


def ms_since(started: float) -> float:
    """Milliseconds since a `time.perf_counter()` reading."""
    return (time.perf_counter() - started) * 1000


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (q in [0, 1]): a value that was measured."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def p95(values: list[float]) -> float:
    """The 95th percentile, linearly interpolated (numpy's default, which the figures used)."""
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[94]


def median(values: list[float]) -> float:
    return statistics.median(values)


def rss_mb(pid: int) -> float | None:
    """A process's resident memory in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """The facts a figure needs beside it; torch's only when the benchmark imported torch."""
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        "platform": platform.platform(terse=True), "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
    return facts


def rounded(result: dict[str, Any], digits: int = 3) -> dict[str, Any]:
    """Floats at the top level rounded (a JSON line meant for a person and a table)."""
    return {k: round(v, digits) if isinstance(v, float) else v for k, v in result.items()}


def emit(result: dict[str, Any], *, with_machine: bool = True, stderr_too: bool = False) -> None:
    """Print a benchmark's one JSON line (flushed), with `machine` unless the result has it;
    `stderr_too` also pretty-prints it on stderr for a person watching."""
    line = dict(result)
    if with_machine:
        line.setdefault("machine", machine())
    if stderr_too:
        print(json.dumps(line, indent=2), file=sys.stderr)
    print(json.dumps(line), flush=True)
