"""The NIM reasoner surface on the app with the fake reasoner engine in-process (its stage loop
runs on the test's event loop): the /nim/reasoner mount, chat reasoning fields, the Responses
API against chat completions, the one unknown-model answer, and the root's --nim-runtime."""

from __future__ import annotations

import json
from typing import AsyncIterator

import httpx
import pytest

from worldserve.api.app import create_app
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig
from worldserve.engines.reasoner.fake import FakeReasonerEngine
from worldserve.runtime.inprocess import InProcessStageClient

MODEL = "fake-reasoner"
THINK = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_token_budget": 3}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    config = ServerConfig.model_validate(
        {"stages": {"generation": {"enabled": False}, "reasoner": {"backend": "fake"}}})
    client = InProcessStageClient("reasoner", FakeReasonerEngine(config.stages.reasoner, config))
    client.start()
    app = create_app(ServerRuntime(config=config, clients={"reasoner": client}))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as session:
        yield session
    await client.close()


def chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Describe."}], "seed": 0,
            **extra}


async def sse(http: httpx.AsyncClient, path: str, body: dict) -> list[dict]:
    events = []
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


async def test_mount_discovery_describes_the_reasoner(http: httpx.AsyncClient) -> None:
    meta = (await http.get("/nim/reasoner/v1/metadata")).json()
    assert meta["model_type"] == "reasoner"
    assert meta["inference_endpoint"] == "/v1/chat/completions"
    assert meta["selectedModelProfileId"] == "worldserve:fake-reasoner:fake:float32"
    ready = await http.get("/nim/reasoner/v1/health/ready")
    assert ready.json() == {"object": "health.response", "message": "Service is ready",
                            "status": "ready"}
    live = (await http.get("/nim/reasoner/v1/health/live")).json()
    assert live["status"] == "live"
    models = (await http.get("/nim/reasoner/v1/models")).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert (await http.get(f"/nim/reasoner/v1/models/{MODEL}")).json()["id"] == MODEL
    manifest = (await http.get("/nim/reasoner/v1/manifest")).json()
    assert manifest["selectedModelProfileId"] == meta["selectedModelProfileId"]
    for path in ("version", "license", "metrics"):
        assert (await http.get(f"/nim/reasoner/v1/{path}")).status_code == 200
    # no generator on this server: no /nim/generator mount
    assert (await http.get("/nim/generator/v1/metadata")).status_code == 404


async def test_the_other_runtimes_route_is_a_runtime_aware_404(http: httpx.AsyncClient) -> None:
    response = await http.post("/nim/reasoner/v1/infer", json={"model_mode": "text2image"})
    assert response.status_code == 404
    assert response.json() == {"error": {
        "message": "The selected runtime is 'reasoner', which serves POST /v1/chat/completions. "
                   "POST /v1/infer requires a generator deployment.",
        "type": "NotFoundError", "param": None, "code": 404}}
    other = await http.get("/nim/reasoner/v1/unknown")
    assert other.status_code == 404 and other.json()["error"]["type"] == "NotFoundError"


async def test_reasoning_content_and_its_stream(http: httpx.AsyncClient) -> None:
    whole = (await http.post("/nim/reasoner/v1/chat/completions",
                             json=chat_body(**THINK))).json()
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]
    events = await sse(http, "/v1/chat/completions", chat_body(stream=True, **THINK))
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    hidden = (await http.post("/v1/chat/completions",
                              json=chat_body(include_reasoning=False, **THINK))).json()
    assert "reasoning_content" not in hidden["choices"][0]["message"]
    assert hidden["choices"][0]["message"]["content"] == message["content"]


async def test_responses_equal_chat_completions(http: httpx.AsyncClient) -> None:
    chat = (await http.post("/v1/chat/completions", json={
        **chat_body(max_tokens=20), "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Describe."}]}]})).json()
    body = {"model": MODEL, "instructions": "Be brief.", "max_output_tokens": 20, "seed": 0,
            "store": False,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Describe."}]}]}
    response = (await http.post("/nim/reasoner/v1/responses", json=body)).json()
    assert response["object"] == "response" and response["status"] in ("completed", "incomplete")
    message = response["output"][-1]
    assert message["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert response["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]
    events = await sse(http, "/v1/responses", {**body, "stream": True})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert streamed == message["content"][0]["text"] == events[-1]["response"]["output"][-1][
        "content"][0]["text"]


async def test_responses_reasoning_item_precedes_the_message(http: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": "Describe.", "stream": True, **THINK}
    events = await sse(http, "/v1/responses", body)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 3


@pytest.mark.parametrize("body, expected", [
    ({"input": "x", "tools": [{"type": "function"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "schema"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}] * 6}]}, "at most 5"),
    ({"input": "x", "thinking_token_budget": 0}, "thinking_token_budget"),
])
async def test_responses_bad_input_is_400(http: httpx.AsyncClient, body: dict,
                                          expected: str) -> None:
    response = await http.post("/v1/responses", json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert expected in response.json()["error"]["message"]


async def test_an_unknown_model_gets_one_answer_everywhere(http: httpx.AsyncClient) -> None:
    expected = f"The model 'nope' does not exist; this server serves '{MODEL}'"
    for response in (
        await http.post("/v1/chat/completions", json={**chat_body(), "model": "nope"}),
        await http.post("/v1/responses", json={"model": "nope", "input": "x"}),
        await http.get("/v1/models/nope"),
        await http.get("/nim/reasoner/v1/models/nope"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["message"] == expected


@pytest.mark.parametrize("runtime, model_type, endpoint", [
    (None, "reasoner", "/v1/chat/completions"),
    ("reasoner", "reasoner", "/v1/chat/completions"),
])
async def test_root_metadata_follows_nim_runtime(runtime: str | None, model_type: str,
                                                 endpoint: str) -> None:
    config = ServerConfig.model_validate({"nim_runtime": runtime, "stages": {
        "generation": {"enabled": False}, "reasoner": {"backend": "fake"}}})
    client = InProcessStageClient("reasoner", FakeReasonerEngine(config.stages.reasoner, config))
    app = create_app(ServerRuntime(config=config, clients={"reasoner": client}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as session:
        meta = (await session.get("/v1/metadata")).json()
    await client.close()
    assert (meta["model_type"], meta["inference_endpoint"]) == (model_type, endpoint)


def test_nim_runtime_needs_its_stage() -> None:
    with pytest.raises(ValueError, match="nim_runtime 'generator' needs the generation stage"):
        ServerConfig.model_validate({"nim_runtime": "generator",
                                     "stages": {"generation": {"enabled": False}}})
