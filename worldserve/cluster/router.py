"""`OwnerRouter`: Ray Serve request routing that pins sessions to their owner, never spilling.

It runs in the caller's process (an api replica). Per call, the routing key (ids.py) says:
- `pin:<replica>`: only that replica. When it is not among the live replicas the request fails
  at once with `OwnerGone` (no backoff, no retries on another replica);
- `place`: a new session: replicas ranked by the sessions they report through
  `record_routing_stats`, plus the sessions placed from here too recently to be in that report
  (ties: fewest placed from here, then at random, so api replicas with the same stale view
  do not all pick the first replica), so sessions spread;
- none: a job: two random replicas, the shorter queue wins (power of two choices).

Ray ships this module to the callers by value (`RequestRouterConfig` pickles it so), so a class
defined here would be a different class there: `OwnerGone` lives in ids.py.
"""

from __future__ import annotations

import collections
import pickle
import random
import time
from typing import Any, List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from worldserve.cluster.ids import PLACE, OwnerGone, api_owners_in, pinned_replica

RECENT_S = 3.0  # a placement shows in a replica's routing stats within this (period 1 s)


class OwnerRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._placed: collections.Counter[str] = collections.Counter()
        self._recent: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque)

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        key = pending_request.metadata.session_id if pending_request is not None else ""
        owner = pinned_replica(key)
        if owner is not None:
            return _pinned(owner, candidate_replicas, pending_request)
        if key == PLACE:
            return [[r] for r in sorted(candidate_replicas, key=self._session_load)]
        k = min(2, len(candidate_replicas))
        return [random.sample(candidate_replicas, k)]

    def _session_load(self, replica: RunningReplica) -> tuple[int, int, float]:
        rid = replica.replica_id.unique_id
        stats = replica.routing_stats or {}
        load = int(stats.get("sessions", 0)) + self._num_recent(rid)
        return load, self._placed[rid], random.random()

    def _num_recent(self, rid: str) -> int:
        recent = self._recent[rid]
        while recent and recent[0] < time.monotonic() - RECENT_S:
            recent.popleft()
        return len(recent)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        if pending_request.metadata.session_id == PLACE:
            self._placed[replica_id.unique_id] += 1
            self._recent[replica_id.unique_id].append(time.monotonic())


class ApiRouter(RequestRouter):
    """The api ingress's router: a REST call whose path names an id minted by an api replica
    goes to that replica (it holds the session or job record); anything else, including a
    WebSocket connect, goes to the shorter queue of two random replicas. An id whose api
    replica is gone is not an error here: any replica answers (404 for a record it lacks).
    A call from one api replica to another (the merged job listing, cluster/listing.py) is
    pinned (`pin:<replica>`): that replica only, or `OwnerGone` at once."""

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        path = request_path(pending_request) if pending_request is not None else ""
        # Only a call between api replicas may pin (the proxy takes a request's session id
        # from a client header: a client must not pin, or fail its request by naming a gone
        # replica).
        key = pending_request.metadata.session_id if pending_request and not path else ""
        owner = pinned_replica(key or "")
        if owner is not None:
            return _pinned(owner, candidate_replicas, pending_request)
        owners = api_owners_in(path)
        for owner in owners:
            match = [r for r in candidate_replicas if r.replica_id.unique_id == owner]
            if match:
                return [match]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]


def _pinned(owner: str, candidates: List[RunningReplica],
            pending_request: Optional[PendingRequest]) -> List[List[RunningReplica]]:
    """The replica `owner` only; when it is not a live replica, the call fails at once."""
    match = [r for r in candidates if r.replica_id.unique_id == owner]
    if match:
        return [match]
    if pending_request is not None and not pending_request.future.done():
        # Fail the caller now; the routing loop stops at its next check of the future.
        pending_request.future.set_exception(OwnerGone(owner))
    return [candidates[:1]]


def request_path(pending_request: PendingRequest) -> str:
    """The HTTP path of a request from Serve's proxy (its argument is a pickled
    `StreamingHTTPRequest`); "" for anything else."""
    arg = pending_request.args[0] if pending_request.args else None
    if isinstance(arg, (bytes, bytearray)):
        try:
            arg = pickle.loads(arg)
        except Exception:  # not a proxy request
            return ""
    scope = getattr(arg, "asgi_scope", None)
    return scope.get("path", "") if isinstance(scope, dict) else ""
