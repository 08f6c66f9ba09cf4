"""Step caching end to end: `enable_teacache` turns caching on for one request (the job object
reports its forwards and skipped forwards), a model whose family declares no cache method
answers 400 naming the field, the server's `step_cache` settings (default on, turned off)
apply, and unsupported methods are startup errors that say why."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.unit.generation.test_cosmos3_engine import Replies, drain, engine_for, media
from tests.unit.generation.test_media_api import finished, serve
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import GenerationResult
from worldserve.levers.step_cache import METHODS

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VIDEO = {"prompt": "a robot arm", "size": "48x32", "num_frames": 5, "num_inference_steps": 6}


@pytest.fixture(scope="module")
def cosmos3(cosmos3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    return engine_for(cosmos3_dir, tmp_path_factory.mktemp("out"))


@pytest.fixture(scope="module")
def wan(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, batch_wait_ms=0,
                                output_dir=tmp_path_factory.mktemp("wan"))
    return GenerationEngine(cfg, ServerConfig())


def result_of(engine: GenerationEngine, msg) -> GenerationResult:
    replies = Replies()
    engine.submit(msg, replies)
    drain(engine)
    assert isinstance(replies.last, GenerationResult), replies.last
    return replies.last


def test_the_stage_declares_its_method_and_a_request_opts_in(cosmos3):
    caps = cosmos3.capabilities()
    assert caps.step_cache == "seacache" and caps.step_cache_methods == METHODS
    cached = result_of(cosmos3, media("c", num_inference_steps=6, step_cache=True, seeds=[1, 2]))
    report = cached.step_cache
    assert report.method == "seacache" and report.num_forwards == 2 * 6 * 2  # rows x steps x cfg
    assert 0 < report.num_forwards_skipped < report.num_forwards
    assert result_of(cosmos3, media("p", num_inference_steps=6)).step_cache is None
    assert cosmos3.runner.step_cache.num_contexts() == 0


def test_server_settings_default_on_and_off(cosmos3_dir, tmp_path):
    on = engine_for(cosmos3_dir, tmp_path / "on",
                    step_cache={"method": "taylorseer", "interval": 2, "default": True})
    assert result_of(on, media("d")).step_cache.method == "taylorseer"
    assert result_of(on, media("n", step_cache=False)).step_cache is None
    off = engine_for(cosmos3_dir, tmp_path / "off", step_cache={"enabled": False})
    assert off.capabilities().step_cache is None and off.runner.step_cache is None
    with pytest.raises(InvalidRequest) as err:
        off.submit(media("x", step_cache=True), Replies())
    assert err.value.param == "enable_teacache" and "turned off" in err.value.message


@pytest.mark.parametrize("method, why", [("magcache", "mag_ratios"),
                                         ("fbcache", "hidden_states"),
                                         ("teacache", "coefficients")])
def test_methods_that_cannot_run_on_cosmos3_are_config_errors(method, why):
    with pytest.raises(ValidationError, match=why):
        GenerationStageConfig(step_cache={"method": method})
    with pytest.raises(ValidationError, match="interval"):
        GenerationStageConfig(step_cache={"method": "taylorseer", "threshold": 0.1})


async def test_enable_teacache_reaches_the_job_object(cosmos3) -> None:
    async for http in serve(cosmos3):
        job = (await http.post("/v1/videos", json={**VIDEO, "enable_teacache": True})).json()
        job = await finished(http, job)
        plain = await finished(http, (await http.post("/v1/videos", json=VIDEO)).json())
        image = await http.post("/v1/images/generations", json={
            "prompt": "a cube", "size": "32x32", "num_inference_steps": 6,
            "enable_teacache": True})
    assert job["status"] == "completed", job
    cache = job["step_cache"]
    assert cache["method"] == "seacache" and cache["num_forwards"] == 12
    assert 0 < cache["num_forwards_skipped"] < 12
    assert plain["status"] == "completed" and plain["step_cache"] is None
    assert image.status_code == 200, image.text
    assert image.json()["step_cache"]["num_forwards"] == 12


async def test_a_model_that_cannot_cache_answers_400(wan) -> None:
    assert wan.capabilities().step_cache_methods == () and wan.capabilities().step_cache is None
    async for http in serve(wan):
        video = await http.post("/v1/videos", json={"prompt": "a cube", "size": "64x64",
                                                    "num_frames": 5, "enable_teacache": True})
        image = await http.post("/v1/images/generations", json={"prompt": "a cube",
                                                                "enable_teacache": True})
        off = await http.post("/v1/images/generations", json={"prompt": "a cube",
                                                              "size": "64x64",
                                                              "num_inference_steps": 1,
                                                              "enable_teacache": False})
    for r in (video, image):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "enable_teacache"
        assert "does not support it" in r.json()["error"]["message"]
    assert off.status_code == 200, off.text
