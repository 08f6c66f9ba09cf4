"""The generation engine over a CFG-parallel group of two ranks (cond on rank 0, uncond on
rank 1, `vae=false`: rank 0 decodes alone) gives byte-identical outputs to the one-process
engine: interleaved image, video with sound and image-to-video requests; a cancel at a step
boundary; per-request LoRA after an admin load; a policy action run, and one with several seeds
whose every seed equals its solo run on the group. A hung peer fails the step after
`parallel.timeout_s` (no hang) and the group comes back; a weights update and a memory
release/resume reach every rank, and a restarted group replays the update."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.images import random_png as png
from tests.support.machine import require_module
from tests.support.rank_groups import (
    action_params,
    assert_extras_close,
    build_lora,
    build_updated,
    group_fixtures,
    params,
    run_to_end,
)
from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.errors import StageUnavailable
from worldserve.ipc.messages import (
    AdminResult,
    GenerateMedia,
    GenerationCancelled,
    GenerationProgress,
    GenerationResult,
    LoraLoad,
    LoraRef,
    MemoryRelease,
    MemoryResume,
    WeightsUpdate,
)
from worldserve.models import registry

require_module("peft")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
LAYOUT = "cfg=2,vae=false,timeout_s=10"  # the last test waits for that timeout

group, solo_runner = group_fixtures(LAYOUT)


@pytest.fixture(scope="module")
def lora_dir(cosmos3_dir, tmp_path_factory) -> Path:
    return build_lora(cosmos3_dir, tmp_path_factory.mktemp("cfg-lora") / "lora")


def engine(model_dir: Path, out: Path, runner, parallel: str = "") -> GenerationEngine:
    config = GenerationStageConfig(model_path=model_dir, output_dir=out, batch_wait_ms=0,
                                   max_running_requests=3, parallel=parallel)
    eng = GenerationEngine(config, ServerConfig(), runner=runner)
    drain(eng)  # the dev checkpoint's background warmup request
    return eng


def media(rid: str, fmt: str = "mp4", **kw) -> GenerateMedia:
    return GenerateMedia(request_id=rid, params=params(**kw), output_stem=rid,
                         output_format=fmt, fps=24)


def drain(eng: GenerationEngine) -> list[int]:
    """Step until idle; how many requests were running at each step."""
    running = []
    for _ in range(500):
        if not eng.has_work():
            return running
        running.append(eng.num_running())
        eng.step()
    raise AssertionError("the engine did not go idle")


def run(eng: GenerationEngine, msgs: list[GenerateMedia]) -> tuple[dict[str, list], list[int]]:
    replies: dict[str, list] = {m.request_id: [] for m in msgs}
    for msg in msgs:
        eng.submit(msg, replies[msg.request_id].append)
    return replies, drain(eng)


def output(eng: GenerationEngine, result: GenerationResult) -> bytes:
    assert isinstance(result, GenerationResult), result
    return (eng.output_dir / result.file_names[0]).read_bytes()


def test_interleaved_requests_write_the_same_files_as_one_process(group, solo_runner,
                                                                  cosmos3_dir, tmp_path):
    msgs = [media("video", generate_sound=True, num_inference_steps=3),
            media("image", fmt="png", num_frames=1, width=32, height=32, seeds=[8]),
            media("i2v", condition_images=[png(56, 40)], seeds=[4])]
    par_engine = engine(cosmos3_dir, tmp_path / "par", group, LAYOUT)
    parallel, running = run(par_engine, msgs)
    assert max(running) == 3  # all three denoised at once, step by step
    assert any(isinstance(r, GenerationProgress) and r.steps_done == 2
               for r in parallel["video"])
    solo_engine = engine(cosmos3_dir, tmp_path / "solo", solo_runner)
    for msg in msgs:  # each alone on one process
        solo, _ = run(solo_engine, [msg])
        assert output(par_engine, parallel[msg.request_id][-1]) == \
            output(solo_engine, solo[msg.request_id][-1])


def test_cancel_at_a_step_boundary_then_the_group_runs_on(group, solo_runner, cosmos3_dir,
                                                          tmp_path):
    eng = engine(cosmos3_dir, tmp_path / "out", group, LAYOUT)
    replies: list = []
    eng.submit(media("c", num_inference_steps=8), replies.append)
    for _ in range(3):  # prepare + 2 steps
        eng.step()
    assert eng.running[0].state.step_index == 2
    cancelled = eng.running[0].state.batch_id
    eng.cancel("c")
    drain(eng)
    assert isinstance(replies[-1], GenerationCancelled)
    after, _ = run(eng, [media("next", fmt="png", num_frames=1, width=32, height=32)])
    assert cancelled not in group.dropped  # the peers were told to drop it since
    pixels = np.asarray(Image.open(io.BytesIO(output(eng, after["next"][-1]))).convert("RGB"))
    frames, _ = run_to_end(solo_runner, params(num_frames=1, width=32, height=32))
    assert np.array_equal(pixels, (frames[0] * 255).round().astype(np.uint8))


def test_lora_loaded_through_admin_applies_on_every_rank(group, cosmos3_dir, lora_dir,
                                                         tmp_path):
    load = LoraLoad(request_id="l", name="style", path=str(lora_dir), scale=0.8)
    # the base request first and alone: the load left the adapter active on every rank
    msgs = [media("base", fmt="png", num_frames=1, width=32, height=32),
            media("with", fmt="png", num_frames=1, width=32, height=32,
                  lora=[LoraRef(name="style")])]
    outputs = {}
    for name, runner, parallel in (("par", group, LAYOUT), ("solo", None, "")):
        solo = runner or registry.load_runner("generation", cosmos3_dir)
        eng = engine(cosmos3_dir, tmp_path / name, solo, parallel)
        loaded: list = []
        eng.submit(load, loaded.append)
        assert isinstance(loaded[-1], AdminResult), loaded
        outputs[name] = {}
        for msg in msgs:  # one at a time: nothing else re-selects in between
            replies, _ = run(eng, [msg])
            outputs[name][msg.request_id] = output(eng, replies[msg.request_id][-1])
    assert outputs["par"] == outputs["solo"]
    assert outputs["par"]["with"] != outputs["par"]["base"]


def test_policy_actions_with_guidance_equal_one_process(group, solo_runner):
    p = action_params("policy")
    group.activate_lora(())  # the base model (an earlier test left an adapter active)
    frames, extras = run_to_end(group, p)
    ref_frames, ref_extras = run_to_end(solo_runner, p)
    assert np.array_equal(frames, ref_frames)
    assert extras is not None and extras.action.shape == (4, 29)
    assert_extras_close(extras, ref_extras, 0.0)


def test_several_seeds_of_one_policy_request_equal_each_seeds_solo_request(group):
    group.activate_lora(())  # the base model (an earlier test left an adapter active)
    assert_each_seed_equals_its_solo_run(group, action_params("policy", seeds=SEEDS))


def test_a_hung_rank_fails_the_step_after_the_timeout_and_the_group_comes_back(group,
                                                                                solo_runner):
    p = params(num_frames=1, width=32, height=32)
    state = group.prepare(["hung"], [p], p.seeds)
    peer = group.group.pids()[1]
    os.kill(peer, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(StageUnavailable, match="denoising step 1: .*restarting"):
        group.denoise_step(state)
    assert 9 <= time.monotonic() - start < 60  # parallel.timeout_s = 10, then the restart
    assert group.group.epoch == 1 and group.group.pids()[1] != peer
    frames, _ = run_to_end(group, p)  # joins the new group
    assert np.array_equal(frames, run_to_end(solo_runner, p)[0])


def admin(eng: GenerationEngine, msg) -> None:
    replies: list = []
    eng.submit(msg, replies.append)
    drain(eng)  # applied at a step boundary
    assert isinstance(replies[-1], AdminResult), replies


def test_a_weights_update_reaches_every_rank_and_a_restarted_group_replays_it(
        group, cosmos3_dir, tmp_path):
    updated = build_updated(cosmos3_dir, tmp_path / "updated")
    image = media("u", fmt="png", num_frames=1, width=32, height=32)
    engines, outputs = {}, {}
    for name, runner, parallel in (("par", group, LAYOUT), ("solo", None, "")):
        solo = runner or registry.load_runner("generation", cosmos3_dir)
        eng = engines[name] = engine(cosmos3_dir, tmp_path / name, solo, parallel)
        for msg in (WeightsUpdate(request_id="w", path=str(updated)),
                    MemoryRelease(request_id="r"), MemoryResume(request_id="m")):
            admin(eng, msg)
        replies, _ = run(eng, [image])
        outputs[name] = output(eng, replies["u"][-1])
    assert outputs["par"] == outputs["solo"]
    os.kill(group.group.pids()[1], signal.SIGKILL)  # idle: the next request restarts the group
    replies, _ = run(engines["par"], [image])
    assert output(engines["par"], replies["u"][-1]) == outputs["solo"]
    assert group.group.epoch == 2  # (the hung-peer test restarted it once before)
