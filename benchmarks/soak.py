"""Soak: a bounded mixed load on the dev Cosmos3 default for a long time, with faults.

    .venv/bin/python benchmarks/soak.py [--duration 1800] [--clients 6] [--kill-every 240]
        [--sample-every 10] [--plot docs/soak.png]
    .venv/bin/python benchmarks/soak.py --faults [--fault-every 150] [--disk-mb 64] [--seed 0]

Starts `worldserve serve` as a user would (no model path: the dev Cosmos3 generator and
reasoner, the dev causal realtime model) with output retention on (`--output-ttl`), then
`--clients` loops mix: images, videos with sound, Cosmos3 actions, live reasoning sessions
over the WebSocket and over REST, realtime sessions, chat, hostile bodies from the hostile
suite, deletes of running video jobs, and clients that disconnect mid-request. Every
`--kill-every` seconds a non-critical stage (reasoner, then realtime, ...) is SIGKILLed; the
supervisor restarts it (runtime/restart.py). `benchmarks/soak_probe.py` samples the server
every `--sample-every` seconds.

`--faults` (benchmarks/soak_faults.py, soak_hostile.py, soak_server.py) instead runs the server
in its own mount namespace with a `--disk-mb` tmpfs as its output directory and, at times drawn
from `--seed` (about one fault per `--fault-every` seconds, each kind once per cycle): SIGKILLs
each stage process, SIGKILLs the api and starts it again on the same port and output dir,
fills the disk for `--disk-hold` seconds; the clients add uploads, SSE streams and WebSockets
dropped midway, and msgpack / JSON bombs, images declaring huge dimensions and videos declaring
huge frame counts. With `--generation-parallel cfg=2` (any layout of docs/parallel.md) the
generation stage is a rank group and a peer rank's SIGKILL (`kill:rank`) is one more kind.

Prints one JSON line: requests by kind and status; every accepted video job's final state
(none lost, none stuck live); 5xx and unanswered requests by cause, /health by fault window,
and the violations among them (soak_tally.py); RSS and fd slopes over the last half per process
(MB/h with the standard error of the fit); the output dir's size under retention; orphan
processes and temp files after the final SIGTERM. Writes the plot (matplotlib, the dev extra).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness, soak_load  # noqa: E402
from benchmarks.soak_faults import KINDS, RANK_KILL, Injector, JobWatch, plan  # noqa: E402
from benchmarks.soak_hostile import FaultLoad  # noqa: E402
from benchmarks.soak_probe import Probe, plot, verdicts, write_samples  # noqa: E402
from benchmarks.soak_server import MountNamespace, SoakServer  # noqa: E402
from benchmarks.soak_tally import Tally  # noqa: E402

KILLABLE = ("reasoner", "realtime")


async def killer(injector: Injector, every_s: float, started: float, stop_at: float) -> None:
    """Without --faults: SIGKILL reasoner, realtime, reasoner, ... every `every_s`."""
    kills = [(every_s * (i + 1), f"kill:{KILLABLE[i % len(KILLABLE)]}")
             for i in range(int((stop_at - started) / every_s))]
    await injector.run(kills, started)


async def sampler(server: SoakServer, probe: Probe, every_s: float,
                  keep_going: Callable[[], bool]) -> None:
    with httpx.Client(timeout=10) as http:
        while keep_going():
            probe.api_pid = server.pid  # a new one after each api restart
            sample = await asyncio.to_thread(probe.sample, http)
            server.note_pids(sample.pids)
            await asyncio.sleep(every_s)


async def health(base: str, tally: Tally, keep_going: Callable[[], bool]) -> None:
    """/health once a second through the run, answers by the fault in progress."""
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        while keep_going():
            try:
                tally.health_answer((await http.get("/health")).status_code)
            except httpx.HTTPError as exc:
                tally.health_answer(type(exc).__name__)
            await asyncio.sleep(1.0)


async def soak(args: argparse.Namespace, server: SoakServer, probe: Probe) -> dict[str, Any]:
    tally = Tally()
    watch = tally.watch = JobWatch(server.base)
    started = probe.started_s = time.monotonic()
    stop_at = started + args.duration
    injector = Injector(server, tally, args.disk_hold)
    if args.faults:
        faulting = asyncio.create_task(
            injector.run(plan(args.seed, args.duration, args.fault_every, args.kinds), started))
    else:
        faulting = asyncio.create_task(
            killer(injector, args.kill_every, started, stop_at))

    def keep_going() -> bool:  # the load lasts until the last fault is over
        return time.monotonic() < stop_at or not faulting.done()

    load = (FaultLoad if args.faults else soak_load.Load)(
        server.base, tally, random.Random(args.seed))
    await load.start()
    workers = [asyncio.create_task(load.client(i, keep_going)) for i in range(args.clients)]
    watchers = [asyncio.create_task(sampler(server, probe, args.sample_every, keep_going)),
                asyncio.create_task(health(server.base, tally, keep_going)),
                asyncio.create_task(watch.run(keep_going))]
    await faulting  # raises if a fault could not be carried out (the server did not come back)
    await asyncio.wait(workers, timeout=max(1.0, stop_at - time.monotonic()) + args.grace)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, *watchers, return_exceptions=True)
    await load.close()
    await watch.settle(args.job_timeout)
    await asyncio.sleep(2.0)  # the last closes reach the stages (and the last grace ends)
    with httpx.Client(timeout=10) as http:
        await asyncio.to_thread(probe.sample, http)
        # One probe after every fault is over, whatever the load left for the first second.
        answer = await asyncio.to_thread(http.get, f"{server.base}/health")
        tally.health_answer(answer.status_code)
    kills = [(f["t_s"], f["kind"].split(":")[-1]) for f in injector.done]
    return {"tally": tally, "watch": watch, "faults": injector.done, "kills": kills}


def job_verdicts(watch: JobWatch) -> dict[str, Any]:
    states = watch.by_state()
    stuck = sum(n for s, n in states.items() if s in ("queued", "in_progress"))
    return {"video_jobs_accepted": len(watch.last), "video_jobs_by_state": states,
            "video_jobs_lost": states.get("lost", 0), "video_jobs_stuck": stuck,
            "video_jobs_failed_without_reason": states.get("failed:no_reason", 0),
            "nothing_lost": stuck + states.get("lost", 0) + states.get("failed:no_reason", 0)
            == 0}


def report(args: argparse.Namespace, run: dict[str, Any], probe: Probe, server: SoakServer,
           rc: int | None, leftovers: dict[str, list[str]]) -> dict[str, Any]:
    faults = run["faults"]
    return {
        "duration_s": args.duration, "clients": args.clients, "faults_on": args.faults,
        "seed": args.seed, **run["tally"].summary(), **job_verdicts(run["watch"]),
        "faults_by_kind": dict(sorted(Counter(f["kind"] for f in faults).items())),
        "faults": faults, "api_starts": server.num_starts,
        **verdicts(probe.samples, args.fault_every if args.faults else args.kill_every),
        "num_samples": len(probe.samples),
        "samples": write_samples(probe.samples, Path(args.samples)) if args.samples else None,
        **{k: v[:20] for k, v in leftovers.items()},
        **{f"num_{k}": len(v) for k, v in leftovers.items()},
        "shutdown_rc": rc, "stage_killed_at_shutdown": "killing it" in server.log(),
        "plot": plot(probe.samples, run["kills"], Path(args.plot)) if args.plot else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--kill-every", type=float, default=240.0,
                        help="without --faults: seconds between stage kills")
    parser.add_argument("--faults", action="store_true",
                        help="stage and api kills, disk full, vanishing clients, bombs")
    parser.add_argument("--fault-every", type=float, default=150.0,
                        help="with --faults: about one fault per this many seconds")
    parser.add_argument("--kinds", type=lambda text: tuple(text.split(",")), default=None,
                        help="with --faults: which faults, comma-separated "
                             f"({','.join(KINDS)}, and {RANK_KILL} with a rank group)")
    parser.add_argument("--generation-parallel", default=None,
                        help="the generation stage as a rank group of this layout (cfg=2)")
    parser.add_argument("--disk-mb", type=int, default=64, help="the output tmpfs (--faults)")
    parser.add_argument("--disk-hold", type=float, default=20.0,
                        help="seconds a disk-full episode keeps the disk full")
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--output-ttl", type=float, default=120.0)
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--job-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", default=None,
                        help="JSONL path for the probe's samples (RSS, fds, pids, sizes, "
                             "sessions, queues), to fit other windows later")
    parser.add_argument("--plot", default=None,
                        help="PNG path, '' for none (docs/soak.png, with --faults "
                             "docs/soak-faults.png)")
    args = parser.parse_args(argv)
    if args.kinds is None:
        args.kinds = KINDS + ((RANK_KILL,) if args.generation_parallel else ())
    if RANK_KILL in args.kinds and not args.generation_parallel:
        parser.error(f"{RANK_KILL} needs --generation-parallel")
    if args.plot is None:
        docs = Path(__file__).resolve().parents[1] / "docs"
        args.plot = str(docs / ("soak-faults.png" if args.faults else "soak.png"))
    return args


def run_soak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The whole soak in `workdir`: start, load (and faults), stop, look for leftovers."""
    namespace = MountNamespace(workdir / "outputs", args.disk_mb) if args.faults else None
    parallel = ["--generation-parallel", args.generation_parallel] \
        if args.generation_parallel else []
    server = SoakServer(workdir, ["--output-ttl", str(args.output_ttl), *parallel], namespace)
    try:
        server.start()
        probe = Probe(server.base, server.pid, server.output_view)
        try:
            run = asyncio.run(soak(args, server, probe))
        finally:
            rc = server.stop()
            leftovers = server.leftovers()
        run["tally"].server_log(server.log())
        return report(args, run, probe, server, rc, leftovers)
    finally:
        server.close()
        if namespace is not None:
            namespace.close()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = run_soak(args, Path(tmp))
    harness.emit(result, stderr_too=True)


if __name__ == "__main__":
    main()
