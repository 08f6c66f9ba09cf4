"""The soak's server (benchmarks/soak.py): one `worldserve serve` child that the soak may
SIGKILL and start again on the same port and output directory, optionally inside its own mount
namespace where the output directory is a small tmpfs (the disk-full episodes of `--faults`).

The namespace is held by a `sleep` process (`unshare --mount`, or with `--user --map-root-user`
where plain mount rights are missing) so that it and its tmpfs outlive every server run: a
restarted server finds the records and files of the one before. The server is started in it
with `nsenter`; the soak reads and fills the tmpfs from outside through `/proc/<holder>/root`.
After stop, every process still in the namespace is an orphan, and the run and temp folders the
soak gave the server (`WORLDSERVE_RUN_DIR`, `TMPDIR`) and `.partial` outputs are temp files left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.server import base_env, free_port

FILLER_NAME = "soak-filler.bin"


class NamespaceUnavailable(RuntimeError):
    """This machine cannot make a mount namespace with a tmpfs (no root, no user namespaces)."""


class MountNamespace:
    """A process holding a private mount namespace in which `mount_point` is a tmpfs."""

    WAYS = ((["unshare", "--mount", "--propagation", "private"], ["--mount"]),
            (["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"],
             ["--user", "--mount", "--preserve-credentials"]))

    def __init__(self, mount_point: Path, size_mb: int) -> None:
        self.mount_point = mount_point
        mount_point.mkdir(parents=True, exist_ok=True)
        refusals = []
        for unshare, enter in self.WAYS:
            script = (f"mount -t tmpfs -o size={size_mb}m tmpfs '{mount_point}' && echo mounted "
                      "&& exec sleep infinity")
            holder = subprocess.Popen([*unshare, "sh", "-c", script], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            assert holder.stdout is not None
            if holder.stdout.readline().strip() == "mounted":
                self.holder, self.enter = holder, enter
                return
            holder.wait(10)
            refusals.append(f"{' '.join(unshare)}: {holder.stderr.read().strip()[:200]}")
        raise NamespaceUnavailable("cannot make a mount namespace with a tmpfs: "
                                   + "; ".join(refusals))

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["nsenter", f"--target={self.holder.pid}", *self.enter, "--"]

    def view(self, path: Path) -> Path:
        """`path` as the namespace sees it, readable and writable from outside."""
        return Path(f"/proc/{self.holder.pid}/root") / path.relative_to("/")

    def members(self) -> list[int]:
        """Pids of the processes in the namespace, other than its holder."""
        mine = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.holder.pid:
                try:
                    if os.readlink(f"/proc/{entry}/ns/mnt") == mine and not _zombie(int(entry)):
                        pids.append(int(entry))
                except OSError:
                    pass  # gone meanwhile, or not ours to read
        return pids

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait(10)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return not _zombie(pid)


class SoakServer:
    """`worldserve serve` on a fixed port and output dir, killable and restartable."""

    def __init__(self, workdir: Path, serve_args: list[str],
                 namespace: MountNamespace | None = None) -> None:
        self.workdir = workdir
        self.namespace = namespace
        self.output_dir = namespace.mount_point if namespace else workdir / "outputs"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.serve_args = serve_args
        # ipc socket paths must stay under 108 bytes: the run folder is short, in /tmp
        self.run_dir = Path(tempfile.mkdtemp(prefix="soak-run-"))
        self.tmp_dir = workdir / "tmp"
        self.tmp_dir.mkdir(exist_ok=True)
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.pids_seen: set[int] = set()
        self.num_starts = 0

    @property
    def output_view(self) -> Path:
        """The output dir as the soak reads it (through the namespace when there is one)."""
        return self.namespace.view(self.output_dir) if self.namespace else self.output_dir

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 600.0) -> float:
        """Start (or start again) and wait until healthy; the seconds that took."""
        started = time.monotonic()
        cmd = [sys.executable, "-m", "worldserve", "serve", "--port", str(self.port),
               "--output-dir", str(self.output_dir), "--no-access-log", *self.serve_args]
        env = base_env(WORLDSERVE_RUN_DIR=str(self.run_dir), TMPDIR=str(self.tmp_dir))
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start {self.num_starts}\n".encode())
            self.proc = subprocess.Popen([*(self.namespace.prefix() if self.namespace else []),
                                          *cmd], cwd=self.workdir, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        self.num_starts += 1
        self.pids_seen.add(self.proc.pid)
        self._wait_healthy(started + timeout_s)
        return time.monotonic() - started

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: "
                                   f"{self.log()[-3000:]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not healthy in time: {self.log()[-3000:]}")

    def note_pids(self, pids: dict[str, int]) -> None:
        """Remember every stage pid the probe saw (the orphan check looks for each)."""
        self.pids_seen.update(pids.values())

    def kill(self) -> None:
        """SIGKILL the api process (its stages get SIGTERM from the kernel: PDEATHSIG)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s) if self.proc is not None else None
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait; the exit code (None: it had to be SIGKILLed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def leftovers(self, settle_s: float = 10.0) -> dict[str, list[str]]:
        """After stop: processes of any run still alive, and temp files left."""
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and self._orphans():
            time.sleep(0.5)  # SIGTERMed stages finishing their step
        partial = [p.name for p in self.output_view.glob(".*.partial")] \
            if self.output_view.exists() else []
        temp = [str(p) for root in (self.run_dir, self.tmp_dir)
                for p in root.rglob("*") if not _cache(p.relative_to(root))]
        return {"orphan_processes": [_cmdline(p) for p in self._orphans()],
                "temp_files": sorted(temp + partial),
                "caches_in_tmp": sorted(p.name for p in self.tmp_dir.iterdir() if _cache(p))}

    def close(self) -> None:
        """Remove the run folder (after `leftovers` looked into it)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _orphans(self) -> list[int]:
        pids = {p for p in self.pids_seen if alive(p)}
        if self.namespace is not None:
            pids.update(self.namespace.members())
        return sorted(pids)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _cache(relative: Path) -> bool:
    """torch's compile cache folder, made in TMPDIR at import and kept on purpose."""
    return relative.parts[0].startswith("torchinductor_")


def _cmdline(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        text = "?"
    return f"{pid}: {text[:160]}"
