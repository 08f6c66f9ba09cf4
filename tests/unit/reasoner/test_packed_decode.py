"""Batched decode with the caches kept packed across steps (models/qwen_vl/kv.PackedBatch):
packed == per-step repacking == one sequence at a time, through joins, leaves, drafts,
evictions and re-prefills."""

from __future__ import annotations

import time

import pytest
import torch

from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.reference import reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.ipc.messages import SessionFrame
from worldserve.models.qwen_vl.batch import forward_repacked
from worldserve.models.qwen_vl.runner import load_runner


@pytest.fixture(scope="module")
def runner(tiny_dir):
    return load_runner(tiny_dir)


def _prefilled(runner, prompts):
    kvs = [runner.new_kv() for _ in prompts]
    for kv, ids in zip(kvs, prompts):
        runner.forward(kv, ids)
    return kvs


def _storage(kv):
    return kv.cache.layers[0]._k.untyped_storage().data_ptr()


def test_packed_steps_equal_repacked_and_solo_forwards(runner):
    """Several steps with uneven draft widths, a rolled-back draft and a member leaving:
    logits and caches equal the per-step repacking path and one forward per sequence."""
    prompts = [[5, 9, 13, 2], list(range(20, 31)), [7] * 6]
    packed, repacked, solo = (_prefilled(runner, prompts) for _ in range(3))
    steps = [[[3], [4, 5, 6], [8, 9]], [[10, 11], [12], [13]], [[14], [15, 16], [17]],
             [[18, 19, 20], [21]]]  # the last step: the third sequence left the batch
    packs = runner.num_packs
    for fed in steps:
        n = len(fed)
        got = runner.forward_decode_batch(packed[:n], fed)
        ref = forward_repacked(runner, repacked[:n], fed)
        for b in range(n):
            one = runner.forward(solo[b], fed[b], num_logits=len(fed[b]))
            torch.testing.assert_close(got[b], ref[b], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[b], one, atol=1e-5, rtol=1e-5)
        packed[0].truncate(len(packed[0]) - 1)  # a rejected draft (in place, on the row)
        repacked[0].truncate(len(repacked[0]) - 1)
        solo[0].truncate(len(solo[0]) - 1)
    assert runner.num_packs - packs == 2  # packed once for three steps, again when one left
    for a, b in zip(packed, solo):
        assert a.ids == b.ids and torch.equal(a.positions, b.positions)
        for la, lb in zip(a.cache.layers, b.cache.layers):
            torch.testing.assert_close(la.keys, lb.keys, atol=1e-5, rtol=1e-5)
    # the two members still decoding share the packed buffer; the one that left has its own
    assert _storage(packed[0]) == _storage(packed[1]) != _storage(packed[2])


def test_member_outgrowing_its_row_or_reset_is_packed_again(runner):
    kvs = _prefilled(runner, [[1, 2, 3], [4, 5]])
    runner.forward_decode_batch(kvs, [[6], [7]])
    packs = runner.num_packs
    runner.forward_decode_batch(kvs, [[8], [9]])
    assert runner.num_packs == packs  # resident
    capacity = runner.packed.capacity
    runner.forward(kvs[0], list(range(40, 40 + capacity)))  # a long prefill outgrows the row
    reference = _prefilled(runner, [kvs[0].ids])[0]
    got = runner.forward_decode_batch(kvs, [[10], [11]])
    assert runner.num_packs == packs + 1
    torch.testing.assert_close(got[0], runner.forward(reference, [10]), atol=1e-5, rtol=1e-5)
    kvs[1].reset()
    runner.forward(kvs[1], [1, 2, 3])
    runner.forward_decode_batch(kvs, [[12], [13]])
    assert runner.num_packs == packs + 2


def _replies(drv, sids, samplings, num_frames, retention=None, size=56):
    for sid, sampling in zip(sids, samplings):
        drv.create(sid, sampling=sampling, retention=retention)
    out = {sid: [] for sid in sids}
    results = []
    for i in range(num_frames):
        for k, sid in enumerate(sids):
            drv.submit(SessionFrame(request_id=f"{sid}-{i}", session_id=sid,
                                    image=frame_bytes(i + 5 * k, size=size + 28 * (k % 2)),
                                    received_at=time.time()))
        start = len(drv.replies)
        drv.run()
        results += drv.replies[start:]
        for sid in sids:
            out[sid].append(reply_tokens(drv.engine.sessions[sid]))
    return out, results


def test_sessions_leaving_mid_reply_equal_sequential(make_engine):
    """Replies of different lengths: the batch shrinks step by step (repacked) and regrows at
    the next frame; tokens equal running the sessions one at a time."""
    sids = ["a", "b", "c"]
    samplings = [{"max_tokens": m, "temperature": 0.8, "seed": 3 + m} for m in (3, 7, 12)]
    batched = make_engine(max_sessions=3)
    sequential = make_engine(max_sessions=3)
    sequential.engine.scheduler.batch_decode = False
    got, _ = _replies(batched, sids, samplings, 4)
    expected, _ = _replies(sequential, sids, samplings, 4)
    assert got == expected
    assert [len(r) for r in got["a"]] == [3] * 4 and max(len(r) for r in got["c"]) == 12
    assert batched.engine.runner.num_packs >= 8  # shrinks twice and regrows, every frame
    assert sequential.engine.runner.num_packs == 0


def test_eviction_and_reprefill_while_packed_equal_sequential(make_engine):
    """Eviction (in place, on the packed row) and re-prefill (a new cache: packed again) between
    batched replies; greedy tokens equal the unbatched engine's."""
    sids = ["a", "b"]
    retention = {"max_video_segments": 2, "max_text_tokens": 12, "reprefill_threshold": 0.51,
                 "max_session_tokens": 1024}
    samplings = [{"max_tokens": 6, **GREEDY}] * 2
    batched = make_engine(max_sessions=2)
    sequential = make_engine(max_sessions=2)
    sequential.engine.scheduler.batch_decode = False
    got, results = _replies(batched, sids, samplings, 40, retention)
    expected, _ = _replies(sequential, sids, samplings, 40, retention)
    assert got == expected
    assert sum(r.evicted_segments for r in results) >= 40
    assert sum(r.reprefill_ms is not None for r in results) >= 2  # one per session
    assert batched.engine.runner.num_packs >= 2


def test_batched_prefill_equals_one_chunk_at_a_time(make_engine):
    """Chunks with images of different sizes prefilled in one forward (one vision-tower call):
    last-position logits and caches equal prefilling each chunk alone."""
    drv = make_engine()
    runner, prompts = drv.engine.runner, drv.engine.prompts
    stop_ids = drv.engine.ctx.stop_ids
    chunks = [prompts.frame_chunk(frame_bytes(k, size=56 + 28 * k), None, "What?", 7, stop_ids)
              for k in range(3)]
    history = [[3, 4, 5], list(range(10, 22)), [9] * 7]
    batched, alone = _prefilled(runner, history), _prefilled(runner, history)
    for kv in batched + alone:
        kv.next_pos += 5  # a position gap, as after an eviction
    runner.forward_decode_batch(batched, [[1], [2], [3]])  # packed, as after a reply
    for kv, token in zip(alone, (1, 2, 3)):
        runner.forward(kv, [token])
    forwards = runner.num_forwards
    ids = [c.closing_ids + c.turn_ids for c in chunks]
    got = runner.forward_prefill_batch(batched, ids, [[c.image] for c in chunks])
    assert runner.num_forwards == forwards + 1
    for kv_b, kv_a, chunk_ids, chunk, row in zip(batched, alone, ids, chunks, got):
        expected = runner.forward(kv_a, chunk_ids, [chunk.image])[-1]
        torch.testing.assert_close(row, expected, atol=1e-5, rtol=1e-5)
        assert kv_b.ids == kv_a.ids and torch.equal(kv_b.positions, kv_a.positions)
        for lb, la in zip(kv_b.cache.layers, kv_a.cache.layers):
            torch.testing.assert_close(lb.keys, la.keys, atol=1e-5, rtol=1e-5)


def test_frames_arriving_together_share_one_prefill_step(make_engine):
    drv = make_engine(max_sessions=2)
    for sid in ("a", "b"):
        drv.create(sid, sampling={"max_tokens": 3, **GREEDY})
        drv.frame(sid, frame_bytes(0))
    for k, sid in enumerate(("a", "b")):
        drv.submit(SessionFrame(request_id=f"{sid}-1", session_id=sid, image=frame_bytes(k + 1),
                                received_at=time.time()))
    forwards = drv.engine.runner.num_forwards
    drv.engine.step()
    assert drv.engine.runner.num_forwards == forwards + 1
    assert [job.phase.value for job in drv.engine.scheduler] == ["decode", "decode"]
    drv.run()
    assert {r.request_id for r in drv.replies[-2:]} == {"a-1", "b-1"}


def test_sequences_in_another_order_reuse_the_batch_and_report_their_rows(runner):
    """The scheduler rotates jobs: the same sequences in another order run on the resident
    batch; `last_batch_rows` says which forward row each one was (DFlash's hidden-state taps
    read by it) and the logits come back in the caller's order."""
    kvs = _prefilled(runner, [[1, 2, 3], [4, 5, 6, 7], [8, 9]])
    solo = _prefilled(runner, [[1, 2, 3], [4, 5, 6, 7], [8, 9]])
    runner.forward_decode_batch(kvs, [[10], [11], [12]])
    for kv, token in zip(solo, (10, 11, 12)):
        runner.forward(kv, [token])
    packs = runner.num_packs
    got = runner.forward_decode_batch(kvs[::-1], [[15], [14], [13]])
    assert runner.num_packs == packs and runner.last_batch_rows == [2, 1, 0]
    for row, kv, token in zip(got, solo[::-1], (15, 14, 13)):
        torch.testing.assert_close(row, runner.forward(kv, [token]), atol=1e-5, rtol=1e-5)
