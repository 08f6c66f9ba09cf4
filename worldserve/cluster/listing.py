"""`GET /v1/videos` over several api replicas: every replica's jobs, merged as one listing.

Each api replica keeps its own job records (cluster/app.py). The answering replica asks every
live api replica for a page (a pinned call through the `ApiRouter`) and merges them. The order
is the single-node order, made total across replicas: (created_at, replica, seq), seq being the
replica's own insertion counter. The cursor is the same: `after` is a job id; its api replica
(named in the id, `<uuid>.<api>`) says where that job sits, and each replica answers the
records that come after that position, `limit + 1` of them, so the merge knows `has_more`
exactly as one replica does. An `after` that names no live record answers an empty page, as on
one node (a job whose api replica is gone is gone with its records).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle

from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.views import job_object, list_object
from worldserve.cluster.ids import API_SEP, OWNER_SEP, OwnerGone, pin
from worldserve.errors import StageUnavailable

KIND = "video"
CALL_TIMEOUT_S = 10.0  # one attempt: a few ms when idle; generous for a loaded machine
# A pinned call that Ray Serve 2.60 never dispatches to its replica (seen in CI: the replica got
# nothing for 30 s, the next call went through at once) is asked again; the calls only read.
CALL_ATTEMPTS = 3
LAST_SEQ = 2**62  # after every seq of one created_at second
Position = tuple[int, int]  # (created_at, seq) in one replica's store
Row = tuple[int, str, int, dict[str, Any]]  # (created_at, replica, seq, job object)
GONE = (OwnerGone, RayActorError, ActorUnavailableError)


def api_replica_of(job_id: str) -> str | None:
    """The api replica named in a job id (`<uuid>.<api replica>`), else None."""
    head, sep, replica = job_id.split(OWNER_SEP, 1)[0].rpartition(API_SEP)
    return replica if sep and head and replica else None


def local_anchor(position: Position, owner: str, replica: str) -> Position:
    """Where `replica`'s records start, for the merged order (created_at, replica, seq), after
    the job at `position` of replica `owner` (in either direction): the owner continues from
    the job itself; a later replica's records of the same second come after it, an earlier
    replica's before it."""
    created_at, seq = position
    if replica == owner:
        return created_at, seq
    return (created_at, 0) if replica > owner else (created_at, LAST_SEQ)


def local_rows(service: MediaService, replica: str, anchor: Position | None, limit: int,
               descending: bool, base_url: str) -> list[Row]:
    """This replica's records after `anchor`, rendered here (its own file paths)."""
    records, _ = service.ledger.page_after(KIND, anchor, limit, descending)
    hide_paths = service.runtime.hides_file_paths
    return [(r.created_at, replica, r.seq, job_object(
                r, service.paths(r), base_url=base_url, hide_paths=hide_paths))
            for r in records]


def api_replica_ids(app_name: str, deployment: str) -> list[str]:
    """The live replicas of the api deployment (Serve names each replica's actor
    `SERVE_REPLICA::<app>#<deployment>#<replica id>`)."""
    prefix = f"SERVE_REPLICA::{app_name}#{deployment}#"
    return sorted(entry["name"][len(prefix):]
                  for entry in ray.util.list_named_actors(all_namespaces=True)
                  if entry["name"].startswith(prefix))


PositionFn = Callable[[str, str], Awaitable[Position | None]]  # (replica, job id)
RowsFn = Callable[[str, Position | None, int, bool], Awaitable[list[Row]]]


async def merged_page(replicas: list[str], position_of: PositionFn, rows_of: RowsFn,
                      after: str | None, limit: int, descending: bool) -> dict[str, Any]:
    """One page of every replica's jobs: `rows_of(replica, anchor, n, descending)` gives a
    replica's first `n` records after its anchor, `position_of(replica, job_id)` a job's
    position in its replica (None: no such job)."""
    anchor: tuple[Position, str] | None = None
    if after is not None:
        owner = api_replica_of(after)
        position = await position_of(owner, after) if owner in replicas else None
        if owner is None or position is None:
            return list_object([], False)
        anchor = position, owner
    # One replica after the other: concurrent pinned calls from a replica to its own
    # deployment hung in Ray Serve 2.60 (a few ms each; api replicas are few).
    pages = [await rows_of(replica, local_anchor(*anchor, replica) if anchor else None,
                           limit + 1, descending)
             for replica in replicas]
    rows = sorted((row for page in pages for row in page), key=lambda r: r[:3],
                  reverse=descending)
    return list_object([row[3] for row in rows[:limit]], len(rows) > limit)


@dataclass
class ClusterJobLister:
    """The `JobLister` (api/runtime.py) of one api replica: `merged_page` over the live api
    replicas, each asked through a pinned call."""

    handle: DeploymentHandle  # the api deployment itself
    app_name: str
    deployment: str

    async def page(self, after: str | None, limit: int, descending: bool,
                   base_url: str) -> dict[str, Any]:
        async def position_of(replica: str, job_id: str) -> Position | None:
            try:
                return await self._call(replica, "job_position", job_id)
            except GONE:
                return None

        async def rows_of(replica: str, anchor: Position | None, n: int,
                          descending: bool) -> list[Row]:
            try:
                return await self._call(replica, "job_rows", anchor, n, descending, base_url)
            except GONE:  # stopped since the replicas were listed: its records went with it
                return []

        replicas = api_replica_ids(self.app_name, self.deployment)
        return await merged_page(replicas, position_of, rows_of, after, limit, descending)

    async def _call(self, replica: str, method: str, *args: Any) -> Any:
        for _ in range(CALL_ATTEMPTS):
            call = getattr(self.handle.options(session_id=pin(replica)), method).remote(*args)
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    return await call
            except TimeoutError:
                call.cancel()
        raise StageUnavailable(f"api replica {replica} did not answer the job listing "
                               f"({CALL_ATTEMPTS} tries of {CALL_TIMEOUT_S:g} s)")
