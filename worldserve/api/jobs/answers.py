"""`Idempotency-Key` on a synchronous route whose answer is no job record
(`POST /v1/actions/generations`): the first request's response bytes are kept beside the
records (records.sqlite3, table `answers`), so the same key with the same request gets the very
same bytes, also after a restart, with no new work; another request under the key is a 409
naming it (the rules of api/jobs/idempotency.py, whose per-key lock makes one request answer).

A kept answer lives `--output-ttl` seconds, or a day when outputs never expire (Stripe keeps
its keys 24 h): the answers are the bytes themselves, so they cannot live as long as forever.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from worldserve.api.jobs.idempotency import IdempotencyKey, IdempotencyKeys

DEFAULT_ANSWER_TTL_S = 24 * 3600

Answer = tuple[bytes, str]  # (body, media type)


def answer_ttl_s(output_ttl_s: float) -> int:
    return int(output_ttl_s) if output_ttl_s > 0 else DEFAULT_ANSWER_TTL_S


def with_variant(key: IdempotencyKey, variant: str) -> IdempotencyKey:
    """The key over the request and how its answer is encoded (`variant`: JSON or msgpack),
    so one key cannot be answered in two encodings."""
    return IdempotencyKey(key.key, f"{key.fingerprint}:{variant}")


async def answer_once(keys: IdempotencyKeys, key: IdempotencyKey | None, ttl_s: int,
                      create: Callable[[], Awaitable[Answer]]) -> Answer:
    """`create()` the answer, unless `key` already has one: then its kept bytes."""
    if key is None:
        return await create()
    store = keys.store
    store.drop_expired_answers(int(time.time()))
    async with keys.claim(key) as known:
        if known is not None:
            kept = store.answer(known)
            if kept is not None:
                return kept
            store.delete(known)  # its answer is gone: the key names the new one
        body, media_type = await create()
        answer_id = f"ans_{uuid.uuid4().hex}"
        store.save_answer(answer_id, media_type, body, int(time.time()) + ttl_s)
        store.remember_key(key.key, key.fingerprint, answer_id)
        return body, media_type
