"""Admission of realtime sessions (spec realtime-video §7): slots, per-user limit, waiting.

Runs after a valid `init`, so an invalid init never holds a slot. A session that finds no
slot waits up to `wait_s`, re-checking whenever a session ends, then is rejected with
CAPACITY_EXHAUSTED, whose `retry_after_s` is when a slot should free (the sessions' mean length
against the oldest one's age, api/retry_after.py). The per-user limit rejects at once
(USER_SESSION_LIMIT).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass

from worldserve.api.retry_after import SlotClock

CAPACITY_EXHAUSTED = "CAPACITY_EXHAUSTED"
USER_SESSION_LIMIT = "USER_SESSION_LIMIT"


class AdmissionRejected(Exception):
    """`reason` is the close reason; `retry_after_s` is set for CAPACITY_EXHAUSTED."""

    def __init__(self, reason: str, detail: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Lease:
    lease_id: int
    user: str
    admitted_after_s: float
    kv_bytes: int = 0
    slot: int = 0  # its SlotClock token


class AdmissionManager:
    """Slots for concurrent sessions of one realtime stage."""

    def __init__(self, max_sessions: int, max_sessions_per_user: int, wait_s: float,
                 kv_budget_bytes: int = 0) -> None:
        self.max_sessions = max_sessions
        self.kv_budget_bytes = kv_budget_bytes
        self.max_sessions_per_user = max_sessions_per_user
        self.wait_s = wait_s
        self._leases: dict[int, Lease] = {}
        self._per_user: collections.Counter[str] = collections.Counter()
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        self._slots = SlotClock()

    @property
    def num_active(self) -> int:
        return len(self._leases)

    @property
    def kv_bytes_in_use(self) -> int:
        return sum(lease.kv_bytes for lease in self._leases.values())

    def _full(self, kv_bytes: int) -> bool:
        if len(self._leases) >= self.max_sessions:
            return True
        return bool(self.kv_budget_bytes) and self.kv_bytes_in_use + kv_bytes > self.kv_budget_bytes

    def _check_user(self, user: str) -> None:
        limit = self.max_sessions_per_user
        if limit and self._per_user[user] >= limit:
            raise AdmissionRejected(USER_SESSION_LIMIT,
                                    f"user {user!r} already has {limit} realtime session(s)")

    async def acquire(self, user: str, kv_bytes: int = 0) -> Lease:
        """A lease, after waiting for a slot (and KV budget) when none is free; raises
        AdmissionRejected."""
        started = time.monotonic()
        self._check_user(user)
        if self.kv_budget_bytes and kv_bytes > self.kv_budget_bytes:
            raise AdmissionRejected(CAPACITY_EXHAUSTED,
                                    f"the session needs about {kv_bytes} KV bytes; the whole "
                                    f"budget is {self.kv_budget_bytes}")
        deadline = started + self.wait_s
        async with self._changed:
            while self._full(kv_bytes):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AdmissionRejected(
                        CAPACITY_EXHAUSTED,
                        f"all {self.max_sessions} realtime session slots (or the KV budget) "
                        "are in use",
                        retry_after_s=self._slots.retry_after_s())
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except asyncio.TimeoutError:
                    continue
            self._check_user(user)
            lease = Lease(next(self._ids), user, time.monotonic() - started, kv_bytes,
                          self._slots.hold())
            self._leases[lease.lease_id] = lease
            self._per_user[user] += 1
            return lease

    async def release(self, lease: Lease) -> None:
        """Free the slot (idempotent) and wake the waiters."""
        async with self._changed:
            if self._leases.pop(lease.lease_id, None) is None:
                return
            self._slots.release(lease.slot)
            self._per_user[lease.user] -= 1
            if self._per_user[lease.user] <= 0:
                del self._per_user[lease.user]
            self._changed.notify_all()
