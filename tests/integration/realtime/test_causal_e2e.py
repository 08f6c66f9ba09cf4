"""The realtime WebSocket against the real causal backend with the dev checkpoint (short)."""

from __future__ import annotations

import numpy as np

from tests.integration.realtime.helpers import Session, connect

CAUSAL_CONFIG = {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False},
                            "realtime": {"enabled": True, "backend": "causal"}}}


async def run(server, *, prompt_event: bool) -> tuple[list, int]:
    async with connect(server) as ws:
        session = Session(ws)
        await session.send({"type": "init", "prompt": "a castle", "seed": 5, "max_chunks": 3,
                            "realtime_output_format": "delta-zstd",
                            "condition_inputs": {"action": "d-6,w-10"}})
        first = await session.read_chunk(timeout_s=60)
        if prompt_event:
            await session.send({"type": "event", "kind": "prompt", "event_id": 4,
                                "payload": {"prompt": "a lake", "refresh_kv": True}})
        chunks, code, _ = await session.read_until_close(timeout_s=60)
    assert not session.errors, session.errors
    return [first, *chunks], code


async def test_causal_backend_end_to_end(server_factory):
    server = server_factory(CAUSAL_CONFIG)
    plain, code = await run(server, prompt_event=False)
    assert code == 1000 and [len(c.frames) for c in plain] == [9, 12, 12]  # first block: 1 + 4*2
    again, _ = await run(server, prompt_event=False)
    for a, b in zip(plain, again):  # same seed and script: bit-identical worlds
        assert np.array_equal(a.frames, b.frames)
    switched, code = await run(server, prompt_event=True)
    assert code == 1000
    [applied] = [c for c in switched if c.stats["event_id"] == 4]
    assert "kv_refresh_ms" in applied.stats and applied.index > 0
    assert not np.array_equal(applied.frames, plain[applied.index].frames)
    before = [c for c in switched if c.index < applied.index]
    assert all(np.array_equal(c.frames, plain[c.index].frames) for c in before)
