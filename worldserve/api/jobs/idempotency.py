"""`Idempotency-Key` on job creation: the same key with the same request returns the job it
created (also after a restart: the key lives beside the records, records.sqlite3), the same key
with another request is a 409 naming the key. A key is removed with its job's record.

Concurrent requests with one key queue on a per-key lock, so exactly one of them creates the
job; the others then find it. The request is fingerprinted as sent (route, canonical JSON or
the multipart fields and file bytes), before anything the server fills in (a random seed)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from starlette.datastructures import UploadFile

from worldserve.api.jobs.records import JobRecord
from worldserve.api.jobs.store import RecordStore
from worldserve.errors import Conflict, InvalidRequest

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255  # Stripe's limit


@dataclass(frozen=True)
class IdempotencyKey:
    key: str
    fingerprint: str


async def _form_digest(request: Request, digest: Any) -> None:
    form = await request.form()  # cached by starlette: the route already read it
    for name, value in sorted(form.multi_items(), key=lambda item: item[0]):
        digest.update(name.encode() + b"\0")
        if isinstance(value, UploadFile):
            await value.seek(0)
            digest.update(await value.read())
            await value.seek(0)
        else:
            digest.update(value.encode())
        digest.update(b"\0")


async def fingerprint(request: Request) -> str:
    """A digest of the request as the client sent it, independent of JSON key order and of
    the multipart boundary."""
    digest = hashlib.sha256(request.url.path.encode() + b"\0")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/", "application/x-www-form-urlencoded")):
        await _form_digest(request, digest)
        return digest.hexdigest()
    body = await request.body()
    try:
        body = json.dumps(json.loads(body), sort_keys=True).encode()
    except ValueError:
        pass  # not JSON: compared as sent
    digest.update(body)
    return digest.hexdigest()


async def read_key(request: Request) -> IdempotencyKey | None:
    """The request's Idempotency-Key with its fingerprint; None without the header."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_CHARS:
        raise InvalidRequest(f"{HEADER} must be 1 to {MAX_KEY_CHARS} characters "
                             f"(got {len(key)})", param=HEADER)
    return IdempotencyKey(key, await fingerprint(request))


class IdempotencyKeys:
    """The keys of one record store, with the lock that lets one request per key create."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiters: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def claim(self, key: IdempotencyKey) -> AsyncIterator[str | None]:
        """Hold the key; yields the id of the job it already created (None: create it, then
        `remember`). Another request under the key is a 409."""
        lock = self._locks.setdefault(key.key, asyncio.Lock())
        self._waiters[key.key] = self._waiters.get(key.key, 0) + 1
        try:
            async with lock:
                yield self._known(key)
        finally:
            self._waiters[key.key] -= 1
            if not self._waiters[key.key]:
                del self._waiters[key.key], self._locks[key.key]

    def _known(self, key: IdempotencyKey) -> str | None:
        found = self.store.key_record(key.key)
        if found is None:
            return None
        record_id, fingerprint = found
        if fingerprint != key.fingerprint:
            raise Conflict(f"{HEADER} {key.key!r} was used for another request (job "
                           f"{record_id}); send a new key for a new request", param=HEADER)
        return record_id

    async def once(self, key: IdempotencyKey | None, create: Callable[[], Awaitable[JobRecord]],
                   find: Callable[[str], JobRecord]) -> JobRecord:
        """`create()` the job, unless `key` already made one: then `find(its id)`."""
        if key is None:
            return await create()
        async with self.claim(key) as known:
            if known is not None:
                return find(known)
            record = await create()
            self.store.remember_key(key.key, key.fingerprint, record.id)
            return record
