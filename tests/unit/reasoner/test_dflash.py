"""DFlash speculation: replies equal non-speculative decoding token for token (greedy, seeded
sampling, guided, batched, through evictions and re-prefill; sessions that differ by their seed
alone, batched, each as it is alone); the drafter cache follows the session cache; configuration
and loading errors name what is wrong."""

from __future__ import annotations

import time
from itertools import combinations
from pathlib import Path

import pytest
import torch

from tests.support.seeds import SEEDS
from tests.unit.reasoner.conftest import GREEDY
from tests.unit.reasoner.drive import concurrent_replies, seeded_replies, windowed_greedy_replies
from tests.unit.reasoner.reference import reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.config import ConfigError, ReasonerStageConfig, ServerConfig, StreamingConfig
from worldserve.engines.reasoner.dflash import DFlashKV
from worldserve.models.dflash.dev import (
    build_drafter,
    write_constant_drafter,
    write_drafter,
    write_drafter_for,
)
from worldserve.models.types import ModelLoadError


@pytest.fixture(scope="module")
def drafter_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded random drafter for the tiny Qwen2.5-VL: it drafts badly (acceptance ~0)."""
    target = tmp_path_factory.mktemp("drafter")
    write_drafter_for(target, 0, tiny_dir)
    return target


@pytest.fixture(scope="module")
def repeating_drafter_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-set drafter that always drafts the token the tiny target repeats most: its
    blocks are zeroed (the output is the normed input embedding) and its mask token is one whose
    embedding the target's tied lm_head maps to that token. Drafts are then often accepted, which
    exercises the partial-acceptance paths (target and drafter caches cropped mid-block)."""
    from transformers import AutoModelForImageTextToText

    target = tmp_path_factory.mktemp("repeating-drafter")
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    write_constant_drafter(target, 0, tiny_dir, model, REPEATED_TOKEN)
    return target


REPEATED_TOKEN = 205  # what the tiny Qwen2.5-VL (seed 0) answers greedily, over and over


def _replies(drv, sampling, num_frames=6, retention=None, check_lockstep=True, size=56):
    drv.create(retention=retention or {"max_video_segments": 2}, sampling=sampling)
    session = drv.engine.sessions["s1"]
    out, reprefills = [], 0
    for i in range(num_frames):
        result = drv.frame("s1", frame_bytes(i, size=size + 56 * (i % 2)))
        reprefills += result.reprefill_ms is not None
        out.append((reply_tokens(session), result.text, result.finish_reason))
        if check_lockstep:
            assert len(session.kv.drafter) == len(session.kv)  # one context entry per token
    return out, reprefills


# ~54 positions a frame: a re-prefill past 0.51 x 2048 after ~20 frames, evictions all along
REPREFILL = dict(num_frames=21, size=224, retention={
    "max_video_segments": 2, "reprefill_threshold": 0.51, "max_session_tokens": 1024})


@pytest.fixture(scope="module")
def plain_reprefill_replies(tiny_dir: Path) -> list:
    from tests.unit.reasoner.conftest import Driver
    from worldserve.engines.reasoner.engine import ReasonerEngine

    drv = Driver(ReasonerEngine(ReasonerStageConfig(model_path=tiny_dir), ServerConfig()))
    return _replies(drv, {"max_tokens": 24, **GREEDY}, check_lockstep=False, **REPREFILL)[0]


@pytest.mark.parametrize("drafter", ["random", "repeating"])
def test_greedy_replies_equal_plain_decoding_through_eviction_and_reprefill(
        make_engine, drafter, drafter_dir, repeating_drafter_dir, plain_reprefill_replies):
    path = drafter_dir if drafter == "random" else repeating_drafter_dir
    drv = make_engine(spec_method="dflash", spec_model_path=path, spec_num_tokens=3)
    got, reprefills = _replies(drv, {"max_tokens": 24, **GREEDY}, **REPREFILL)
    assert got == plain_reprefill_replies
    assert reprefills >= 1  # the drafter cache was rebuilt from the re-prefill's hidden states
    extra = drv.engine.stats()["extra"]
    assert extra["spec_drafted"] > 0 and extra["spec_steps"] > 0
    if drafter == "repeating":  # the greedy target repeats one token: every draft fits
        assert extra["spec_accepted"] > 0


def test_seeded_sampling_is_lossless(make_engine, repeating_drafter_dir):
    sampling = {"max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7,
                "repetition_penalty": 1.1, "frequency_penalty": 0.3, "presence_penalty": 0.2}
    plain, _ = _replies(make_engine(), sampling, check_lockstep=False)
    drv = make_engine(spec_method="dflash", spec_model_path=repeating_drafter_dir,
                      spec_num_tokens=3)
    assert _replies(drv, sampling)[0] == plain
    extra = drv.engine.stats()["extra"]
    assert 0 < extra["spec_accepted"] < extra["spec_drafted"]  # blocks cut mid-way too


@pytest.mark.parametrize("guide", [{"guided_choice": ["clear", "hazard ahead"]},
                                   {"guided_regex": "[0-9]{3}"}])
def test_guided_replies_equal_plain_decoding(make_engine, repeating_drafter_dir, guide):
    sampling = {"max_tokens": 24, "temperature": 0.7, "seed": 1, **guide}
    plain, _ = _replies(make_engine(), sampling, num_frames=4, check_lockstep=False)
    drv = make_engine(spec_method="dflash", spec_model_path=repeating_drafter_dir)
    got, _ = _replies(drv, sampling, num_frames=4)
    assert got == plain
    assert all(finish == "stop" for _, _, finish in got)
    assert drv.engine.stats()["extra"]["spec_drafted"] > 0


def _drafter_in_step(session) -> None:
    """One drafter context entry per token of the target cache (the two are separate
    objects: the DFlash cache wraps the target's)."""
    kv = session.kv
    assert isinstance(kv, DFlashKV) and kv.drafter is not kv.inner
    assert len(kv.drafter) == len(kv.inner.ids) > 0


def _concurrent(drv, sampling, after_frame=None):
    return concurrent_replies(drv, sampling, num_frames=3,
                              retention={"max_video_segments": 1}, after_frame=after_frame)


@pytest.mark.parametrize("sampling", [
    {"max_tokens": 10, **GREEDY},  # the target repeats itself: drafts accepted
    {"max_tokens": 10, "temperature": 0.8, "seed": 11, "repetition_penalty": 1.2},
])
def test_batched_decode_with_drafts_equals_sequential_plain(make_engine, repeating_drafter_dir,
                                                            sampling):
    batched = make_engine(max_sessions=3, spec_method="dflash",
                          spec_model_path=repeating_drafter_dir)
    sequential = make_engine(max_sessions=3)
    sequential.engine.scheduler.batch_decode = False
    assert _concurrent(batched, sampling, _drafter_in_step) == _concurrent(sequential, sampling)
    extra = batched.engine.stats()["extra"]
    assert extra["spec_drafted"] > 0
    if sampling["temperature"] == 0:
        assert extra["spec_accepted"] > 0


def test_sessions_differing_by_seed_batched_with_drafts_each_equal_their_solo_session(
        make_engine, repeating_drafter_dir):
    # low enough a temperature that some drafts are kept (7 of ~285 measured), high enough that
    # the seeds' replies differ
    sampling = {"max_tokens": 16, "temperature": 0.2, "repetition_penalty": 1.0}
    spec = dict(max_sessions=len(SEEDS), spec_method="dflash",
                spec_model_path=repeating_drafter_dir)
    batched = make_engine(**spec)
    together = seeded_replies(batched, sampling, SEEDS)
    assert batched.engine.stats()["extra"]["spec_accepted"] > 0  # drafts were kept
    for alone in (make_engine(**spec), make_engine(max_sessions=len(SEEDS))):  # and plain
        for seed in SEEDS:
            assert seeded_replies(alone, sampling, [seed]) == {seed: together[seed]}, seed
    for a, b in combinations(SEEDS, 2):
        assert together[a] != together[b], (a, b)


def test_cosmos3_dev_drafter_is_lossless(make_engine, cosmos3_dir, tmp_path):
    start = time.perf_counter()
    build_drafter(tmp_path, 0)  # the dev builder (BUILDERS["cosmos3-drafter"])
    assert time.perf_counter() - start < 1.0

    spec = make_engine(cosmos3_dir, spec_method="dflash", spec_model_path=tmp_path)
    assert windowed_greedy_replies(spec) == windowed_greedy_replies(make_engine(cosmos3_dir))
    assert spec.engine.capabilities().spec_method == "dflash"


# ---------------------------------------------------------------- the drafter cache


def test_drafter_cache_after_evictions_equals_one_built_from_the_kept_tokens(tiny_dir,
                                                                             drafter_dir):
    """Context K/V entries are per token (hidden state, position), so evicting a range from a
    drafter cache must leave exactly the cache of the kept tokens fed at once; its drafts agree."""
    from worldserve.models.qwen_vl.runner import load_runner
    from worldserve.models.registry import load_drafter

    drafter = load_drafter(drafter_dir, load_runner(tiny_dir).model)
    gen = torch.Generator().manual_seed(0)
    hidden = {i: torch.randn(1, 40, 64, generator=gen) for i in drafter.tap.layer_ids}
    positions = torch.arange(40) + 3 * (torch.arange(40) >= 20)  # a gap, as eviction leaves

    state = drafter.new_state()
    for lo, hi in [(0, 15), (15, 32)]:  # two drafts' worth of context in the drafter cache
        state.extend({i: h[:, lo:hi] for i, h in hidden.items()}, positions[lo:hi])
        state.draft(7, 3)
    state.extend({i: h[:, 32:] for i, h in hidden.items()}, positions[32:])  # still pending
    state.evict(5, 12)
    state.evict(20, 26)  # [27, 33) of the original: straddles the last fed chunk
    keep = torch.ones(40, dtype=torch.bool)
    keep[5:12] = False
    keep[27:33] = False
    assert len(state) == int(keep.sum())

    fresh = drafter.new_state()
    fresh.extend({i: h[:, keep] for i, h in hidden.items()}, positions[keep])
    assert fresh.draft(7, 3) == state.draft(7, 3)
    for ours, ref in zip(state.generator.cache.layers, fresh.generator.cache.layers):
        torch.testing.assert_close(ours.keys, ref.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, rtol=1e-5, atol=1e-5)


def test_sliding_window_drafter_layers_follow_eviction(tiny_dir, drafter_dir, tmp_path):
    """transformers' default drafter layers are sliding-window ones (only the last window - 1
    context tokens kept). Evicting older tokens leaves what a cache of the kept tokens holds;
    evicting inside the window shrinks it, and drafting still works."""
    import json
    import shutil

    from worldserve.models.qwen_vl.runner import load_runner
    from worldserve.models.registry import load_drafter

    shutil.copytree(drafter_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(layer_types=["sliding_attention"], sliding_window=8)
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = load_drafter(tmp_path, load_runner(tiny_dir).model)
    gen = torch.Generator().manual_seed(1)
    hidden = {i: torch.randn(1, 40, 64, generator=gen) for i in drafter.tap.layer_ids}

    def fed(state, lo, hi):
        state.extend({i: h[:, lo:hi] for i, h in hidden.items()}, torch.arange(lo, hi))

    state = drafter.new_state()
    fed(state, 0, 20)
    state.draft(7, 3)
    fed(state, 20, 30)
    state.draft(7, 3)
    state.evict(4, 12)  # older than the window (the last 7 of 30 tokens)
    fresh = drafter.new_state()
    keep = torch.cat([torch.arange(4), torch.arange(12, 30)])
    fresh.extend({i: h[:, keep] for i, h in hidden.items()}, keep)
    fed(state, 30, 31)
    fed(fresh, 30, 31)
    assert state.draft(7, 3) == fresh.draft(7, 3)
    layer, ref = state.generator.cache.layers[0], fresh.generator.cache.layers[0]
    assert layer.keys.shape[-2] == 7
    torch.testing.assert_close(layer.keys, ref.keys, rtol=1e-5, atol=1e-5)

    state.evict(len(state) - 3, len(state) - 1)  # inside the window
    fed(state, 31, 33)
    assert len(state.draft(7, 3)) == 3
    assert len(state) == 23 - 2 + 2 and layer.keys.shape[-2] <= 7


# ---------------------------------------------------------------- configuration


def test_dflash_without_a_drafter_is_a_startup_error_naming_the_setting():
    with pytest.raises(ValueError, match=r"streaming\.spec_model_path"):
        StreamingConfig(spec_method="dflash")
    from worldserve.config import build_config

    with pytest.raises(ConfigError, match=r"spec_model_path"):
        build_config({"stages": {"reasoner": {"streaming": {"spec_method": "dflash"}}}})


def test_dflash_needs_the_hf_backend(tmp_path):
    with pytest.raises(ValueError, match="needs the hf backend"):
        ReasonerStageConfig(backend="fake", streaming=StreamingConfig(
            spec_method="dflash", spec_model_path=tmp_path))


def test_a_directory_that_is_no_drafter_is_a_startup_error_saying_what_was_found(tiny_dir):
    from worldserve.engines.reasoner.engine import ReasonerEngine

    stage = ReasonerStageConfig(model_path=tiny_dir, streaming=StreamingConfig(
        spec_method="dflash", spec_model_path=tiny_dir))
    with pytest.raises(ModelLoadError, match=r"not a DFlash drafter directory: found "
                                             r"config\.json model_type='qwen2_5_vl'"):
        ReasonerEngine(stage, ServerConfig())


def test_a_missing_drafter_directory_is_a_startup_error(tiny_dir, tmp_path):
    from worldserve.engines.reasoner.engine import ReasonerEngine

    stage = ReasonerStageConfig(model_path=tiny_dir, streaming=StreamingConfig(
        spec_method="dflash", spec_model_path=tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match=r"spec_model_path .*nope' is not a directory"):
        ReasonerEngine(stage, ServerConfig())


def test_a_drafter_of_another_model_is_a_startup_error(tiny_dir, tmp_path):
    from worldserve.engines.reasoner.engine import ReasonerEngine

    write_drafter(tmp_path, 0, hidden_size=32, num_target_layers=6, vocab_size=100_000)
    stage = ReasonerStageConfig(model_path=tiny_dir, streaming=StreamingConfig(
        spec_method="dflash", spec_model_path=tmp_path))
    with pytest.raises(ModelLoadError) as err:
        ReasonerEngine(stage, ServerConfig())
    message = str(err.value)
    assert "hidden_size 32 != the target's 64" in message
    assert "target_layer_ids [5] outside the target's 2 layers" in message
    assert "mask_token_id 99999 outside the target's vocabulary" in message


def test_chat_completion_equals_plain_decoding(make_engine, repeating_drafter_dir):
    from worldserve.ipc.messages import ChatCompletion, ChatMessage, ChatPart, ReasonerSampling

    def chat(drv, **sampling):
        return drv.call(ChatCompletion(
            request_id="chat", sampling=ReasonerSampling(max_tokens=16, **sampling),
            messages=[ChatMessage(role="user", parts=[
                ChatPart(type="image", image=frame_bytes(3)),
                ChatPart(type="text", text="What is it?")])]))

    for sampling in (GREEDY, {"temperature": 0.9, "seed": 2}):
        spec = make_engine(spec_method="dflash", spec_model_path=repeating_drafter_dir)
        got, plain = chat(spec, **sampling), chat(make_engine(), **sampling)
        assert (got.text, got.completion_tokens) == (plain.text, plain.completion_tokens)
        assert spec.engine.stats()["extra"]["spec_drafted"] > 0
