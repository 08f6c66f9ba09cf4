"""Other ecosystems' clients through a real server (tiny Wan + action head): every video object
against openai-python's `Video` type, the content variants, `/v1/videos/sync` as safetensors,
the `image_reference` / `video_reference` aliases, remix refused where the model has no video
conditioning, Idempotency-Key on actions, and SGLang's routes and fields (each sent with a
non-default value, so a field mapped to the wrong name would show)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.integration.generation.test_native_media import assert_error, png, wait_job
from tests.support.machine import require_module

VIDEO = {"prompt": "a boat", "size": "64x64", "num_frames": 5, "num_inference_steps": 2,
         "seed": 4}
WARNING = "X-Worldserve-Warning"


@pytest.fixture(scope="module")
def http(gen_server):
    with httpx.Client(base_url=gen_server.base_url, timeout=120) as client:
        yield client


def openai_video_type():
    """openai-python's `Video` with `size` and `seconds` widened to `str`: upstream lists
    sora's four resolutions and 4/8/12 s, which a model with other sizes cannot answer;
    every other field keeps its upstream type, validated strictly."""
    openai_types = require_module("openai.types")
    pydantic = require_module("pydantic")
    return pydantic.create_model("WorldserveVideo", __base__=openai_types.Video,
                                 size=(str, ...), seconds=(str, ...))


def test_video_objects_validate_as_openai_videos(http):
    video_type = openai_video_type()
    created = http.post("/v1/videos", json=VIDEO)
    assert created.status_code == 200, created.text
    job = created.json()
    video_type.model_validate(job, strict=True)
    done, _ = wait_job(http, job["id"], timeout_s=120)
    assert done["status"] == "completed" and done["prompt"] == "a boat"
    video_type.model_validate(done, strict=True)
    for listed in http.get("/v1/videos").json()["data"]:
        video_type.model_validate(listed, strict=True)
    failed = http.post("/v1/videos", json={**VIDEO, "size": "72x64"})
    assert failed.status_code == 400


def test_content_variants_thumbnail_and_spritesheet(http):
    job = http.post("/v1/videos", json=VIDEO).json()
    wait_job(http, job["id"], timeout_s=120)
    for variant, shape in (("thumbnail", (64, 64)), ("spritesheet", (64, 5 * 64))):
        reply = http.get(f"/v1/videos/{job['id']}/content", params={"variant": variant})
        assert reply.status_code == 200 and reply.headers["content-type"] == "image/jpeg"
        image = Image.open(io.BytesIO(reply.content))
        assert image.format == "JPEG" and image.size[::-1] == shape
    video = http.get(f"/v1/videos/{job['id']}/content", params={"variant": "video"})
    assert video.content[4:8] == b"ftyp"
    openai = require_module("openai")
    sdk = openai.OpenAI(base_url=str(http.base_url).rstrip("/") + "/v1", api_key="unused",
                        max_retries=0)
    thumb = sdk.videos.download_content(job["id"], variant="thumbnail").read()
    assert thumb[:3] == b"\xff\xd8\xff"  # the SDK's own call: a JPEG
    assert_error(http.get(f"/v1/videos/{job['id']}/content", params={"variant": "poster"}),
                 404, "Variant poster")


def test_sync_safetensors_body(http):
    safetensors_numpy = require_module("safetensors.numpy")
    reply = http.post("/v1/videos/sync", params={"format": "safetensors"},
                      json={**VIDEO, "fps": 8})
    assert reply.status_code == 200, reply.text
    tensors = safetensors_numpy.load(reply.content)
    assert tensors["video"].dtype == np.uint8 and tensors["video"].shape == (5, 64, 64, 3)
    assert float(tensors["frame_rate"]) == 8.0 and "action" not in tensors
    assert reply.headers["X-Video-Id"]
    assert_error(http.post("/v1/videos/sync", params={"format": "gif"}, json=VIDEO), 400,
                 "format must be one of mp4, auto, safetensors")
    assert_error(http.post("/v1/videos", json={**VIDEO, "format": "safetensors"}), 400,
                 "/v1/videos/sync")
    assert_error(http.post("/v1/videos/sync", json={**VIDEO, "format": "avi"}), 400,
                 "format must be one of")


def test_tensorrt_llm_sync_request_shapes(http):
    """TensorRT-LLM's visual-gen client (examples/visual_gen/serve/sync_video_gen.py): POST
    /v1/videos/generations, a form with `seconds` as "1.0", `fps` and `format`, the image as
    `image_reference` ({"content": base64} in JSON)."""
    safetensors_numpy = require_module("safetensors.numpy")
    form = {"prompt": "a boat", "size": "64x64", "seconds": "1.0", "fps": "5",
            "format": "safetensors", "num_inference_steps": "2", "seed": "4"}
    reply = http.post("/v1/videos/generations", data=form,
                      files={"image_reference": ("ref.png", png(), "image/png")})
    assert reply.status_code == 200, reply.text
    tensors = safetensors_numpy.load(reply.content)
    assert tensors["video"].shape == (5, 64, 64, 3) and float(tensors["frame_rate"]) == 5.0
    content = base64.b64encode(png()).decode()
    as_json = http.post("/v1/videos/generations", json={
        **VIDEO, "format": "mp4", "image_reference": {"content": content, "role": "reference"}})
    assert as_json.status_code == 200 and as_json.content[4:8] == b"ftyp", as_json.text
    assert_error(http.post("/v1/videos/generations", json={
        **VIDEO, "image_reference": {"content": content, "role": "last_frame"}}), 400,
        "image_reference.role 'last_frame'")
    assert_error(http.post("/v1/videos/generations", json={**VIDEO, "seconds": 1.5}), 400,
                 "seconds")


def test_reference_aliases(http):
    upload = http.post("/v1/videos", data={k: str(v) for k, v in VIDEO.items()},
                       files={"image_reference": ("ref.png", png(), "image/png")})
    assert upload.status_code == 200, upload.text
    job, _ = wait_job(http, upload.json()["id"], timeout_s=120)
    assert job["status"] == "completed"
    plain = http.post("/v1/videos", json=VIDEO).json()
    wait_job(http, plain["id"], timeout_s=120)
    conditioned = http.get(f"/v1/videos/{job['id']}/content").content
    assert conditioned != http.get(f"/v1/videos/{plain['id']}/content").content
    assert_error(http.post("/v1/videos", json={**VIDEO, "image_reference": {"file_id": "f"}}),
                 400, "image_reference.file_id")
    assert_error(http.post("/v1/videos", json={**VIDEO, "image_reference": "/etc/passwd"}),
                 400, "image_reference")
    both = {**VIDEO, "image_reference": {"image_url": "data:,"}, "input_reference": "data:,"}
    assert_error(http.post("/v1/videos", json=both), 400, "not both")
    # Wan conditions on no video: the alias reaches the same refusal as video_url
    assert_error(http.post("/v1/videos", json={**VIDEO, "video_reference": "data:,"}), 400,
                 "video conditioning is not supported")


def test_remix_refused_without_video_conditioning(http):
    job = http.post("/v1/videos", json=VIDEO).json()
    body = assert_error(http.post(f"/v1/videos/{job['id']}/remix", json={"prompt": "again"}),
                        400, "does not condition on a video")
    assert body["error"]["param"] == "video_id"
    assert_error(http.post("/v1/videos/nope/remix", json={"prompt": "x"}), 404,
                 "Video not found")


def _action_body(http) -> dict:
    meta = http.get("/v1/actions/metadata").json()
    image = np.full((16, 16, 3), 90, np.uint8).tolist()
    return {"input": {"task": "pick", "observation": {
        "images": {"front": image}, "state": [0.2] * meta["input"]["state_dim"]}},
        "parameters": {"num_inference_steps": 3, "seed": 11}}


async def _concurrently(base_url: str, body: dict, headers: dict, count: int) -> list:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/actions/generations", json=body,
                                                  headers=headers) for _ in range(count)))


def test_action_idempotency_key(http, gen_server):
    body = _action_body(http)
    key = {"Idempotency-Key": "act-9"}
    replies = asyncio.run(_concurrently(gen_server.base_url, body, key, 20))
    assert {r.status_code for r in replies} == {200}, replies[0].text
    first = replies[0]
    assert {r.content for r in replies} == {first.content}  # one answer, id included
    fresh = http.post("/v1/actions/generations", json=body).json()
    assert fresh["id"] != first.json()["id"]
    other = {**body, "parameters": {**body["parameters"], "seed": 12}}
    assert_error(http.post("/v1/actions/generations", json=other, headers=key), 409,
                 "'act-9'")
    as_msgpack = http.post("/v1/actions/generations", json=body,
                           headers={**key, "Accept": "application/msgpack"})
    assert_error(as_msgpack, 409, "'act-9'")


def test_sglang_model_routes(http, gen_server):
    models = http.get("/models").json()
    assert set(models) >= {"model_path", "task_type", "pipeline_name", "pipeline_class",
                           "num_gpus", "dit_precision", "vae_precision"}
    assert models["pipeline_class"] == "WanPipeline"
    info = http.get("/v1/model_info").json()
    assert info == {"model_path": models["model_path"]}


@pytest.mark.parametrize(("field", "value", "said"), [
    ("generator_device", "cuda", "generator_device 'cuda' ignored"),
    ("quality", "hd", "quality 'hd' has no effect"),
    ("style", "natural", "style 'natural' has no effect"),
    ("background", "transparent", "without transparency"),
])
def test_sglang_image_fields_are_said(http, field, value, said):
    body = {"prompt": "x", "size": "64x64", "num_inference_steps": 2, field: value}
    reply = http.post("/v1/images/generations", json=body)
    assert reply.status_code == 200, reply.text
    assert any(said in w for w in reply.headers.get_list(WARNING)), reply.headers


def test_sglang_fields_refused_or_exact(http):
    plain = http.post("/v1/images/generations",
                      json={"prompt": "x", "size": "64x64", "num_inference_steps": 2,
                            "generator_device": "cpu"})
    assert plain.status_code == 200 and not plain.headers.get_list(WARNING)
    for field, value in (("generator_device", "tpu"), ("quality", "ultra"),
                         ("style", "pop-art"), ("background", "clear")):
        reply = http.post("/v1/images/generations",
                          json={"prompt": "x", "size": "64x64", field: value})
        assert 400 <= reply.status_code < 500 and field in reply.text, reply.text
    video = http.post("/v1/videos", json={**VIDEO, "generator_device": "npu"})
    assert_error(video, 400, "generator_device")


def _refused(reply: httpx.Response, status: int, fragment: str) -> None:
    """The OpenAI error envelope of the admin-style routes (`code`: the error's name)."""
    assert reply.status_code == status, reply.text
    assert fragment in reply.json()["error"]["message"], reply.text


def test_sglang_lora_routes(http, gen_server, gen_model_dir: Path, tmp_path: Path):
    require_module("peft")
    from tests.unit.generation import admin_fixtures as fx

    lora = fx.build_lora(gen_model_dir, tmp_path / "lora", 1, ["to_q", "to_k", "to_v",
                                                               "to_out.0"])
    image = {"prompt": fx.PROMPT, "size": f"{fx.SIZE}x{fx.SIZE}", "seed": 7,
             "num_inference_steps": fx.STEPS, "guidance_scale": 1.0,
             "max_sequence_length": 32, "response_format": "b64_json"}

    def b64(reply: httpx.Response) -> str:
        assert reply.status_code == 200, reply.text
        return reply.json()["data"][0]["b64_json"]

    base = b64(http.post("/v1/images/generations", json=image))
    _refused(http.post("/v1/set_lora", json={"lora_nickname": "ghost"}), 400,
                 "'ghost' is not loaded")
    _refused(http.post("/v1/set_lora", json={"lora_nickname": "s", "target": "critic"}),
                 400, "target 'critic'")
    _refused(http.post("/v1/set_lora", json={"lora_nickname": "s", "lora_alpha": 8}), 400,
                 "lora_alpha")
    _refused(http.post("/v1/merge_lora_weights", json={}), 400, "set_lora first")
    set_reply = http.post("/v1/set_lora", json={"lora_nickname": "sg", "lora_path": str(lora),
                                                "strength": 0.5})
    assert set_reply.json()["status"] == "ok", set_reply.text
    again = http.post("/v1/set_lora", json={"lora_nickname": "sg", "lora_path": str(lora),
                                            "strength": 0.5})
    assert again.status_code == 200, again.text  # the same nickname and path: reused
    listed = http.get("/v1/list_loras").json()
    assert listed["active"] == [{"nickname": "sg", "strength": 0.5}]
    # the set adapter at strength 0.5 applies to a request that names none, exactly as the
    # same request naming it at 0.5 does
    active = b64(http.post("/v1/images/generations", json=image))
    named = b64(http.post("/v1/images/generations",
                          json={**image, "lora": {"name": "sg", "scale": 0.5}}))
    assert active == named != base
    merged = http.post("/v1/merge_lora_weights", json={"strength": 0.8})
    assert merged.status_code == 200, merged.text
    at_08 = b64(http.post("/v1/images/generations", json=image))
    assert at_08 == b64(http.post("/v1/images/generations",
                                  json={**image, "lora": {"name": "sg", "scale": 0.8}}))
    assert at_08 != active
    assert http.post("/v1/unmerge_lora_weights", json={}).status_code == 200
    assert b64(http.post("/v1/images/generations", json=image)) == base
    assert json.loads(http.get("/v1/list_loras").text)["active"] == []


def test_action_answer_survives_a_restart(tmp_path, gen_model_dir):
    from tests.integration.generation.conftest import start_server

    key = {"Idempotency-Key": "act-restart"}
    server = start_server(tmp_path, gen_model_dir)
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            body = _action_body(client)
        first = httpx.post(f"{server.base_url}/v1/actions/generations", json=body,
                           headers=key, timeout=60)
        assert first.status_code == 200, first.text
    finally:
        server.stop()
    restarted = start_server(tmp_path, gen_model_dir)
    try:
        again = httpx.post(f"{restarted.base_url}/v1/actions/generations", json=body,
                           headers=key, timeout=60)
        assert again.status_code == 200 and again.content == first.content
    finally:
        restarted.stop()
