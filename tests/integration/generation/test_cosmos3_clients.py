"""The client surfaces that need a family with video conditioning and actions (tiny Cosmos3,
a real server): `POST /v1/videos/{id}/remix` continues a finished video, a forward-dynamics job
shows its action at the top level and at `data[0].action`, and `/v1/videos/sync` answers its
video, audio and action as one safetensors body."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.integration.generation.test_clients import openai_video_type
from tests.integration.generation.test_cosmos3_serve import png_data_url, wait
from tests.support.machine import require_module

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

CLIP = {"prompt": "a robot", "size": "48x32", "num_frames": 9, "seed": 3}


@pytest.fixture
def http(server_factory, cosmos3_dir):
    server = server_factory(config={"stages": {"reasoner": {"enabled": False},
                                               "realtime": {"enabled": False}}},
                            args=["--model-path", str(cosmos3_dir)])
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def _content(http: httpx.Client, job_id: str) -> bytes:
    return http.get(f"/v1/videos/{job_id}/content").content


def test_remix_action_shapes_and_tensors(http):
    video_type = openai_video_type()
    source = http.post("/v1/videos", json=CLIP).json()
    running = http.post(f"/v1/videos/{source['id']}/remix", json={"prompt": "again"})
    if running.status_code == 400:  # still queued or running: refused, naming why
        assert "only a completed video" in running.json()["error"]["message"]
    source = wait(http, source["id"])
    assert source["status"] == "completed"

    openai = require_module("openai")
    sdk = openai.OpenAI(base_url=str(http.base_url).rstrip("/") + "/v1", api_key="unused",
                        max_retries=0)
    remix = sdk.videos.remix(source["id"], prompt="a robot, later")  # the SDK's own call
    assert remix.object == "video" and remix.remixed_from_video_id == source["id"]
    done = wait(http, remix.id)
    assert done["status"] == "completed" and done["remixed_from_video_id"] == source["id"]
    assert done["size"] == "48x32" and done["prompt"] == "a robot, later"
    video_type.model_validate(done, strict=True)
    # the source conditions the remix: the same prompt and seed without it differ
    plain = wait(http, http.post("/v1/videos", json={**CLIP, "prompt": "a robot, later"})
                 .json()["id"])
    assert _content(http, done["id"]) != _content(http, plain["id"])
    refused = http.post(f"/v1/videos/{source['id']}/remix",
                        json={"prompt": "x", "video_url": "data:,"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "video_url"

    rows = (np.arange(36, dtype=np.float32).reshape(4, 9) / 36).tolist()
    fd = {"prompt": "drive", "action_mode": "forward_dynamics", "domain_name": "av",
          "action": rows, "input_reference": png_data_url(), "resolution_tier": 256}
    job = wait(http, http.post("/v1/videos", json=fd).json()["id"])
    assert job["action"]["shape"] == [4, 9]
    assert job["data"] == [{"url": job["url"], "action": job["action"]}]
    video_type.model_validate(job, strict=True)

    safetensors_numpy = require_module("safetensors.numpy")
    reply = http.post("/v1/videos/sync", params={"format": "safetensors"},
                      json={**fd, "generate_sound": True})
    assert reply.status_code == 200, reply.text
    tensors = safetensors_numpy.load(reply.content)
    assert tensors["video"].dtype == np.uint8 and tensors["video"].shape[0] == 5
    np.testing.assert_allclose(tensors["action"], np.asarray(rows, np.float32))
    assert tensors["audio"].dtype == np.float32 and tensors["audio"].ndim == 2
    assert int(tensors["audio_sample_rate"]) > 0
