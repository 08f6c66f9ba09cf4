"""The generation engine on a Cosmos3 checkpoint: interleaved requests equal their solo runs,
a cancelled request never decodes nor writes, sound becomes an AAC track, action runs return
their actions, warmup runs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import (
    ActionCondition,
    GenerateMedia,
    GenerationCancelled,
    GenerationParams,
    GenerationResult,
)
from worldserve.media.video import decode_audio, decode_frames

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def engine_for(model: Path, out: Path, **kw) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=model, output_dir=out, batch_wait_ms=0, **kw)
    engine = GenerationEngine(cfg, ServerConfig())
    drain(engine)  # the background warmup step
    return engine


def drain(engine: GenerationEngine, max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not finish")


def media(rid: str, fmt: str = "mp4", **kw) -> GenerateMedia:
    base = dict(prompt="a red car turns left", width=48, height=32, num_frames=5,
                num_inference_steps=3, guidance_scale=4.0, seeds=[5], fps=24.0)
    base.update(kw)
    return GenerateMedia(request_id=rid, params=GenerationParams(**base), output_stem=rid,
                         output_format=fmt, fps=24)


class Replies:
    def __init__(self) -> None:
        self.items: list = []

    def __call__(self, reply) -> None:
        self.items.append(reply)

    @property
    def last(self):
        return self.items[-1]


def capture_outputs(engine: GenerationEngine) -> dict[str, dict]:
    """request id -> {"frames", "extras"} as the engine's runner made them (before encoding)."""
    outputs: dict[str, dict] = {}
    runner = engine.runner

    def recording(method, key: str):
        def call(state, row):
            result = method(state, row)
            outputs.setdefault(state.row_owner[row], {})[key] = result
            return result
        return call

    runner.decode = recording(runner.decode, "frames")
    runner.extras = recording(runner.extras, "extras")
    return outputs


def test_interleaved_requests_equal_their_solo_runs_and_sound_is_written(cosmos3_dir, tmp_path):
    engine = engine_for(cosmos3_dir, tmp_path / "out", max_running_requests=2)
    outputs = capture_outputs(engine)
    finished: list[str] = []  # request ids in the order their results came
    replies = {"v": Replies(), "i": Replies()}

    def on_reply(rid: str):
        def reply(item) -> None:
            replies[rid](item)
            if isinstance(item, GenerationResult):
                finished.append(rid)
        return reply

    video = media("v", num_inference_steps=6, generate_sound=True)
    image = media("i", fmt="png", num_frames=1, width=32, height=32, seeds=[8],
                  num_inference_steps=2)
    engine.submit(video, on_reply("v"))
    engine.submit(image, on_reply("i"))
    order = []
    while engine.has_work():
        running = [b.requests[0].request_id for b in engine.scheduler.running]
        engine.step()
        order.append(tuple(running))
    assert finished == ["i", "v"]  # the 2-step image finished before the 6-step video
    assert any(len(r) == 2 for r in order)  # both ran at once
    # each equals its solo run: frames and sound, as decoded before encoding
    solo_video = engine.runner.run_to_end(video.params, 5)
    solo_image = engine.runner.run_to_end(image.params, 8)
    assert np.array_equal(outputs["v"]["frames"], solo_video[0])
    assert np.array_equal(outputs["v"]["extras"].audio, solo_video[1].audio)
    assert np.array_equal(outputs["i"]["frames"], solo_image[0])
    # and the files hold them: 5 frames with a stereo AAC track, the exact PNG
    data = (engine.output_dir / replies["v"].last.file_names[0]).read_bytes()
    assert len(decode_frames(data)) == 5
    audio = decode_audio(data)
    assert audio is not None and audio[0].shape[0] == 2 and audio[0].shape[1] > 0
    png = np.asarray(Image.open(engine.output_dir / replies["i"].last.file_names[0]).convert("RGB"))
    assert np.array_equal(png, (solo_image[0][0] * 255).round().astype(np.uint8))


def test_cancel_mid_run_never_decodes_nor_writes(cosmos3_dir, tmp_path):
    engine = engine_for(cosmos3_dir, tmp_path / "out")
    decoded = []
    original = engine.runner.decode
    engine.runner.decode = lambda state, row: decoded.append(row) or original(state, row)
    replies = Replies()
    engine.submit(media("c", num_inference_steps=10, generate_sound=True), replies)
    for _ in range(4):  # prepare + 3 steps
        engine.step()
    assert engine.scheduler.running and engine.scheduler.running[0].state.step_index == 3
    engine.cancel("c")
    drain(engine)
    assert isinstance(replies.last, GenerationCancelled)
    assert decoded == [] and list((tmp_path / "out").iterdir()) == []


def test_action_run_without_a_file_returns_the_actions(cosmos3_dir, tmp_path):
    engine = engine_for(cosmos3_dir, tmp_path / "out")
    buf = io.BytesIO()
    Image.new("RGB", (56, 40), (90, 30, 200)).save(buf, "PNG")
    action = ActionCondition(mode="policy", chunk_size=4, domain_name="av", resolution_tier=256)
    replies = Replies()
    engine.submit(media("a", fmt="none", action=action, condition_images=[buf.getvalue()],
                        guidance_scale=1.0, num_inference_steps=2), replies)
    drain(engine)
    result = replies.last
    assert isinstance(result, GenerationResult) and result.file_names == []
    assert len(result.actions) == 1 and result.actions[0].shape == [4, 9]
    assert result.actions[0].action_mode == "policy" and result.actions[0].domain_id == 1
    values = np.frombuffer(result.actions[0].values, "<f4").reshape(4, 9)
    assert np.isfinite(values).all()


def test_bad_action_width_is_refused_at_submission_with_the_pipeline_reason(cosmos3_dir, tmp_path):
    engine = engine_for(cosmos3_dir, tmp_path / "out")
    buf = io.BytesIO()
    Image.new("RGB", (56, 40)).save(buf, "PNG")
    action = ActionCondition(mode="forward_dynamics", chunk_size=4, domain_name="av",
                             resolution_tier=256, raw_actions=[[0.0] * 5] * 4)
    replies = Replies()
    with pytest.raises(InvalidRequest, match=r"does not match the expected action width \(9\)"):
        engine.submit(media("w", action=action, condition_images=[buf.getvalue()]), replies)
    assert replies.items == [] and not engine.has_work()


def test_server_warmup_runs_on_cosmos3(cosmos3_dir, tmp_path):
    engine = engine_for(cosmos3_dir, tmp_path / "out", warmup_mode="server",
                        warmup_resolutions=["32x32"])
    assert engine.warmup.done and engine.warmup.num_failed == 0
    assert engine.state() == "ready"
