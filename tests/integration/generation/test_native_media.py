"""Native media routes against one live server: OpenAI SDK and SGLang-style clients (spec §11),
flattening, forbidden fields, bad input, actions (JSON and msgpack)."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import msgpack
import numpy as np
import pytest
from PIL import Image

from tests.support.machine import require_module
from worldserve.api.schemas.actions import decode_numpy, encode_numpy
from worldserve.media.video import decode_frames

FAST = {"num_inference_steps": 2}
VIDEO = {"size": "64x64", "num_frames": 9, "num_inference_steps": 3}


def png(size=(40, 32), color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def http(gen_server):
    with httpx.Client(base_url=gen_server.base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(gen_server):
    openai = require_module("openai")
    return openai.OpenAI(base_url=gen_server.base_url + "/v1", api_key="unused", max_retries=0)


def wait_job(http, job_id, timeout_s=30.0):
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{job_id}").json()
        seen.append((job["status"], job["progress"]))
        if job["status"] in ("completed", "failed", "cancelled"):
            return job, seen
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish: {seen[-3:]}")


def assert_error(resp, status, fragment):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert fragment in body["error"]["message"], body
    assert body["error"]["code"] == status and "Traceback" not in resp.text
    return body


# ---------------------------------------------------------------------- OpenAI SDK


def test_sdk_images_generate_both_formats(sdk, http):
    b64 = sdk.images.generate(
        prompt="a red car", size="64x64", response_format="b64_json", extra_body=FAST
    )
    img = Image.open(io.BytesIO(base64.b64decode(b64.data[0].b64_json)))
    assert img.format == "PNG" and img.size == (64, 64)
    by_url = sdk.images.generate(
        prompt="a red car", size="64x64", n=2, output_format="jpeg", extra_body=FAST
    )
    assert len(by_url.data) == 2 and by_url.data[1].url.endswith("?variant=1")
    got = http.get(by_url.data[1].url)
    assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(got.content)).size == (64, 64)
    # same seed, same parameters: same pixels (generation is deterministic)
    again = sdk.images.generate(
        prompt="a red car", size="64x64", response_format="b64_json", extra_body=FAST
    )
    assert again.data[0].b64_json == b64.data[0].b64_json


def test_sdk_images_edit_single_and_list(sdk):
    one = sdk.images.edit(
        image=("in.png", png(), "image/png"), prompt="make it blue", size="64x64", extra_body=FAST
    )
    assert Image.open(io.BytesIO(base64.b64decode(one.data[0].b64_json))).size == (64, 64)
    two = sdk.images.edit(
        image=[("a.png", png(), "image/png"), ("b.png", png(color=(0, 0, 200)), "image/png")],
        prompt="blend",
        size="64x64",
        extra_body=FAST,
    )
    assert two.data[0].b64_json and two.data[0].b64_json != one.data[0].b64_json


def test_sdk_video_lifecycle(sdk, http):
    job = sdk.videos.create(
        prompt="a red car", size="64x64", extra_body={"num_frames": 9, "num_inference_steps": 40}
    )
    assert job.status == "queued" and job.progress == 0
    seen = []
    while True:
        current = sdk.videos.retrieve(job.id)
        seen.append((current.status, current.progress))
        if current.status in ("completed", "failed"):
            break
        time.sleep(0.01)
    assert current.status == "completed" and current.progress == 100
    progress = [p for status, p in seen if status == "in_progress"]
    assert len(set(progress)) >= 2 and progress == sorted(progress)  # rising progress
    # 0 from admission (phase `encode`) until the first denoising step; 100 only once completed
    assert all(0 <= p < 100 for p in progress)
    content = sdk.videos.download_content(job.id, variant="video").read()
    frames = decode_frames(content)
    assert len(frames) == 9 and frames[0].shape == (64, 64, 3)
    other = sdk.videos.create(prompt="second", size="64x64", extra_body=VIDEO)
    wait_job(http, other.id)
    first_page = sdk.videos.list(limit=1)
    assert first_page.data[0].id == other.id and first_page.has_more
    ids = [v.id for v in sdk.videos.list(limit=1)]  # the SDK pages with after=last_id
    assert ids.index(other.id) < ids.index(job.id)
    deleted = sdk.videos.delete(job.id)
    assert deleted.id == job.id and deleted.deleted is True
    assert http.get(f"/v1/videos/{job.id}").status_code == 404
    assert http.delete(f"/v1/videos/{job.id}").status_code == 404


# ---------------------------------------------------------------------- SGLang-style JSON client


def test_sglang_style_video_with_extra_body(http, gen_server):
    resp = http.post(
        "/v1/videos",
        json={
            "prompt": "a cube",
            "size": "64x64",
            "extra_body": {"num_frames": 9, "fps": 4, "num_inference_steps": 2},
        },
    )
    assert resp.status_code == 200, resp.text
    job, _ = wait_job(http, resp.json()["id"])
    assert job["status"] == "completed" and job["seconds"] == "2"
    assert job["file_path"] is None  # server paths only with --show-server-paths
    gone = http.delete(f"/v1/videos/{job['id']}").json()
    assert gone["status"] == "deleted" and gone["deleted"] is True
    assert not list((gen_server.workdir / "outputs").glob(f"{job['id']}*"))


def test_image_to_video_with_data_url_and_multipart(http):
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    resp = http.post("/v1/videos", json={"prompt": "go", "input_reference": data_url, **VIDEO})
    job, _ = wait_job(http, resp.json()["id"])
    assert job["status"] == "completed"
    form = http.post(
        "/v1/videos",
        data={"prompt": "go", "size": "64x64", "num_frames": "9", "num_inference_steps": "2"},
        files={"input_reference": ("ref.png", png(), "image/png")},
    )
    assert wait_job(http, form.json()["id"])[0]["status"] == "completed"


def test_delete_running_job_cancels_it(http, gen_server):
    resp = http.post(
        "/v1/videos",
        json={"prompt": "long", "size": "64x64", "num_frames": 9, "num_inference_steps": 1000},
    )
    job_id = resp.json()["id"]
    while http.get(f"/v1/videos/{job_id}").json()["status"] == "queued":
        time.sleep(0.01)
    gone = http.delete(f"/v1/videos/{job_id}").json()
    assert gone["status"] == "deleted"
    assert http.get(f"/v1/videos/{job_id}").status_code == 404
    # the stage stopped it: a short job right after finishes promptly
    quick = http.post("/v1/videos", json={"prompt": "next", **VIDEO}).json()
    assert wait_job(http, quick["id"], timeout_s=10)[0]["status"] == "completed"
    assert not list((gen_server.workdir / "outputs").glob(f"*{job_id}*"))


def test_list_paging_rules(http):
    assert_error(
        http.get("/v1/videos", params={"limit": 0}), 400, "limit must be an integer from 1 to 100"
    )
    assert_error(
        http.get("/v1/videos", params={"limit": 101}), 400, "limit must be an integer from 1 to 100"
    )
    assert_error(
        http.get("/v1/videos", params={"order": "sideways"}), 400, "order must be one of asc, desc"
    )
    assert http.get("/v1/videos", params={"after": "nope"}).json()["data"] == []
    desc = [j["id"] for j in http.get("/v1/videos", params={"order": "desc"}).json()["data"]]
    asc = [j["id"] for j in http.get("/v1/videos", params={"order": "asc"}).json()["data"]]
    assert desc == list(reversed(asc)) and len(desc) >= 2


# ---------------------------------------------------------------------- flattening and policy


def test_flattening_rules(http):
    ok = http.post(
        "/v1/images/generations",
        json={
            "prompt": "x",
            "size": "64x64",
            "response_format": "b64_json",
            "num_inference_steps": 2,
            "extra_params": json.dumps({"num_inference_steps": 999, "seed": 3}),
        },
    )
    assert ok.status_code == 200  # top-level steps kept (999 would be slow), seed taken
    assert_error(
        http.post("/v1/images/generations", json={"prompt": "x", "extra_params": "not json"}),
        400,
        "extra_params must be a JSON object",
    )
    for body in (
        {"prompt": "x", "extra_body": {"output_path": "/tmp"}},
        {"prompt": "x", "diffusers_kwargs": {"lora_path": "/x"}},
        {"prompt": "x", "extra_json": json.dumps({"vae_model_path": "/x"})},
        {"prompt": "x", "diffusers_kwargs": {"a": json.dumps({"perf_dump_path": "/x"})}},
    ):
        assert_error(
            http.post("/v1/images/generations", json=body), 400, "cannot be set by requests"
        )
    assert_error(
        http.post("/v1/videos", json={"prompt": "x", "upscaling_model_path": "/x"}),
        400,
        "upscaling_model_path",
    )


def test_upload_names_refused(http):
    for name in ("a/b.png", "..", "a\\b.png"):
        resp = http.post(
            "/v1/images/edits", data={"prompt": "x"}, files={"image": (name, png(), "image/png")}
        )
        assert_error(resp, 400, "upload file name")


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "body,status,fragment",
    [
        ({"prompt": "x", "size": "64"}, 400, "positive WIDTHxHEIGHT"),
        ({"prompt": "x", "size": "-64x64"}, 400, "positive WIDTHxHEIGHT"),
        ({"prompt": "x", "width": 0}, 400, "width must be positive"),
        ({"prompt": "x", "num_inference_steps": 0}, 400, "num_inference_steps must be positive"),
        ({"prompt": "x", "num_inference_steps": 5000}, 400, "at most 1000"),
        ({"prompt": "x", "response_format": "gif"}, 400, "response_format=gif is not supported"),
        ({"prompt": "x", "output_format": "bmp"}, 400, "output_format=bmp is not supported"),
        ({"prompt": "  "}, 400, "prompt is required"),
        ({}, 400, "prompt is required"),
        ({"prompt": "x", "size": "72x64"}, 400, "multiple of 16"),
        ({"prompt": "x", "n": "many"}, 422, "n"),
        ({"prompt": "x", "output_compression": 101}, 422, "output_compression"),
        ({"prompt": "x", "enhance_prompt": True}, 400, "prompt enhancer"),
        ({"prompt": "x", "enable_upscaling": True}, 400, "upscaler"),
    ],
)
def test_image_bad_input(http, body, status, fragment):
    assert_error(http.post("/v1/images/generations", json=body), status, fragment)


def test_n_is_clamped(http):
    resp = http.post(
        "/v1/images/generations", json={"prompt": "x", "size": "64x64", "n": 0, **FAST}
    )
    assert len(resp.json()["data"]) == 1


def test_malformed_bodies_and_uploads(http, gen_server):
    assert_error(
        http.post(
            "/v1/images/generations",
            content=b"{not json",
            headers={"content-type": "application/json"},
        ),
        400,
        "not valid JSON",
    )
    assert_error(
        http.post("/v1/videos", content=b"[1, 2]", headers={"content-type": "application/json"}),
        400,
        "must be an object",
    )
    assert_error(
        http.post("/v1/videos", json={"prompt": "x", "num_frames": "lots"}),
        400,
        "Invalid request body: num_frames",
    )
    bad_form = http.post(
        "/v1/images/edits",
        content=b"--zz\r\nbroken",
        headers={"content-type": "multipart/form-data; boundary=zz"},
    )
    assert bad_form.status_code in (400, 422) and "Traceback" not in bad_form.text
    assert_error(
        http.post("/v1/images/edits", data={"prompt": "x"}),
        422,
        "Field 'image' or 'url' is required",
    )
    assert_error(
        http.post(
            "/v1/images/edits",
            data={"prompt": "x"},
            files={"image": ("a.png", b"plain text", "image/png")},
        ),
        400,
        "Failed to process image source",
    )
    assert_error(
        http.post(
            "/v1/images/edits",
            data={"prompt": "x"},
            files={"image": ("a.png", png()[:60], "image/png")},
        ),
        400,
        "Failed to process image source",
    )
    assert_error(
        http.post(
            "/v1/videos", json={"prompt": "x", "input_reference": "data:image/png;base64,%%%"}
        ),
        400,
        "base64",
    )


def test_upload_over_limit_is_413(tmp_path_factory, gen_model_dir):
    from tests.integration.generation.conftest import start_server

    server = start_server(
        tmp_path_factory.mktemp("small"), gen_model_dir, args=["--max-upload-bytes", "1000"]
    )
    try:
        resp = httpx.post(
            server.base_url + "/v1/images/edits",
            data={"prompt": "x"},
            files={"image": ("big.png", png((200, 200)) + b"\0" * 2000, "image/png")},
        )
        assert_error(resp, 413, "larger than the limit")
    finally:
        server.stop()


def test_unknown_ids_and_content_not_ready(http):
    assert_error(http.get("/v1/videos/nope"), 404, "Video not found")
    assert_error(http.get("/v1/videos/nope/content"), 404, "Video not found")
    assert_error(http.get("/v1/images/nope/content"), 404, "Image not found")
    job = http.post(
        "/v1/videos",
        json={"prompt": "slow", "size": "64x64", "num_frames": 9, "num_inference_steps": 300},
    ).json()
    assert_error(
        http.get(f"/v1/videos/{job['id']}/content"), 404, "Generation is still in-progress"
    )
    http.delete(f"/v1/videos/{job['id']}")


def test_job_rejected_by_model_is_400_and_failed_content_is_404(http):
    assert_error(
        http.post("/v1/videos", json={"prompt": "x", "size": "72x64"}), 400, "multiple of 16"
    )
    img = http.post("/v1/images/generations", json={"prompt": "x", "size": "64x64", **FAST}).json()
    assert_error(
        http.get(f"/v1/images/{img['id']}/content", params={"variant": 3}),
        404,
        "Image variant 3 not found",
    )


# ---------------------------------------------------------------------- actions


def test_actions_json_and_metadata(http):
    meta = http.get("/v1/actions/metadata").json()
    horizon, dim = meta["output"]["action_horizon"], meta["output"]["action_dim"]
    state = [0.1] * meta["input"]["state_dim"]
    img = np.full((16, 16, 3), 128, np.uint8).tolist()
    body = {
        "request_id": "r1",
        "input": {"task": "pick", "observation": {"images": {"front": img}, "state": state}},
        "parameters": {"num_inference_steps": 4},
    }
    resp = http.post("/v1/actions/generations", json=body).json()
    assert resp["id"] == "r1" and resp["object"] == "action.generation"
    action = resp["data"][0]["action"]
    assert action["shape"] == [horizon, dim] and np.isfinite(action["values"]).all()
    flat = {
        "observation.images.front": img,
        "observation.state": state,
        "prompt": "pick",
        "parameters": {"num_inference_steps": 4},
    }
    assert (
        http.post("/v1/actions/generations", json=flat).json()["data"][0]["action"]["values"]
        == action["values"]
    )  # the flat OpenPI form is the same request
    body["input"]["observation"]["images"]["wrist"] = {"b64_json": base64.b64encode(png()).decode()}
    two_cams = http.post("/v1/actions/generations", json=body).json()["data"][0]["action"]["values"]
    assert two_cams != action["values"]  # the second camera changes the condition
    assert_error(http.post("/v1/actions/generations", json={"id": "a/b", "input": {}}), 400, "id")
    assert_error(
        http.post(
            "/v1/actions/generations",
            json={"input": {}, "parameters": {"action_mode": "forward_dynamics"}},
        ),
        400,
        "/v1/videos",
    )
    assert_error(
        http.post("/v1/actions/generations", json={"input": {"observation": {"state": [1, 2]}}}),
        400,
        "state",
    )


def test_actions_msgpack(http):
    meta = http.get("/v1/actions/metadata").json()
    payload = {
        "input": {
            "task": "pick",
            "observation": {
                "images": {"front": np.zeros((16, 16, 3), np.uint8)},
                "state": np.zeros(meta["input"]["state_dim"], np.float32),
            },
        },
        "parameters": {"candidate_count": 3, "return_candidates": True},
    }
    resp = http.post(
        "/v1/actions/generations",
        content=msgpack.packb(payload, default=encode_numpy, use_bin_type=True),
        headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
    )
    assert resp.status_code == 200 and "msgpack" in resp.headers["content-type"]
    out = msgpack.unpackb(resp.content, raw=False, object_hook=decode_numpy)
    assert len(out["data"]) == 3
    values = out["data"][0]["action"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32
    assert values.shape == (meta["output"]["action_horizon"], meta["output"]["action_dim"])
    bad = {
        "input": {
            "observation": {
                "state": {"__ndarray__": True, "data": b"x", "dtype": "|O", "shape": [1]}
            }
        }
    }
    resp = http.post(
        "/v1/actions/generations",
        content=msgpack.packb(bad, use_bin_type=True),
        headers={"content-type": "application/msgpack"},
    )
    assert_error(resp, 400, "dtype")
