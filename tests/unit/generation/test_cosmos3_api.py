"""The native media routes on a Cosmos3 checkpoint, through the real app and the in-process
stage client (no sockets): images, videos with sound / image / video conditioning / forward
dynamics, actions (JSON, msgpack, multipart), metadata, and the spec's 400s."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from PIL import Image

from tests.unit.generation.test_media_api import finished, serve
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.media.video import decode_audio, decode_frames, encode_mp4

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VIDEO = {"prompt": "a robot arm", "size": "48x32", "num_frames": 5, "num_inference_steps": 2}


@pytest.fixture(scope="module")
def engine(cosmos3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=cosmos3_dir, batch_wait_ms=0,
                                output_dir=tmp_path_factory.mktemp("out"))
    return GenerationEngine(cfg, ServerConfig())


def png_b64(width: int = 56, height: int = 40) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3),
                                                       dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def mp4_bytes(frames: int = 5, width: int = 56, height: int = 40) -> bytes:
    buf = io.BytesIO()
    encode_mp4(np.random.default_rng(1).integers(0, 255, (frames, height, width, 3),
                                                 dtype=np.uint8), 8, buf, 90)
    return buf.getvalue()


async def test_image_generation_defaults_to_b64_png(engine) -> None:
    async for http in serve(engine):
        r = await http.post("/v1/images/generations", json={"prompt": "a cup", "n": 2})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert len(data) == 2 and data[0]["url"] is None
        image = Image.open(io.BytesIO(base64.b64decode(data[0]["b64_json"])))
        assert image.format == "PNG" and image.size == (32, 32)


async def test_video_with_sound_has_an_aac_track(engine) -> None:
    async for http in serve(engine):
        job = (await http.post("/v1/videos", json={**VIDEO, "generate_sound": True})).json()
        job = await finished(http, job)
        assert job["status"] == "completed", job
        data = (await http.get(job["url"])).content
        assert len(decode_frames(data)) == 5
        audio = decode_audio(data)
        assert audio is not None and audio[0].shape[0] == 2


async def test_image_and_video_conditioning(engine) -> None:
    async for http in serve(engine):
        job = (await http.post("/v1/videos", json={**VIDEO,
                                                   "input_reference": png_b64()})).json()
        assert (await finished(http, job))["status"] == "completed"
        files = {"video_reference": ("clip.mp4", mp4_bytes(9, 48, 32), "video/mp4")}
        form = {**{k: str(v) for k, v in VIDEO.items()}, "num_frames": "9",
                "condition_frame_indexes_vision": "[0]", "condition_video_keep": "last"}
        r = await http.post("/v1/videos", data=form, files=files)
        assert r.status_code == 200, r.text
        assert (await finished(http, r.json()))["status"] == "completed"


async def test_forward_dynamics_job_carries_its_action(engine) -> None:
    rows = np.linspace(-1, 1, 36).reshape(4, 9).round(3).tolist()
    body = {**VIDEO, "action_mode": "forward_dynamics", "domain_name": "av", "action": rows,
            "input_reference": png_b64(), "resolution_tier": 256}
    body.pop("num_frames")
    async for http in serve(engine):
        r = await http.post("/v1/videos", json=body)
        assert r.status_code == 200, r.text
        job = await finished(http, r.json())
        assert job["status"] == "completed", job
        assert job["action"]["shape"] == [4, 9] and job["action"]["domain_id"] == 1
        assert job["action"]["action_mode"] == "forward_dynamics"
        assert job["size"] == "48x32"  # follows the 40x56 observation, floored to 16
        assert len(decode_frames((await http.get(job["url"])).content)) == 5


ACTION = {"input": {"task": "pick up the cup", "image": None},
          "parameters": {"action_mode": "policy", "domain_name": "droid_lerobot",
                         "action_horizon": 4, "num_inference_steps": 2,
                         "resolution_tier": 256}}


def action_request(**parameters: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(ACTION))
    body["input"]["image"] = png_b64()
    body["parameters"].update(parameters)
    return body


async def test_policy_actions_json_and_candidates(engine) -> None:
    async for http in serve(engine):
        r = await http.post("/v1/actions/generations", json=action_request())
        assert r.status_code == 200, r.text
        action = r.json()["data"][0]["action"]
        assert action["shape"] == [4, 10] and action["domain_id"] == 8
        assert action["action_mode"] == "policy" and action["raw_action_dim"] == 10
        two = await http.post("/v1/actions/generations",
                              json=action_request(candidate_count=2, return_candidates=True))
        each = [np.array(d["action"]["values"]) for d in two.json()["data"]]
        mean = await http.post("/v1/actions/generations",
                               json=action_request(candidate_count=2, candidate_reducer="mean"))
        assert np.allclose(np.array(mean.json()["data"][0]["action"]["values"]),
                           (each[0] + each[1]) / 2, atol=1e-6)
        assert np.array_equal(each[0], np.array(action["values"]))  # candidate 0 = seed 42


async def test_inverse_dynamics_msgpack_and_multipart(engine) -> None:
    video = mp4_bytes()
    async for http in serve(engine):
        body = {"input": {"task": "", "video": "data:video/mp4;base64,"
                          + base64.b64encode(video).decode()},
                "parameters": {"action_mode": "inverse_dynamics", "domain_name": "av",
                               "action_horizon": 4, "num_inference_steps": 2,
                               "resolution_tier": 256}}
        r = await http.post("/v1/actions/generations", content=msgpack.packb(body),
                            headers={"content-type": "application/msgpack"})
        assert r.status_code == 200, r.text
        reply = msgpack.unpackb(r.content)
        values = reply["data"][0]["action"]["values"]
        assert values["__ndarray__"] and values["shape"] == [4, 9]
        request = {"parameters": body["parameters"]}
        r = await http.post("/v1/actions/generations", data={"request": json.dumps(request)},
                            files={"video": ("clip.mp4", video, "video/mp4")})
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["action"]["shape"] == [4, 9]


async def test_metadata_is_read_from_the_checkpoint(engine) -> None:
    async for http in serve(engine):
        meta = (await http.get("/v1/actions/metadata")).json()
        assert meta["policy_family"] == "cosmos3"
        assert meta["output"]["padded_action_dim"] == 64
        assert meta["capabilities"]["action_modes"] == ["policy", "inverse_dynamics"]
        assert meta["domains"]["hand_pose"] == {"domain_id": 3, "raw_action_dim": 57}
        assert "libero" not in meta["domains"]


@pytest.mark.parametrize("path, body, message", [
    ("/v1/videos", {**VIDEO, "num_frames": 6}, "num_frames must be 4k+1"),
    ("/v1/videos", {**VIDEO, "input_reference": "IMG", "video_url": "VID"}, "not both"),
    ("/v1/videos", {**VIDEO, "action_mode": "policy"}, "use POST /v1/actions/generations"),
    ("/v1/videos", {**VIDEO, "num_frames": None, "action_mode": "forward_dynamics",
                    "domain_name": "av", "action": [[0.0] * 8] * 4, "input_reference": "IMG"},
     "width (8) does not match the expected action width (9)"),
    ("/v1/videos", {**VIDEO, "condition_frame_indexes_vision": "x"}, "JSON array"),
    ("/v1/actions/generations", {"parameters": {"action_mode": "forward_dynamics"}},
     "use /v1/videos"),
    ("/v1/actions/generations", "UNKNOWN_DOMAIN", "Unknown action domain_name='mars_rover'"),
    ("/v1/actions/generations", "BAD_HORIZON", "action_horizon must be a positive multiple"),
    ("/v1/actions/generations", "ID_WITHOUT_VIDEO", "'inverse_dynamics' requires a video"),
    ("/v1/actions/generations", "IMAGE_AND_VIDEO", "mutually exclusive"),
    ("/v1/actions/generations", "DOMAIN_ID_ONLY", "domain_id and raw_action_dim together"),
])
async def test_bad_inputs_are_400_with_a_clear_message(engine, path, body, message) -> None:
    image, video = png_b64(), "data:video/mp4;base64," + base64.b64encode(mp4_bytes()).decode()
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if v is not None}
        body = json.loads(json.dumps(body).replace('"IMG"', json.dumps(image))
                          .replace('"VID"', json.dumps(video)))
    else:
        special = {
            "UNKNOWN_DOMAIN": action_request(domain_name="mars_rover"),
            "BAD_HORIZON": action_request(action_horizon=5),
            "ID_WITHOUT_VIDEO": action_request(action_mode="inverse_dynamics"),
            "IMAGE_AND_VIDEO": {**action_request(),
                                "input": {**action_request()["input"], "video": video}},
            "DOMAIN_ID_ONLY": action_request(domain_name=None, domain_id=8),
        }
        body = special[body]
        body["parameters"] = {k: v for k, v in body["parameters"].items() if v is not None}
    async for http in serve(engine):
        r = await http.post(path, json=body)
        assert r.status_code == 400, r.text
        assert message in r.json()["detail"]


async def test_image_edits_name_videos_with_input_reference(engine) -> None:
    async for http in serve(engine):
        r = await http.post("/v1/images/edits", data={"prompt": "x"},
                            files={"image": ("a.png", b"\x89PNG", "image/png")})
        assert r.status_code == 400
        assert "/v1/videos" in r.json()["detail"] and "input_reference" in r.json()["detail"]
