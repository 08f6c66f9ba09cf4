"""`OwnerRouter`: Ray Serve request routing that pins sessions to their owner, never spilling.

It runs in the caller's process (an api replica). Per call, the routing key (ids.py) says:
- `pin:<replica>`: only that replica. When it is not among the live replicas the request fails
  at once with `OwnerGone` (no backoff, no retries on another replica);
- `place`: a new session: replicas ranked by the sessions they report through
  `record_routing_stats` (ties: fewest placed from here), so sessions spread;
- none: a job: two random replicas, the shorter queue wins (power of two choices).
"""

from __future__ import annotations

import collections
import random
from typing import Any, List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from worldserve.cluster.ids import PLACE, pinned_replica


class OwnerGone(Exception):
    """The replica named by a pinned call is not (any longer) a live replica."""

    def __init__(self, replica: str) -> None:
        super().__init__(f"replica {replica} is gone")
        self.replica = replica


class OwnerRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self._placed: collections.Counter[str] = collections.Counter()

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        key = pending_request.metadata.session_id if pending_request is not None else ""
        owner = pinned_replica(key)
        if owner is not None:
            return self._owner(owner, candidate_replicas, pending_request)
        if key == PLACE:
            return [[r] for r in sorted(candidate_replicas, key=self._session_load)]
        k = min(2, len(candidate_replicas))
        return [random.sample(candidate_replicas, k)]

    def _owner(self, owner: str, candidates: List[RunningReplica],
               pending_request: Optional[PendingRequest]) -> List[List[RunningReplica]]:
        match = [r for r in candidates if r.replica_id.unique_id == owner]
        if match:
            return [match]
        if pending_request is not None and not pending_request.future.done():
            # Fail the caller now; the routing loop stops at its next check of the future.
            pending_request.future.set_exception(OwnerGone(owner))
        return [candidates[:1]]

    def _session_load(self, replica: RunningReplica) -> tuple[int, int]:
        stats = replica.routing_stats or {}
        return int(stats.get("sessions", 0)), self._placed[replica.replica_id.unique_id]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        if pending_request.metadata.session_id == PLACE:
            self._placed[replica_id.unique_id] += 1
