"""The faults of `benchmarks/soak.py --faults`: a plan drawn from the seed, the injector that
carries it out one fault at a time, and the watch over every accepted video job.

Faults: SIGKILL of each stage process (generation: the server exits by design and the soak
starts it again; reasoner and realtime: the supervisor restarts them), SIGKILL of a peer rank
of the generation stage's rank group when one is configured (`kill:rank`: rank 0 fails the
request in flight naming the rank and starts a new group), SIGKILL of the api process followed
by a start on the same port and output directory, and a disk-full episode (the output tmpfs
filled for `hold_s`, then freed). While a fault lasts, and for `GRACE_S`
after it, the soak's `Tally` knows it (`restarting`, `api_down`, `disk_full`): that is what
tells a documented 503 or 507 from a bug. The grace lingers in the background: a restart of
the api that comes next takes over at once (its window excuses everything a grace would), so
back-to-back faults do not wait for each other's grace.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from benchmarks.soak_server import FILLER_NAME, SoakServer

STAGES = ("generation", "reasoner", "realtime")
KINDS = (*(f"kill:{s}" for s in STAGES), "kill:api", "disk_full")
RANK_KILL = "kill:rank"  # only with a rank group (soak.py --generation-parallel)
SERVER_RESTARTS = ("kill:api", "kill:generation")  # the server exits: started again
GRACE_S = 2.0  # answers already in flight when a fault ends
LIVE = ("queued", "in_progress")


def plan(seed: int, duration_s: float, every_s: float,
         kinds: tuple[str, ...] = KINDS) -> list[tuple[float, str]]:
    """(t_s, kind), sorted: every kind once per cycle of len(kinds) faults, each cycle in a
    seeded order, times uniform over the run (its first and last 5 % left clean)."""
    rng = random.Random(seed)
    count = max(len(kinds), int(duration_s / every_s))
    order: list[str] = []
    while len(order) < count:
        order += rng.sample(kinds, len(kinds))
    times = sorted(rng.uniform(0.05, 0.95) * duration_s for _ in range(count))
    return list(zip(times, order[:count]))


@dataclass
class Injector:
    server: SoakServer
    tally: Any  # soak.Tally
    disk_hold_s: float
    done: list[dict[str, Any]] = field(default_factory=list)
    graces: dict[asyncio.Task, Callable[[], None]] = field(default_factory=dict)

    async def run(self, faults: list[tuple[float, str]], started_s: float) -> None:
        """Each fault at its time. Stage kills and disk-full episodes may overlap; a restart of
        the api waits until every fault in progress has recovered, and holds back the next
        ones. Returns when the last grace is over."""
        running: set[asyncio.Task] = set()
        for t_s, kind in faults:
            await asyncio.sleep(max(0.0, started_s + t_s - time.monotonic()))
            if kind in SERVER_RESTARTS:
                await asyncio.gather(*running)
                await self._timed(kind, started_s)
            else:
                running.add(asyncio.create_task(self._timed(kind, started_s)))
        await asyncio.gather(*running)
        await asyncio.gather(*self.graces)

    def _grace(self, end_fault: Callable[[], None]) -> None:
        """`end_fault` (clearing the Tally's flags) `GRACE_S` from now, or when a restart
        takes over (`_end_graces`), whichever comes first."""

        async def linger() -> None:
            await asyncio.sleep(GRACE_S)
            self.graces.pop(task)()

        task = asyncio.create_task(linger())
        self.graces[task] = end_fault

    def _end_graces(self) -> None:
        """Every grace over now; synchronous, so that the restart's own flags follow with no
        moment between in which an answer would find none."""
        for task in list(self.graces):
            task.cancel()
            self.graces.pop(task)()

    async def _timed(self, kind: str, started_s: float) -> None:
        began = time.monotonic()
        detail = await self._one(kind)
        self.done.append({"t_s": round(began - started_s, 1), "kind": kind,
                          "recovered_after_s": round(time.monotonic() - began, 1), **detail})

    async def _one(self, kind: str) -> dict[str, Any]:
        if kind == "disk_full":
            return await self.disk_full()
        target = kind.split(":", 1)[1]
        if target == "api":
            return await self.restart_api(kill_stage=None)
        if target == "generation":  # critical: the server exits non-zero, by design
            return await self.restart_api(kill_stage="generation")
        if target == "rank":
            return await self.kill_rank()
        return await self.kill_stage(target)

    async def stage_pid(self, stage: str) -> int:
        async with httpx.AsyncClient(base_url=self.server.base, timeout=10) as http:
            return (await http.get("/admin/server_info")).json()["stages"][stage]["pid"]

    async def kill_stage(self, stage: str) -> dict[str, Any]:
        while stage in self.tally.restarting:  # killed a moment ago: not back yet
            await asyncio.sleep(0.5)
        pid = await self.stage_pid(stage)
        self.tally.restarting.add(stage)
        try:
            _sigkill(pid)
            async with httpx.AsyncClient(base_url=self.server.base, timeout=10) as http:
                while not await _restarted(http, stage, pid):
                    await asyncio.sleep(0.5)
        except BaseException:
            self.tally.restarting.discard(stage)
            raise
        self._grace(lambda: self.tally.restarting.discard(stage))
        return {"pid": pid}

    async def generation_info(self) -> dict[str, Any]:
        """The generation stage's /admin/model_info entry; `error` in it when the stage did
        not answer within the route's 5 s (a denoising step on loaded cores can take longer)."""
        async with httpx.AsyncClient(base_url=self.server.base, timeout=30) as http:
            return (await http.get("/admin/model_info")).json()["stages"]["generation"]

    async def rank_group(self, timeout_s: float = 120.0) -> dict[str, Any]:
        """The generation stage's group: `epoch`, `ready` and `pids` by rank (as text)."""
        deadline = time.monotonic() + timeout_s
        while "error" in (info := await self.generation_info()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the generation stage's model_info: {info['error']}")
            await asyncio.sleep(0.5)
        if not info.get("rank_group"):
            raise RuntimeError(f"{RANK_KILL} needs a rank group (--generation-parallel)")
        return info["rank_group"]

    async def kill_rank(self, timeout_s: float = 300.0) -> dict[str, Any]:
        """SIGKILL the highest peer rank; the generation stage counts as restarting until a
        new group (next epoch) is ready: over gloo that is at the next batch, which the
        soak's image and video clients bring."""
        while "generation" in self.tally.restarting:  # a restart in progress: not now
            await asyncio.sleep(0.5)
        group = await self.rank_group()
        rank = max(group["pids"], key=int)
        pid = group["pids"][rank]
        self.tally.restarting.add("generation")
        try:
            _sigkill(pid)
            deadline = time.monotonic() + timeout_s
            while not await self._regrouped(group["epoch"]):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no new rank group {timeout_s:.0f} s after the kill")
                await asyncio.sleep(0.5)
        except BaseException:
            self.tally.restarting.discard("generation")
            raise
        self._grace(lambda: self.tally.restarting.discard("generation"))
        return {"pid": pid, "rank": int(rank)}

    async def _regrouped(self, old_epoch: int) -> bool:
        try:
            group = (await self.generation_info()).get("rank_group") or {}
        except (httpx.HTTPError, KeyError, ValueError):
            return False
        return group.get("epoch", old_epoch) > old_epoch and bool(group.get("ready"))

    async def restart_api(self, kill_stage: str | None) -> dict[str, Any]:
        """SIGKILL the api (or its generation stage, which makes it exit), then start it again
        on the same port and output dir; the accepted jobs must all be found after."""
        pid = await self.stage_pid(kill_stage) if kill_stage else self.server.pid
        jobs_before = len(self.tally.jobs)
        self._end_graces()  # the restart's window, set next, covers theirs
        self.tally.api_down = True
        self.tally.restarting.update(STAGES)
        try:
            if kill_stage:
                _sigkill(pid)
                rc = await asyncio.to_thread(self.server.wait_exit, 120)
                if rc is None:  # it should have exited: a violation, and it must go now
                    self.tally.violations.append(f"the api outlived its {kill_stage} stage")
                    await asyncio.to_thread(self.server.kill)
            else:
                await asyncio.to_thread(self.server.kill)
                rc = -9
            start_s = await asyncio.to_thread(self.server.start)
        except BaseException:
            self._api_back()
            raise
        self._grace(self._api_back)
        return {"pid": pid, "api_exit_code": rc, "start_s": round(start_s, 1),
                "jobs_accepted_before": jobs_before}

    def _api_back(self) -> None:
        self.tally.api_down = False
        self.tally.restarting.difference_update(STAGES)

    async def disk_full(self) -> dict[str, Any]:
        """Fill the output tmpfs, hold it full, free it; /health is probed meanwhile."""
        filler = self.server.output_view / FILLER_NAME
        self.tally.disk_full = True
        try:
            written = await asyncio.to_thread(_fill, filler)
            await asyncio.sleep(self.disk_hold_s)
        except BaseException:
            self.tally.disk_full = False
            raise
        finally:
            filler.unlink(missing_ok=True)
        self._grace(lambda: setattr(self.tally, "disk_full", False))
        return {"filler_mb": round(written / 2**20, 1)}


def _sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _fill(path: Any) -> int:
    """Bytes written until the tmpfs is full; 0 when it is full already (the server's own
    outputs filled it: then even creating the file fails with ENOSPC)."""
    written = 0
    try:
        with open(path, "wb") as out:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
                written += 65536
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    return written


async def _restarted(http: httpx.AsyncClient, stage: str, old_pid: int) -> bool:
    """The stage runs under a new pid and the server is healthy again."""
    try:
        info = (await http.get("/admin/server_info")).json()["stages"][stage]
        return info["pid"] != old_pid and (await http.get("/health")).status_code == 200
    except (httpx.HTTPError, KeyError, ValueError):
        return False


@dataclass
class JobWatch:
    """Every accepted video job, polled until its state is final. A job whose record is gone
    (404) is `deleted_by_client` when the soak deleted it, else `lost`."""

    base: str
    last: dict[str, str] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)

    def accepted(self, job_id: str) -> None:
        self.last[job_id] = "queued"

    def deleting(self, job_id: str) -> None:
        self.deleted.add(job_id)

    def live(self) -> list[str]:
        return [i for i, s in self.last.items() if s in LIVE]

    async def poll(self, http: httpx.AsyncClient) -> None:
        for job_id in self.live():
            try:
                answer = await http.get(f"/v1/videos/{job_id}")
            except httpx.HTTPError:
                return  # the api restarting: next round
            if answer.status_code == 404:
                self.last[job_id] = "deleted_by_client" if job_id in self.deleted else "lost"
            elif answer.status_code == 200:
                self.last[job_id] = _final_name(answer.json())

    async def run(self, keep_going: Any, every_s: float = 2.0) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            while keep_going():
                await self.poll(http)
                await asyncio.sleep(every_s)

    async def settle(self, timeout_s: float) -> None:
        """After the load: poll until no job is live, or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        await self.run(lambda: self.live() and time.monotonic() < deadline, every_s=1.0)

    def by_state(self) -> dict[str, int]:
        """`completed`, `failed:<reason code>`, `cancelled`, `deleted_by_client`, and what
        must be 0: `queued` / `in_progress` (stuck), `lost`, `failed:no_reason`."""
        return dict(sorted(Counter(self.last.values()).items()))


def _final_name(record: dict[str, Any]) -> str:
    status = record["status"]
    if status != "failed":
        return status
    error = record.get("error") or {}
    return f"failed:{error.get('code') or 'no_reason'}" if error.get("message") \
        else "failed:no_reason"
