"""Fuzzing, bounded (about a minute in all): schemathesis over the server's OpenAPI schema for
every HTTP route, hypothesis-generated JSON/msgpack bodies for the routes that parse their own
bodies (the schema cannot describe them), and hypothesis-generated message sequences for the
WebSocket protocols. Outcome: no 500, no 1011, no stage crash, /health 200 afterwards.

Generated bodies never carry `prompt`/`task`, so no generation starts: everything before it
(flattening, policy, schema and parameter validation) is what gets fuzzed. Examples are
derandomized so a failure reproduces.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import msgpack
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.hostile.conftest import PNG, assert_alive
from tests.support.machine import require_module
from tests.support.server import ServerProcess

schemathesis = require_module("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402

SCHEMA_EXAMPLES = 40
BODY_EXAMPLES = 600
WS_EXAMPLES = 30


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


# Admin operations that change what the server serves, and the call that restores it.
UNDO = {"/admin/generation/pause": "/admin/generation/continue",
        "/admin/memory/release": "/admin/memory/resume"}


def test_every_openapi_route_never_answers_500(strict: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(strict.base_url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/videos", "/v1/chat/completions", "/v1/streaming/sessions", "/health"} <= paths
    for operation in operations:

        @fuzz_settings(SCHEMA_EXAMPLES)
        # the admin echo's delay_ms (up to 60 s) would only make the fuzzer wait
        @given(
            case=operation.as_strategy().filter(
                lambda c: not isinstance(c.body, dict) or not c.body.get("delay_ms", 0) > 50
            )
        )
        def run(case: Any) -> None:
            response = case.call(base_url=strict.base_url, timeout=60)
            undo = UNDO.get(operation.path)
            if undo is not None:  # a paused or released model would stall the later routes
                httpx.post(strict.base_url + undo, timeout=30)
            if response.status_code == 201 and operation.path == "/v1/streaming/sessions":
                # release it, so that the fuzzer never fills the session slots (503 by design)
                httpx.delete(
                    f"{strict.base_url}/v1/streaming/sessions/{response.json()['session_id']}",
                    timeout=30,
                )
            if operation.path == "/admin/stages/{stage}/echo" and response.status_code == 503:
                # a stage name that is not running: 503 stage_unavailable by design (skeleton)
                assert response.json()["error"]["code"] == "stage_unavailable", response.text
                return
            case.validate_response(response, checks=[not_a_server_error])

        run()
    assert_alive(strict)


# ---------------------------------------------------------------------- self-parsed bodies

KEYS = st.sampled_from(
    [
        "model",
        "size",
        "width",
        "height",
        "n",
        "num_frames",
        "num_inference_steps",
        "seed",
        "guidance_scale",
        "fps",
        "seconds",
        "output_format",
        "response_format",
        "output_quality",
        "output_compression",
        "negative_prompt",
        "extra_body",
        "extra_json",
        "extra_args",
        "extra_params",
        "diffusers_kwargs",
        "input",
        "observation",
        "images",
        "image",
        "image_path",
        "url",
        "input_reference",
        "reference_url",
        "video_url",
        "state",
        "parameters",
        "runtime",
        "request_id",
        "id",
        "output_path",
        "lora_path",
        "system_prompt",
        "question",
        "retention",
        "sampling",
        "messages",
        "role",
        "content",
        "type",
        "image_url",
        "guided_json",
        "stream",
        "max_tokens",
        "b64_json",
        "__ndarray__",
        "dtype",
        "shape",
        "data",
    ]
) | st.text(max_size=8)
ODD_STRINGS = st.sampled_from(
    [
        "file:///etc/passwd",
        "http://127.0.0.1:1/x.png",
        "http://[::1/x",
        "data:image/png;base64,",
        "data:image/png;base64,@@",
        "../../etc/passwd",
        "[1, 2]",
        '{"output_path": "/x"}',
        "64x64",
        "-64x0",
        "0x0",
        "99999999x99999999",
        "nan",
        "",
        " ",
        "\x00",
        "a/b",
        "float32",
        "<f4",
        "O",
    ]
)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=24)
    | ODD_STRINGS
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=24,
)
BODIES = st.dictionaries(KEYS, JSON_VALUES, max_size=7)
JSON_ROUTES = [
    "/v1/images/generations",
    "/v1/videos",
    "/v1/actions/generations",
    "/v1/streaming/sessions",
    "/v1/chat/completions",
]


def _form_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def test_generated_bodies_never_answer_500(strict: ServerProcess) -> None:
    with httpx.Client(base_url=strict.base_url, timeout=60) as http:

        @fuzz_settings(BODY_EXAMPLES)
        @given(route=st.sampled_from(JSON_ROUTES + ["/v1/images/edits", "msgpack"]), body=BODIES)
        def run(route: str, body: dict[str, Any]) -> None:
            if route == "/v1/images/edits":
                form = {k: _form_value(v) for k, v in body.items() if "\x00" not in k}
                response = http.post(
                    route,
                    data=form,
                    files={"image": ("a.png", PNG, "image/png")} if "url" not in body else None,
                )
            elif route == "msgpack":
                try:
                    packed = msgpack.packb(body)
                except OverflowError:  # ints beyond 64 bits have no msgpack form
                    assume(False)
                response = http.post(
                    "/v1/actions/generations",
                    content=packed,
                    headers={"content-type": "application/msgpack"},
                )
            else:  # json.dumps writes NaN / Infinity, which the server must also survive
                response = http.post(
                    route, content=json.dumps(body), headers={"content-type": "application/json"}
                )
            assert response.status_code < 500, (route, body, response.text[:300])

        run()
    assert_alive(strict)


# ---------------------------------------------------------------------- WebSocket messages

CREATE = {"op": "create", "system_prompt": "describe"}
STREAMING_MESSAGES = st.one_of(
    st.binary(max_size=256),
    st.just(PNG),
    st.builds(
        lambda d: json.dumps({**CREATE, **d}), st.dictionaries(KEYS, JSON_VALUES, max_size=3)
    ),
    st.builds(
        lambda op, d: json.dumps({"op": op, **d}),
        st.sampled_from(["create", "frame", "delete", "update", ""]),
        st.dictionaries(KEYS, JSON_VALUES, max_size=3),
    ),
    st.builds(json.dumps, JSON_VALUES),
    st.text(max_size=64),
)


def _exchange(url: str, messages: list[str | bytes]) -> tuple[list[Any], int | None]:
    """Send every message, read until the server closes or goes quiet; (replies, close code)."""
    replies: list[Any] = []
    with connect(url, max_size=None, open_timeout=30) as ws:
        try:
            for message in messages:
                ws.send(message)
            while True:
                replies.append(ws.recv(timeout=0.5))
        except (ConnectionClosed, TimeoutError):
            pass
    return replies, ws.close_code


def test_generated_streaming_ws_messages(strict: ServerProcess) -> None:
    url = strict.ws_url + "/v1/streaming/ws"

    @fuzz_settings(WS_EXAMPLES)
    @given(
        first=st.sampled_from(
            [json.dumps(CREATE), json.dumps({**CREATE, "frame_format": "base64"})]
        )
        | STREAMING_MESSAGES,
        rest=st.lists(STREAMING_MESSAGES, max_size=6),
    )
    def run(first: str | bytes, rest: list[str | bytes]) -> None:
        counter.append(1)
        replies, code = _exchange(url, [first, *rest])
        assert code in (None, 1000, 1008, 1009), (code, replies[-3:])
        for reply in replies:
            assert json.loads(reply).get("code") != 500, reply

    counter: list[int] = []
    started = time.monotonic()
    run()
    assert len(counter) >= WS_EXAMPLES // 2  # the generator really ran
    assert time.monotonic() - started < 120
    assert_alive(strict)


# ---------------------------------------------------------------------- realtime (msgpack)

RT_KEYS = st.sampled_from(
    [
        "type",
        "prompt",
        "first_frame",
        "condition_inputs",
        "max_chunks",
        "seed",
        "guidance_scale",
        "size",
        "fps",
        "num_frames",
        "num_inference_steps",
        "negative_prompt",
        "realtime_output_format",
        "realtime_preview_max_width",
        "output_compression",
        "realtime_delta_level",
        "realtime_output_pacing",
        "realtime_causal_sink_size",
        "realtime_causal_kv_cache_num_frames",
        "camera_actions",
        "action",
        "intrinsics",
        "kind",
        "payload",
        "event_id",
        "mode",
        "transitions",
        "actions",
        "client_ts_ms",
        "input_types",
        "refresh_kv",
        "output_path",
    ]
) | st.text(max_size=6)
RT_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=16)
    | st.binary(max_size=32)
    | st.sampled_from(
        [
            "raw",
            "webp",
            "jpeg",
            "delta-gzip",
            "delta-zstd",
            "64x64",
            "0x0",
            "w",
            "wasd",
            "state",
            "heartbeat",
            "prompt",
            "camera_actions",
            "composite_input",
            "w-5,none-2",
            "file:///etc/passwd",
            "http://127.0.0.1:1/x",
        ]
    )
)
RT_VALUES = st.recursive(
    RT_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(RT_KEYS, inner, max_size=4),
    max_leaves=16,
)
RT_INIT = {"type": "init", "prompt": "a corridor", "size": "64x64", "max_chunks": 1}
RT_EVENT_KINDS = st.sampled_from(
    ["camera_actions", "prompt", "composite_input", "action", "heartbeat", "nope"]
)


def _bounded_init(extra: dict[str, Any]) -> dict[str, Any]:
    """A fuzzed init that stays cheap: at most 2 chunks of at most 128x128 pixels."""
    init = {**RT_INIT, **extra}
    chunks = init.get("max_chunks")
    if chunks is None or (isinstance(chunks, int) and not isinstance(chunks, bool) and chunks > 2):
        init["max_chunks"] = 2
    size = init.get("size")
    if isinstance(size, str) and "x" in size:
        dims = size.lower().split("x")
        if all(d.strip().isdigit() for d in dims) and int(dims[0]) * int(dims[1]) > 128 * 128:
            init["size"] = "64x64"
    return init


RT_MESSAGES = st.one_of(
    st.builds(
        lambda kind, extra: {"type": "event", "kind": kind, **extra},
        RT_EVENT_KINDS,
        st.dictionaries(RT_KEYS, RT_VALUES, max_size=3),
    ),
    st.dictionaries(RT_KEYS, RT_VALUES, max_size=4),
)


async def _realtime_exchange(url: str, messages: list[bytes]) -> tuple[list[Any], int | None]:
    import asyncio

    import websockets

    maps: list[Any] = []
    async with websockets.connect(url, max_size=None) as ws:
        try:
            for message in messages:
                await ws.send(message)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                data = await asyncio.wait_for(ws.recv(), 0.5)
                try:
                    maps.append(msgpack.unpackb(data, raw=False))
                except (ValueError, msgpack.UnpackException):
                    pass  # raw frame payload
        except (asyncio.TimeoutError, websockets.ConnectionClosed):
            pass
    code = ws.close_code
    return maps, code


def test_generated_realtime_messages(strict: ServerProcess) -> None:
    import asyncio

    url = strict.ws_url + "/v1/realtime_video/generate"

    def packable(obj: Any) -> bytes | None:
        try:
            return msgpack.packb(obj, use_bin_type=True)
        except (OverflowError, ValueError, TypeError):
            return None

    @fuzz_settings(WS_EXAMPLES)
    @given(
        init=st.dictionaries(RT_KEYS, RT_VALUES, max_size=4).map(_bounded_init),
        rest=st.lists(RT_MESSAGES, max_size=5),
    )
    def run(init: dict[str, Any], rest: list[dict[str, Any]]) -> None:
        messages = [packable(m) for m in [init, *rest]]
        assume(all(m is not None for m in messages))
        maps, code = asyncio.run(_realtime_exchange(url, messages))  # type: ignore[arg-type]
        assert code in (None, 1000, 1008, 1009), (code, maps[-3:])
        for item in maps:
            if isinstance(item, dict) and item.get("type") == "error":
                assert item.get("code") in ("invalid_init", "invalid_event"), item

    run()
    assert_alive(strict)
