"""`POST /v1/chat/completions` on the fake backend, with httpx and the OpenAI SDK."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Iterator

import httpx
import openai
import pytest

from tests.integration.streaming.support import b64, image_bytes

MODEL = "fake-reasoner"


def user(*parts: dict) -> list[dict]:
    return [
        {"role": "system", "content": "You describe images."},
        {"role": "user", "content": list(parts)},
    ]


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def image(data: bytes, mime: str = "image/jpeg") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


@pytest.fixture
def sdk(fake_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fake_server.base_url}/v1", api_key="unused", max_retries=0)


def test_completion_with_an_image(sdk: openai.OpenAI) -> None:
    done = sdk.chat.completions.create(
        model=MODEL, messages=user(text("What is this?"), image(image_bytes()))
    )
    assert done.object == "chat.completion" and done.model == MODEL
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


def test_stream_gives_the_same_text_as_one_shot(sdk: openai.OpenAI) -> None:
    messages = user(text("Describe."), image(image_bytes("PNG"), "image/png"))
    whole = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_sse_wire_format(fake_server) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{fake_server.base_url}/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"


def test_json_schema_response_format(sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "label": {"enum": ["clear", "hazard"]},
            "count": {"type": "integer", "minimum": 0},
        },
        "required": ["label", "count"],
    }
    done = sdk.chat.completions.create(
        model=MODEL,
        messages=user(text("Classify.")),
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    value = json.loads(done.choices[0].message.content)
    assert value["label"] in ("clear", "hazard") and isinstance(value["count"], int)
    done = sdk.chat.completions.create(
        model=MODEL, messages=user(text("Any JSON.")), response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(done.choices[0].message.content), dict)


@pytest.fixture
def image_host() -> Iterator[str]:
    """A local HTTP server holding /frame.jpg and /frame.gif (host `localhost` is allowed)."""
    files = {"/frame.jpg": image_bytes(), "/frame.gif": image_bytes("GIF")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = files.get(self.path)
            self.send_response(200 if data else 404)
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()


def test_remote_image_from_an_allowed_host(sdk: openai.OpenAI, image_host: str) -> None:
    part = {"type": "image_url", "image_url": {"url": f"{image_host}/frame.jpg"}}
    done = sdk.chat.completions.create(model=MODEL, messages=user(text("What?"), part))
    assert done.choices[0].message.content
    part = {"type": "image_url", "image_url": {"url": f"{image_host}/frame.gif"}}
    with pytest.raises(openai.BadRequestError, match="JPEG or PNG"):
        sdk.chat.completions.create(model=MODEL, messages=user(part))


def test_unknown_model_is_404_in_the_openai_shape(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="gpt-4o", messages=user(text("hi")))
    error = caught.value.body
    assert "The model 'gpt-4o' does not exist" in error["message"]
    assert error["type"] == "not_found_error"


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "bogus": 1}, "bogus"),
        ({"messages": user(image(image_bytes("GIF"), "image/gif"))}, "JPEG or PNG"),
        (
            {"messages": user({"type": "image_url", "image_url": {"url": "data:image/png,raw"}})},
            "must be base64",
        ),
        (
            {
                "messages": user(
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}}
                )
            },
            "media host 'example.com' is not in the allowed media domains",
        ),
        (
            {"messages": user({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}})},
            "--allowed-local-media-path",
        ),
        ({"messages": user(text("x")), "response_format": {"type": "json_schema"}}, "json_schema"),
        ({"messages": user(text("x")), "guided_choice": ["a"], "guided_regex": "a"}, "at most one"),
        ({"messages": user(text("x")), "max_tokens": 4, "min_tokens": 5},
         "min_tokens (5) must be at most max_tokens (4)"),
        ({"messages": user(text("x")), "min_tokens": -1}, "min_tokens"),
        ({"messages": user(text("x")), "ignore_eos": "sometimes"}, "ignore_eos"),
        ({"messages": user(text("x")), "logprobs": True}, "log probabilities are not returned"),
        ({"messages": user(text("x")), "top_logprobs": 3}, "log probabilities are not returned"),
        ({"messages": user(text("x")), "logit_bias": {"42": 10}}, "logit_bias is not supported"),
        ({"messages": user(text("x")), "tools": [{"type": "function", "function": {"name": "f"}}]},
         "tool and function calling are not supported"),
        ({"messages": user(text("x")), "tool_choice": "required"}, "may only be 'none' or 'auto'"),
        ({"messages": user(text("x")), "function_call": {"name": "f"}},
         "may only be 'none' or 'auto'"),
        ({"messages": user(text("x")), "modalities": ["text", "audio"]}, "only text replies"),
        ({"messages": user(text("x")), "audio": {"voice": "alloy", "format": "wav"}},
         "only text replies"),
        ({"messages": user(text("x")), "reasoning_effort": "low"}, "thinking_token_budget"),
        ({"messages": user(text("x")), "web_search_options": {}}, "web search is not supported"),
        (
            {"messages": user(text("x")), "guided_regex": "(unclosed"},
            "guided_regex does not compile",
        ),
    ],
)
def test_bad_input_is_400(fake_server, body: dict, expected: str) -> None:
    response = httpx.post(
        f"{fake_server.base_url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=30
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert expected in error["message"]


def test_max_tokens_beyond_the_context_is_lowered_not_refused(fake_server) -> None:
    body = {"model": MODEL, "messages": user(text("x")), "max_tokens": 20000}
    response = httpx.post(f"{fake_server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text  # vLLM's rule: the room left (16384 - 2)
    assert response.json()["usage"]["completion_tokens"] <= 16384


def test_openai_fields_that_ask_for_nothing_are_accepted(fake_server) -> None:
    """What OpenAI clients send by default or as hints (LangChain, LiteLLM and the SDK's own
    defaults) is accepted; the reply is the one without them."""
    body = {"model": MODEL, "messages": user(text("x")), "max_tokens": 12, "seed": 5}
    hints = {"logprobs": False, "top_logprobs": 0, "logit_bias": {}, "tools": [],
             "tool_choice": "none", "function_call": "auto", "parallel_tool_calls": False,
             "modalities": ["text"], "store": False, "metadata": {"team": "a"},
             "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "u1",
             "prediction": {"type": "content", "content": "x"}, "verbosity": "low",
             "user": "u1"}
    plain, hinted = (httpx.post(f"{fake_server.base_url}/v1/chat/completions", json=b, timeout=30)
                     for b in (body, {**body, **hints}))
    assert hinted.status_code == 200, hinted.text
    assert hinted.json()["choices"] == plain.json()["choices"]


@pytest.mark.parametrize("extra, tokens, finish", [
    ({"ignore_eos": True}, 12, "length"),  # to max_tokens
    ({"min_tokens": 12}, 12, "length"),  # at its boundary: end of turn never had its turn
    ({"min_tokens": 11}, 12, "stop"),  # 11 words, then the end of turn
])
def test_min_tokens_and_ignore_eos_reach_the_stage(fake_server, extra, tokens, finish) -> None:
    """vLLM's two fields cross to the stage (the fake's replies are 3 to 10 words)."""
    body = {"model": MODEL, "messages": user(text("x")), "max_tokens": 12, **extra}
    response = httpx.post(f"{fake_server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["usage"]["completion_tokens"] == tokens
    assert reply["choices"][0]["finish_reason"] == finish


def test_stage_errors_keep_their_status_when_streaming(fake_server) -> None:
    body = {"model": MODEL, "messages": user(text("x")), "guided_regex": "(", "stream": True}
    response = httpx.post(f"{fake_server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "guided_regex" in response.json()["error"]["message"]
