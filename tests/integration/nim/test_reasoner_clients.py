"""The Cosmos3 NIM cookbook's reasoner clients (reasoner.py, reasoner_stream.py,
reasoner_responses.py), written from their documented request shapes, against a real server on
the Cosmos3 dev directory through `NIM_URL=<server>/nim/reasoner`. The dev model's text is
meaningless: the tests assert the contract and equivalences (streamed == one call, Responses ==
chat completions with the same seed)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.integration.nim.conftest import MAX_UPLOAD_BYTES, data_url, jpeg, mp4
from tests.support.server import ServerProcess

IMAGE_PROMPT = "Caption the image in detail."
REASONING = {"chat_template_kwargs": {"enable_thinking": True}, "include_reasoning": True,
             "thinking_token_budget": 512}


@pytest.fixture(scope="module")
def nim_url(nim_server: ServerProcess) -> str:
    return nim_server.base_url + "/nim/reasoner"


@pytest.fixture(scope="module")
def sdk(nim_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{nim_url}/v1", api_key="not-used", timeout=300,
                         max_retries=0)


@pytest.fixture(scope="module")
def model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def image_messages(image: bytes) -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(image, "image/jpeg")}},
        {"type": "text", "text": IMAGE_PROMPT}]}]


@pytest.fixture(scope="module")
def image_case(sdk: openai.OpenAI, model: str):
    """reasoner.py --case image_caption: max_tokens 4096 (the dev reasoner's context is the
    real model's), seed 0."""
    return sdk.chat.completions.create(model=model, messages=image_messages(jpeg()),
                                       max_tokens=4096, seed=0)


def test_preflight_as_the_cookbook_checks_it(nim_url: str, model: str) -> None:
    meta = httpx.get(f"{nim_url}/v1/metadata").json()
    assert (meta["model_type"], meta["inference_endpoint"]) == ("reasoner",
                                                                "/v1/chat/completions")
    assert meta["selectedModelProfileId"] and meta["modelInfo"][0]["shortName"] == model
    assert meta["model_variant"] == "nano"
    assert httpx.get(f"{nim_url}/v1/health/ready").status_code == 200
    for path in ("manifest", "version", "license", "metrics"):
        assert httpx.get(f"{nim_url}/v1/{path}").status_code == 200, path


def test_image_case(image_case) -> None:
    choice = image_case.choices[0]
    assert image_case.object == "chat.completion"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 0 < image_case.usage.completion_tokens <= 4096


def test_stream_equals_one_call(sdk: openai.OpenAI, model: str) -> None:
    kwargs = dict(model=model, messages=image_messages(jpeg(seed=3)), max_tokens=48, seed=0)
    whole = sdk.chat.completions.create(**kwargs)
    chunks = list(sdk.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content


def test_video_case_with_reasoning(sdk: openai.OpenAI, model: str) -> None:
    """reasoner.py --case video_caption --reasoning: a video_url part sampled at
    media_io_kwargs.video.fps; more frames a second -> more prompt tokens."""
    clip = data_url(mp4(), "video/mp4")

    def ask(fps: float):
        return sdk.chat.completions.create(
            model=model, max_tokens=64, seed=0,
            messages=[{"role": "user", "content": [
                {"type": "video_url", "video_url": {"url": clip}},
                {"type": "text", "text": "Describe the video in detail."}]}],
            extra_body={"media_io_kwargs": {"video": {"fps": fps}}, **REASONING})

    at_4, at_2 = ask(4.0), ask(2.0)
    assert isinstance(at_4.choices[0].message.content, str)
    # 24 frames at 12 fps = 2 s: 8 frames at 4 fps, 4 at 2 fps (two temporal groups fewer)
    assert at_4.usage.prompt_tokens > at_2.usage.prompt_tokens


def test_structured_output(sdk: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"label": {"type": "string", "maxLength": 8}},
              "required": ["label"], "additionalProperties": False}
    done = sdk.chat.completions.create(
        model=model, messages=image_messages(jpeg(seed=1)), max_tokens=200, seed=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "grounding", "schema": schema}})
    assert done.choices[0].finish_reason == "stop"
    assert set(json.loads(done.choices[0].message.content)) == {"label"}


def test_responses_api_equals_chat(sdk: openai.OpenAI, model: str, image_case) -> None:
    """reasoner_responses.py: input_image + input_text, max_output_tokens 4096, store=False;
    with the same seed the reply is the chat completion's."""
    response = sdk.responses.create(
        model=model, max_output_tokens=4096, store=False, extra_body={"seed": 0},
        input=[{"role": "user", "content": [
            {"type": "input_image", "detail": "auto", "image_url": data_url(jpeg(), "image/jpeg")},
            {"type": "input_text", "text": IMAGE_PROMPT}]}])
    assert response.output_text == image_case.choices[0].message.content
    assert response.usage.output_tokens == image_case.usage.completion_tokens
    events = list(sdk.responses.create(model=model, input=IMAGE_PROMPT, max_output_tokens=32,
                                       stream=True, extra_body={"seed": 0}))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert deltas == final.response.output_text


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


CLIP = data_url(mp4(num_frames=5), "video/mp4")
PICTURE = data_url(jpeg(32, 32), "image/jpeg")


@pytest.mark.parametrize("content, extra, status, expected", [
    ([video_part(CLIP)] * 2, {}, 400, "at most 5 images and 1 video"),
    ([image_part(PICTURE)] * 6, {}, 400, "at most 5 images and 1 video"),
    ([video_part("http://127.0.0.1:9/clip.mp4")], {}, 400, "remote video URLs"),
    ([video_part("file:///etc/passwd")], {}, 400, "--allowed-local-media-path"),
    ([video_part(data_url(b"not a video", "video/mp4"))], {}, 400, "not a readable video"),
    ([video_part(data_url(b"\0" * (MAX_UPLOAD_BYTES + 64), "video/mp4"))], {}, 413, "limit"),
    ([video_part(CLIP)], {"media_io_kwargs": {"video": {"fps": "fast"}}}, 400, "fps"),
    ([video_part(CLIP)], {"media_io_kwargs": {"audio": {}}}, 400, "audio"),
    ([video_part(CLIP)], {"thinking_token_budget": 0}, 400, "thinking_token_budget"),
    ([video_part(CLIP)], {"chat_template_kwargs": {"tokenize": True}}, 400, "tokenize"),
    ([video_part(CLIP)], {"include_reasoning": "maybe"}, 400, "include_reasoning"),
    ([video_part(CLIP)], {"reasoning_effort": "high"}, 400, "reasoning_effort"),
])
def test_hostile_chat_media_and_fields(nim_url: str, model: str, content: list, extra: dict,
                                       status: int, expected: str) -> None:
    body = {"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": content}], **extra}
    response = httpx.post(f"{nim_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == status, response.text
    assert expected in response.json()["error"]["message"]


def test_the_generator_mount_refuses_chat(nim_server: ServerProcess, model: str) -> None:
    generator = openai.OpenAI(base_url=f"{nim_server.base_url}/nim/generator/v1",
                              api_key="not-used", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        generator.chat.completions.create(model=model, messages=image_messages(jpeg()))
    assert caught.value.body["message"] == (
        "The selected runtime is 'generator', which serves POST /v1/infer. "
        "POST /v1/chat/completions requires a reasoner deployment.")
