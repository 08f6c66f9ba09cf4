"""The native media routes validate against the stage's declaration, in the api: static rules
answered before anything is relayed (the engine never sees the request), fields a model does not
declare refused by name, messages that name the field the client sent and leak no internals,
warnings for ignored fields and clamped counts, and the relay's in-memory record."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.generation.test_cosmos3_api import png_b64
from tests.unit.generation.test_media_api import finished, serve
from tests.unit.generation.tiny_wan import build_tiny_wan
from worldserve.api.jobs.store import RecordStore
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.ipc.messages import GenerateMedia

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

COSMOS3_VIDEO = {"prompt": "a robot arm", "size": "48x32", "num_frames": 5,
                 "num_inference_steps": 1}
WAN_VIDEO = {"prompt": "a cube", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
GARBAGE = "data:image/png;base64," + base64.b64encode(b"not an image at all" * 4).decode()


def _engine(model_dir: Path, tmp: pytest.TempPathFactory) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=model_dir, batch_wait_ms=0,
                                output_dir=tmp.mktemp("out"))
    return GenerationEngine(cfg, ServerConfig())


@pytest.fixture(scope="module")
def cosmos3(cosmos3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    return _engine(cosmos3_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def wan(tiny_wan_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    return _engine(tiny_wan_dir, tmp_path_factory)


@pytest.fixture
def submitted(cosmos3, wan, monkeypatch) -> list[Any]:
    """Every media request either engine is handed (the api's relays)."""
    seen: list[Any] = []
    for engine in (cosmos3, wan):
        original = engine.submit

        def spy(request, reply, original=original):
            if isinstance(request, GenerateMedia):
                seen.append(request)
            return original(request, reply)

        monkeypatch.setattr(engine, "submit", spy)
    return seen


def fd_rows(count: int, width: int = 9) -> list[list[float]]:
    return np.linspace(-1, 1, count * width).reshape(count, width).round(3).tolist()


FORWARD = {**COSMOS3_VIDEO, "action_mode": "forward_dynamics", "domain_name": "av",
           "resolution_tier": 256}


@pytest.mark.parametrize("body, param, message", [
    ({**COSMOS3_VIDEO, "num_frames": 6}, "num_frames", "num_frames must be 4k+1"),
    ({**COSMOS3_VIDEO, "size": "40x32"}, "width", "width must be a positive multiple of 16"),
    ({**COSMOS3_VIDEO, "input_reference": "IMG", "video_url": "VID"}, "input_reference",
     "not both"),
    # forward dynamics: the horizon is blamed on the field that set it
    ({**FORWARD, "num_frames": None, "action": fd_rows(5), "input_reference": "IMG"},
     "action", "action has 5 rows"),
    ({**FORWARD, "num_frames": 7, "action": fd_rows(6), "input_reference": "IMG"},
     "num_frames", "num_frames must be 4k+1"),
    ({**FORWARD, "num_frames": None, "action": fd_rows(3) + [[0.0] * 8], "input_reference": "IMG"},
     "action", "`action` row 3: width (8) does not match the expected action width (9)"),
    ({**FORWARD, "num_frames": None, "action": fd_rows(4), "input_reference": "IMG",
      "domain_name": "libero"}, "domain_name", "Unknown action domain_name='libero'"),
    ({**FORWARD, "num_frames": None, "action": fd_rows(4), "input_reference": "IMG",
      "resolution_tier": 300}, "resolution_tier", "resolution_tier=300"),
    ({**FORWARD, "num_frames": None, "action": fd_rows(4)}, "image", "needs an observation"),
])
async def test_static_rules_answer_400_in_the_api(cosmos3, submitted, body, param,
                                                  message) -> None:
    image, video = png_b64(), "data:video/mp4;base64," + base64.b64encode(b"v" * 64).decode()
    body = {k: v for k, v in body.items() if v is not None}
    body = json.loads(json.dumps(body).replace('"IMG"', json.dumps(image))
                      .replace('"VID"', json.dumps(video)))
    if "video_url" in body:  # a real clip: the api reads media before the rules
        from tests.unit.generation.test_cosmos3_api import mp4_bytes
        body["video_url"] = "data:video/mp4;base64," + base64.b64encode(mp4_bytes()).decode()
    async for http in serve(cosmos3):
        r = await http.post("/v1/videos", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert message in error["message"] and error["param"] == param, error
    assert "action_horizon" not in error["message"]  # a field /v1/videos never sends
    assert submitted == []  # answered without a round trip to the stage


async def test_actions_route_rules_answer_400_in_the_api(cosmos3, submitted) -> None:
    body = {"input": {"task": "t", "image": png_b64()},
            "parameters": {"action_mode": "policy", "domain_name": "av", "action_horizon": 6,
                           "num_inference_steps": 1}}
    async for http in serve(cosmos3):
        r = await http.post("/v1/actions/generations", json=body)
        tier = await http.post("/v1/actions/generations", json={
            **body, "parameters": {**body["parameters"], "action_horizon": 4,
                                   "resolution_tier": "high"}})
        guidance = await http.post("/v1/actions/generations", json={
            **body, "parameters": {**body["parameters"], "action_horizon": 4,
                                   "guidance_scale": -2}})
        seed = await http.post("/v1/actions/generations", json={
            **body, "parameters": {**body["parameters"], "action_horizon": 4, "seed": 2**70}})
    assert seed.status_code == 400 and seed.json()["error"]["param"] == "seed"
    assert r.status_code == 400 and r.json()["error"]["param"] == "action_horizon"
    assert "action_horizon must be a positive multiple of 4" in r.json()["detail"]
    assert tier.status_code == 400 and tier.json()["error"]["param"] == "resolution_tier"
    assert guidance.status_code == 400
    assert guidance.json()["error"]["param"] == "parameters.guidance_scale"
    assert submitted == []


@pytest.mark.parametrize("field, value", [
    ("generate_sound", True), ("sound_duration", 2.0), ("condition_video_keep", "last"),
    ("action_mode", "forward_dynamics"), ("domain_name", "av"), ("action", [[0.0]]),
])
async def test_fields_a_model_does_not_declare_are_refused_by_name(wan, submitted, field,
                                                                   value) -> None:
    async for http in serve(wan):
        r = await http.post("/v1/videos", json={**WAN_VIDEO, field: value})
        off = await http.post("/v1/videos", json={**WAN_VIDEO, "generate_sound": False})
        if off.status_code == 200:
            await finished(http, off.json())
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert f"{field}: this model (WanPipeline) does not support" in r.json()["detail"]
    assert off.status_code == 200, off.text  # a declared-off value is not a request for it
    assert len(submitted) == 1


async def test_the_action_routes_speak_the_declared_protocol(
        cosmos3, wan, tiny_wan_dir, tmp_path_factory) -> None:
    plain_dir = tmp_path_factory.mktemp("plain-wan") / "generation"
    plain = _engine(build_tiny_wan(plain_dir, action_head=False), tmp_path_factory)
    declared = [e.capabilities().action_api for e in (cosmos3, wan, plain)]
    assert declared == ["world_model", "flow_head", None]
    for engine, family in ((cosmos3, "cosmos3"), (wan, "worldserve-flow")):
        async for http in serve(engine):
            assert (await http.get("/v1/actions/metadata")).json()["policy_family"] == family
    async for http in serve(plain):
        meta = await http.get("/v1/actions/metadata")
        gen = await http.post("/v1/actions/generations", json={"input": {"task": "t"}})
    for r in (meta, gen):
        assert r.status_code == 404 and "generates no actions" in r.json()["detail"]


@pytest.mark.parametrize("path, body", [
    ("/v1/videos", {**COSMOS3_VIDEO, "input_reference": GARBAGE}),
    ("/v1/videos", {**COSMOS3_VIDEO, "video_url": "data:video/mp4;base64,"
                    + base64.b64encode(b"\x00\x01junk" * 9).decode()}),
    ("/v1/actions/generations", {"input": {"task": "t", "image": GARBAGE},
                                 "parameters": {"domain_name": "av", "action_horizon": 4}}),
])
async def test_undecodable_media_errors_leak_no_internals(cosmos3, path, body) -> None:
    async for http in serve(cosmos3):
        r = await http.post(path, json=body)
    assert r.status_code == 400, r.text
    detail = r.json()["detail"]
    assert "not a readable" in detail
    for leak in ("object at 0x", "<_io.", "Errno", "Traceback"):
        assert leak not in detail, detail


@pytest.mark.parametrize("body, param", [
    ({"guidance_scale": -1}, "guidance_scale"),
    ({"guidance_scale_2": float("inf")}, "guidance_scale_2"),
    ({"flow_shift": 0}, "flow_shift"),
    ({"seed": 2**70}, "seed"),
    ({"seed": [1, -2**64]}, "seed"),
])
async def test_out_of_range_numbers_are_400(wan, submitted, body, param) -> None:
    async for http in serve(wan):
        video = await http.post("/v1/videos", content=json.dumps({**WAN_VIDEO, **body}),
                                headers={"content-type": "application/json"})
        image = await http.post("/v1/images/generations", content=json.dumps({"prompt": "a",
                                                                              **body}),
                                headers={"content-type": "application/json"})
    for r in (video, image):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    assert submitted == []


async def test_unknown_fields_and_clamped_counts_are_said_in_a_warning(wan, caplog) -> None:
    caplog.set_level(logging.INFO, logger="worldserve.jobs")
    async for http in serve(wan):
        r = await http.post("/v1/videos", json={**WAN_VIDEO, "guidance_scal": 3, "n": 0})
        await finished(http, r.json())
        image = await http.post("/v1/images/generations", json={
            "prompt": "a", "size": "32x32", "num_inference_steps": 1, "n": 100000,
            "extra_body": {"negativ_prompt": "x"}})
        plain = await http.post("/v1/images/generations", json={
            "prompt": "a", "size": "32x32", "num_inference_steps": 1})
    assert r.status_code == 200 and image.status_code == 200, (r.text, image.text)
    assert r.headers.get_list("x-worldserve-warning") == [
        "n=0 clamped to 1 (outputs per request: 1 to 10)",
        "unknown field(s) ignored: 'guidance_scal'"]
    assert image.headers.get_list("x-worldserve-warning") == [
        "n=100000 clamped to 10 (outputs per request: 1 to 10)",
        "unknown field(s) ignored: 'negativ_prompt'"]
    assert len(image.json()["data"]) == 10
    assert "x-worldserve-warning" not in plain.headers
    assert "/v1/videos: unknown field(s) ignored: 'guidance_scal'" in caplog.text


async def test_the_relay_keeps_the_live_record_and_logs_each_job(cosmos3, monkeypatch,
                                                                 caplog) -> None:
    """The relay reads nothing back from SQLite; it writes status changes (and progress at
    most once a second); one log line per created / started / completed job."""
    caplog.set_level(logging.INFO, logger="worldserve.jobs")
    relay: dict[str, int] = {"get": 0, "save": 0}  # store calls made by the relay task
    for name in relay:
        original = getattr(RecordStore, name)

        def counted(self, *args, name=name, original=original):
            task = asyncio.current_task()
            if task is not None and task.get_coro().__qualname__.endswith("_run_video"):
                relay[name] += 1
            return original(self, *args)

        monkeypatch.setattr(RecordStore, name, counted)
    async for http in serve(cosmos3):
        job = (await http.post("/v1/videos", json={**COSMOS3_VIDEO,
                                                   "num_inference_steps": 4})).json()
        job = await finished(http, job)
        stored = RecordStore(Path(cosmos3.output_dir) / ".worldserve" / "records.sqlite3")
        durable = stored.get(job["id"])
    assert job["status"] == "completed" and durable is not None
    assert durable.status.value == "completed" and durable.progress == 100
    assert relay["get"] == 0  # 6 replies (accepted, 4 steps, result), no read back
    assert 2 <= relay["save"] <= 3  # in_progress and completed; progress at most once a second
    lines = [r.getMessage() for r in caplog.records if job["id"] in r.getMessage()]
    assert [line.split(job["id"])[1].split()[0] for line in lines] == [
        "(video)", "started", "completed"], lines
    assert "completed after" in lines[-1]
