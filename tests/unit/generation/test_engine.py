"""Generation engine on the tiny Wan pipeline, in-process: equivalence with the diffusers
pipeline, batched == sequential, progress, cancellation, failure isolation, warmup, actions."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.ipc.messages import (
    ActionsResult,
    ErrorReply,
    GenerateActions,
    GenerateMedia,
    GenerationAccepted,
    GenerationCancelled,
    GenerationParams,
    GenerationProgress,
    GenerationResult,
)
from worldserve.media.video import decode_frames


def engine_for(model: Path, out: Path, **kw) -> GenerationEngine:
    kw.setdefault("batch_wait_ms", 0)
    cfg = GenerationStageConfig(model_path=model, output_dir=out, **kw)
    return GenerationEngine(cfg, ServerConfig())


def media(rid: str, prompt: str = "a red car", fmt: str = "png", frames: int = 1, seeds=(7,),
          steps: int = 3, **kw) -> GenerateMedia:
    p = GenerationParams(prompt=prompt, width=64, height=64, num_frames=frames,
                         num_inference_steps=steps, guidance_scale=kw.pop("guidance", 1.0),
                         seeds=list(seeds), max_sequence_length=32, **kw)
    return GenerateMedia(request_id=rid, params=p, output_stem=rid, output_format=fmt, fps=8)


def drain(engine: GenerationEngine, max_steps: int = 500) -> int:
    n = 0
    while engine.has_work() and n < max_steps:
        engine.step()
        n += 1
    return n


class Replies(dict):
    def fn(self, rid):
        self.setdefault(rid, [])
        return self[rid].append

    def terminal(self, rid):
        return self[rid][-1]


@pytest.fixture(scope="module")
def engine(tiny_wan_dir, tmp_path_factory):
    eng = engine_for(tiny_wan_dir, tmp_path_factory.mktemp("out"))
    drain(eng)  # the background warmup step (warmup_mode off)
    return eng


def frames_of(engine, result: GenerationResult) -> np.ndarray:
    data = (engine.output_dir / result.file_names[0]).read_bytes()
    if result.file_names[0].endswith(".mp4"):
        return np.stack(decode_frames(data))
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[None]


def test_matches_direct_pipeline_call(engine):
    import torch

    runner = engine.runner
    p = media("x", guidance=2.0, negative_prompt="blur", frames=9).params
    state = runner.prepare(["x"], [p], [7])
    while not state.done_denoising:
        runner.denoise_step(state)
    mine = runner.decode(state, 0)
    ref = engine.pipe("a red car", negative_prompt="blur", height=64, width=64, num_frames=9,
                      num_inference_steps=3, guidance_scale=2.0, max_sequence_length=32,
                      generator=torch.Generator().manual_seed(7), output_type="np").frames[0]
    assert np.abs(ref - mine).max() < 1e-5


def test_batched_equals_sequential_and_progress(engine):
    replies = Replies()
    engine.submit(media("solo"), replies.fn("solo"))
    drain(engine)
    solo = replies.terminal("solo")
    assert isinstance(solo, GenerationResult)
    for rid, prompt in (("b0", "a red car"), ("b1", "a wooden table"), ("b2", "a cube")):
        engine.submit(media(rid, prompt=prompt), replies.fn(rid))
    engine.step()  # starts one batch with all three
    assert [len(batch.requests) for batch in engine.scheduler.running] == [3]
    drain(engine)
    b0 = replies.terminal("b0")
    assert isinstance(b0, GenerationResult) and b0.file_names == ["b0.png"]
    assert np.array_equal(frames_of(engine, solo), frames_of(engine, b0))
    updates = [r for r in replies["b1"] if isinstance(r, GenerationProgress)]
    progress = [r.progress for r in updates]
    assert isinstance(replies["b1"][0], GenerationAccepted)
    assert progress == sorted(progress) and progress[0] == 0 and progress[-1] == 99
    assert len(progress) >= 1 + 3 + 2  # admitted, every denoising step, decoded, writing
    phases = [r.phase for r in updates]
    assert phases[0] == "encode" and phases[-1] == "mux"
    assert phases == sorted(phases, key=["encode", "denoise", "decode", "mux"].index)
    steps = [r.steps_done for r in updates if r.phase == "denoise"]
    assert steps == sorted(steps) and {r.steps_total for r in updates} == {3}


def test_queued_until_admitted_with_its_position(tiny_wan_dir, tmp_path):
    """One request runs at a time: the others hear `queued` with their position whenever it
    moves, and `encode` only when the engine admits them."""
    engine = engine_for(tiny_wan_dir, tmp_path, max_running_requests=1)
    drain(engine)
    replies = Replies()
    for i, frames in enumerate((1, 5, 9)):  # three shapes: never one batch
        engine.submit(media(f"q{i}", frames=frames, fmt="mp4" if frames > 1 else "png"),
                      replies.fn(f"q{i}"))
    assert [replies[f"q{i}"][0].queue_position for i in range(3)] == [0, 1, 2]
    engine.step()  # q0 admitted: q1 and q2 move up
    queued = [(r.phase, r.queue_position) for r in replies["q2"][1:]]
    assert queued == [("queued", 1)] and replies["q0"][1].phase == "encode"
    while not isinstance(replies["q0"][-1], GenerationResult):
        assert all(r.phase == "queued" for r in replies["q2"][1:])
        engine.step()
    drain(engine)
    positions = [r.queue_position for r in replies["q2"] if getattr(r, "phase", "") == "queued"]
    assert positions == [1, 0]
    first_running = next(i for i, r in enumerate(replies["q2"])
                         if getattr(r, "phase", "") == "encode")
    assert all(r.phase != "queued" for r in replies["q2"][first_running + 1:-1])


def test_stage_durations_per_phase(engine):
    """Each phase's wall time goes to the requests it ran for: a batch's prepare and denoise
    steps to every request of it, a decode to its row's owner, a write to its request."""
    replies = Replies()
    for rid in ("d0", "d1"):
        engine.submit(media(rid, fmt="mp4", frames=9), replies.fn(rid))
    engine.step()  # one batch with both
    assert [len(batch.requests) for batch in engine.running] == [2]
    drain(engine)
    d0, d1 = replies.terminal("d0"), replies.terminal("d1")
    for result in (d0, d1):
        assert set(result.stage_durations) == {"encode", "denoise", "decode", "mux"}
        assert all(v > 0 for v in result.stage_durations.values())
        assert sum(result.stage_durations.values()) <= result.inference_time_s + 1e-3
        assert result.peak_memory_mb > 0
    assert d0.stage_durations["denoise"] == d1.stage_durations["denoise"]  # shared steps
    assert d0.stage_durations["encode"] == d1.stage_durations["encode"]


def test_video_with_several_outputs(engine):
    replies = Replies()
    engine.submit(media("vid", fmt="mp4", frames=10, seeds=(1, 2)), replies.fn("vid"))
    assert replies["vid"][0].num_frames == 9  # snapped to 4k+1
    drain(engine)
    result = replies.terminal("vid")
    assert result.file_names == ["vid_0.mp4", "vid_1.mp4"]
    assert frames_of(engine, result).shape == (9, 64, 64, 3)


def test_cancel_waiting_and_running(engine):
    replies = Replies()
    engine.submit(media("run", steps=6), replies.fn("run"))
    engine.submit(media("wait", steps=6, frames=5), replies.fn("wait"))
    engine.step()
    engine.step()
    engine.cancel("wait")
    engine.cancel("run")
    assert isinstance(replies.terminal("wait"), GenerationCancelled)
    assert isinstance(replies.terminal("run"), GenerationCancelled)
    assert not engine.has_work()
    assert not list(engine.output_dir.glob("run*")) and not list(engine.output_dir.glob("wait*"))


def test_cancel_one_row_of_a_batch_keeps_the_others(engine):
    replies = Replies()
    engine.submit(media("k0"), replies.fn("k0"))
    engine.submit(media("k1", prompt="a cube"), replies.fn("k1"))
    engine.step()
    engine.step()
    engine.cancel("k0")
    drain(engine)
    assert isinstance(replies.terminal("k0"), GenerationCancelled)
    assert isinstance(replies.terminal("k1"), GenerationResult)


def test_failing_request_fails_alone(engine, monkeypatch):
    real = engine.runner.denoise_step

    def flaky(state):  # fault injected at the runner boundary: rows of "boom" blow up
        if "boom" in state.row_owner:
            raise RuntimeError("injected failure\nsecond line")
        real(state)

    monkeypatch.setattr(engine.runner, "denoise_step", flaky)
    replies = Replies()
    for rid in ("ok0", "boom", "ok1"):
        engine.submit(media(rid), replies.fn(rid))
    drain(engine)
    assert isinstance(replies.terminal("ok0"), GenerationResult)
    assert isinstance(replies.terminal("ok1"), GenerationResult)
    err = replies.terminal("boom")
    assert isinstance(err, ErrorReply) and err.code == "internal_error"
    assert err.message == "injected failure"


def test_invalid_requests_raise_at_submit(engine):
    from worldserve.errors import InvalidRequest

    bad = media("bad")
    bad.params.width = 72
    with pytest.raises(InvalidRequest, match="multiple of 16"):
        engine.submit(bad, lambda r: None)
    with pytest.raises(InvalidRequest):
        engine.submit(media("../x"), lambda r: None)


def test_image_conditioned_edit(engine):
    buf = io.BytesIO()
    Image.new("RGB", (48, 40), (250, 0, 0)).save(buf, "PNG")
    replies = Replies()
    engine.submit(media("edit", fmt="jpeg", condition_images=[buf.getvalue()]), replies.fn("edit"))
    engine.submit(media("i2v", fmt="mp4", frames=9, condition_images=[buf.getvalue()]),
                  replies.fn("i2v"))
    drain(engine)
    assert replies.terminal("edit").file_names == ["edit.jpg"]
    assert frames_of(engine, replies.terminal("i2v")).shape == (9, 64, 64, 3)
    broken = media("broken", condition_images=[b"not an image"])
    engine.submit(broken, replies.fn("broken"))
    drain(engine)
    assert isinstance(replies.terminal("broken"), ErrorReply)


def test_actions(engine):
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 0, 250)).save(buf, "PNG")
    meta = engine.capabilities().actions
    replies = Replies()
    state = np.zeros(meta.state_dim, "<f4").tobytes()
    for rid in ("a0", "a1"):
        engine.submit(GenerateActions(request_id=rid, task="pick", images=[buf.getvalue()],
                                      state=state, num_candidates=2), replies.fn(rid))
    drain(engine)
    r0, r1 = replies.terminal("a0"), replies.terminal("a1")
    assert isinstance(r0, ActionsResult)
    values = np.frombuffer(r0.values, "<f4").reshape(2, meta.action_horizon, meta.action_dim)
    assert np.isfinite(values).all() and r0.values == r1.values  # deterministic per seed
    assert not np.array_equal(values[0], values[1])  # candidates differ


def test_server_warmup_blocks_readiness(tiny_wan_dir, tmp_path):
    eng = engine_for(tiny_wan_dir, tmp_path, warmup_mode="server")
    assert eng.state() == "warming"
    replies = Replies()
    eng.submit(media("early"), replies.fn("early"))  # queues behind the warmup
    drain(eng)
    assert eng.state() == "ready" and eng.warmup.num_finished == 1
    assert isinstance(replies.terminal("early"), GenerationResult)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["early.png"]  # warmup saved nothing


def test_explicit_warmup_resolution_that_cannot_run_fails_startup(tiny_wan_dir, tmp_path):
    from worldserve.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        engine_for(tiny_wan_dir, tmp_path, warmup_resolutions=["72x64"])
