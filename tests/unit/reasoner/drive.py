"""Session workloads the engine tests run twice (two configurations) and compare reply by reply."""

from __future__ import annotations

import time
from typing import Any, Callable

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.reference import reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.ipc.messages import SessionFrame


def concurrent_replies(drv: Any, sampling: dict, num_sessions: int = 3, num_frames: int = 4,
                       retention: dict | None = None,
                       after_frame: Callable[[Any], None] | None = None) -> dict[str, list]:
    """`num_sessions` sessions, each sent frame i in turn before the engine runs: every reply's
    tokens per session. `after_frame(session)` checks a session after each of its replies."""
    sids = [f"s{k}" for k in range(num_sessions)]
    for sid in sids:
        drv.create(sid, sampling=sampling, **({"retention": retention} if retention else {}))
    out: dict[str, list] = {sid: [] for sid in sids}
    for i in range(num_frames):
        for k, sid in enumerate(sids):
            drv.submit(SessionFrame(request_id=f"{sid}-{i}", session_id=sid,
                                    image=frame_bytes(i + 5 * k, size=56 + 28 * k),
                                    received_at=time.time()))
        drv.run()
        for sid in sids:
            session = drv.engine.sessions[sid]
            out[sid].append(reply_tokens(session))
            if after_frame is not None:
                after_frame(session)
    return out


def seeded_replies(drv: Any, sampling: dict, seeds: list[int],
                   num_frames: int = 3) -> dict[int, list]:
    """One session per seed, otherwise alike, each sent frame i before the engine runs: every
    reply's tokens per seed (a chat completion answers n = 1 only: sessions that differ by their
    seed are the reasoner's several seeds of one request)."""
    for seed in seeds:
        drv.create(f"seed-{seed}", sampling={**sampling, "seed": seed},
                   retention={"max_video_segments": 1})
    out: dict[int, list] = {seed: [] for seed in seeds}
    for i in range(num_frames):
        for seed in seeds:
            drv.submit(SessionFrame(request_id=f"seed-{seed}-{i}", session_id=f"seed-{seed}",
                                    image=frame_bytes(i), received_at=time.time()))
        drv.run()
        for seed in seeds:
            out[seed].append(reply_tokens(drv.engine.sessions[f"seed-{seed}"]))
    return out


def windowed_greedy_replies(drv: Any, num_frames: int = 4) -> list[list[int]]:
    """One session keeping 2 video segments, 16 greedy tokens per frame: its replies."""
    drv.create(retention={"max_video_segments": 2}, sampling={"max_tokens": 16, **GREEDY})
    out = []
    for i in range(num_frames):
        drv.frame("s1", frame_bytes(i))
        out.append(reply_tokens(drv.engine.sessions["s1"]))
    return out
