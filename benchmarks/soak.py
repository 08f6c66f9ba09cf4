"""Soak: a bounded mixed load on the dev Cosmos3 default for a long time, with stages killed.

    .venv/bin/python benchmarks/soak.py [--duration 1800] [--clients 6] [--kill-every 240]
        [--sample-every 10] [--plot docs/soak.png]

Starts `worldserve serve` as a user would (no model path: the dev Cosmos3 generator and
reasoner, the dev causal realtime model) with output retention on (`--output-ttl`), then
`--clients` loops mix: images, videos with sound, Cosmos3 actions, live reasoning sessions
over the WebSocket and over REST, realtime sessions, chat, hostile bodies from the hostile
suite, deletes of running video jobs, and clients that disconnect mid-request. Every
`--kill-every` seconds a non-critical stage (reasoner, then realtime, ...) is SIGKILLed; the
supervisor restarts it (runtime/restart.py). `benchmarks/soak_probe.py` samples the server
every `--sample-every` seconds.

Prints one JSON line: requests by kind and status; video jobs accepted vs terminal (none lost);
5xx answers to client input (hostile bodies; any 500) and 503s without Retry-After (each must
be 0); 503s seen while a killed stage restarted; RSS and fd slopes over the last half per
process (MB/h with the standard error of the fit); the output dir's size under retention;
stage restarts; a clean SIGTERM at the end. Writes the plot (matplotlib, the dev extra).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness, soak_load  # noqa: E402
from benchmarks.soak_probe import Probe, plot, verdicts  # noqa: E402
from tests.support.server import base_env, free_port  # noqa: E402

KILLABLE = ("reasoner", "realtime")


class Tally:
    """Answers by kind and status, and what must never happen."""

    def __init__(self) -> None:
        self.by_kind: dict[str, Counter] = defaultdict(Counter)
        self.violations: list[str] = []
        self.jobs: list[str] = []
        self.restarting: set[str] = set()
        self.restart_503 = 0

    def record(self, kind: str, status: int | str, response: httpx.Response | None = None,
               stage: str | None = None) -> None:
        self.by_kind[kind][str(status)] += 1
        if status == 500:
            self.violations.append(f"{kind}: 500 {response.text[:200] if response else ''}")
        if status == 503 and response is not None and "retry-after" not in response.headers:
            self.violations.append(f"{kind}: 503 without Retry-After")
        if status == 503 and stage in self.restarting:
            self.restart_503 += 1

    def client_input(self, kind: str, response: httpx.Response, stage: str | None) -> None:
        """Hostile input: a 4xx, or a 503 while its stage restarts; any other 5xx is a bug."""
        self.record(kind, response.status_code, response, stage)
        status = response.status_code
        if status >= 500 and status != 500 and not (status == 503 and stage in self.restarting):
            self.violations.append(f"{kind} {response.request.url.path}: {status} "
                                   f"{response.text[:200]}")


def start_server(workdir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(workdir / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worldserve", "serve", "--port", str(port),
         "--output-dir", str(workdir / "outputs"), "--output-ttl", str(args.output_ttl),
         "--no-access-log"],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=base_env())
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited: {(workdir / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit("server not healthy after 600 s")


async def killer(base: str, tally: Tally, every_s: float, stop_at: float,
                 kills: list[tuple[float, str]], probe: Probe) -> list[dict[str, Any]]:
    """SIGKILL reasoner, realtime, reasoner, ... every `every_s`; time each restart."""
    restarts = []
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        for index in range(10**6):
            if time.monotonic() + every_s > stop_at:
                return restarts
            await asyncio.sleep(every_s)
            stage = KILLABLE[index % len(KILLABLE)]
            pid = (await http.get("/admin/server_info")).json()["stages"][stage]["pid"]
            tally.restarting.add(stage)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            kills.append((killed - probe.started_s, stage))
            while not await restarted(http, stage, pid):
                await asyncio.sleep(0.5)
            restarts.append({"stage": stage, "back_after_s": round(time.monotonic() - killed, 1)})
            await asyncio.sleep(2.0)  # answers already in flight during the restart
            tally.restarting.discard(stage)
    return restarts


async def restarted(http: httpx.AsyncClient, stage: str, old_pid: int) -> bool:
    """The stage runs under a new pid and the server is healthy again."""
    try:
        info = (await http.get("/admin/server_info")).json()["stages"][stage]
        return info["pid"] != old_pid and (await http.get("/health")).status_code == 200
    except (httpx.HTTPError, KeyError, ValueError):
        return False


async def sampler(probe: Probe, every_s: float, stop_at: float) -> None:
    with httpx.Client(timeout=10) as http:
        while time.monotonic() < stop_at:
            await asyncio.to_thread(probe.sample, http)
            await asyncio.sleep(every_s)


async def settle(base: str, ids: list[str], timeout_s: float) -> Counter:
    """Final status of every accepted video job (a deleted job's record is gone: `deleted`)."""
    final: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        while len(final) < len(ids) and time.monotonic() < deadline:
            for job_id in [i for i in ids if i not in final]:
                answer = await http.get(f"/v1/videos/{job_id}")
                status = answer.json()["status"] if answer.status_code == 200 else "deleted"
                if status not in ("queued", "in_progress"):
                    final[job_id] = status
            await asyncio.sleep(1.0)
    return Counter(final.get(i, "not_terminal") for i in ids)


async def soak(args: argparse.Namespace, base: str, probe: Probe) -> dict[str, Any]:
    tally, kills = Tally(), []
    stop_at = time.monotonic() + args.duration
    load = soak_load.Load(base, tally, random.Random(args.seed))
    await load.start()
    workers = [asyncio.create_task(load.client(i, stop_at)) for i in range(args.clients)]
    sampling = asyncio.create_task(sampler(probe, args.sample_every, stop_at))
    restarts = await killer(base, tally, args.kill_every, stop_at, kills, probe)
    await asyncio.wait(workers, timeout=max(1.0, stop_at - time.monotonic()) + args.grace)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, sampling, return_exceptions=True)
    await load.close()
    jobs = await settle(base, tally.jobs, args.job_timeout)
    await asyncio.sleep(2.0)  # the last closes reach the stages
    with httpx.Client(timeout=10) as http:
        await asyncio.to_thread(probe.sample, http)
    return {"tally": tally, "kills": kills, "restarts": restarts, "jobs": jobs}


def report(args: argparse.Namespace, run: dict[str, Any], probe: Probe, rc: int,
           log: str) -> dict[str, Any]:
    tally: Tally = run["tally"]
    jobs: Counter = run["jobs"]
    statuses = Counter()
    for counter in tally.by_kind.values():
        statuses.update(counter)
    terminal = sum(n for s, n in jobs.items() if s != "not_terminal")
    return {
        "duration_s": args.duration, "clients": args.clients,
        "requests": sum(statuses.values()),
        "by_kind": {k: dict(v) for k, v in sorted(tally.by_kind.items())},
        "video_jobs_accepted": len(tally.jobs), "video_jobs_terminal": terminal,
        "video_jobs_by_status": dict(jobs), "nothing_lost": terminal == len(tally.jobs),
        "violations": tally.violations[:20], "num_violations": len(tally.violations),
        "503_while_a_stage_restarted": tally.restart_503,
        "kills": [{"t_s": round(t, 1), "stage": s} for t, s in run["kills"]],
        "restarts": run["restarts"],
        **verdicts(probe.samples),
        "num_samples": len(probe.samples),
        "shutdown_rc": rc, "stage_killed_at_shutdown": "killing it" in log,
        "plot": plot(probe.samples, run["kills"], Path(args.plot)) if args.plot else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--kill-every", type=float, default=240.0)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--output-ttl", type=float, default=120.0)
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--job-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=str(Path(__file__).resolve().parents[1] / "docs"
                                              / "soak.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        workdir = Path(tmp)
        proc, base = start_server(workdir, args)
        probe = Probe(base, proc.pid, workdir / "outputs")
        try:
            run = asyncio.run(soak(args, base, probe))
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
        result = report(args, run, probe, rc, (workdir / "server.log").read_text())
    harness.emit(result, stderr_too=True)


if __name__ == "__main__":
    main()
