"""Page basics in the browser: surfaces a server lacks, error wording, the msgpack codec."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import msgpack
import pytest

from tests.e2e.conftest import open_tab, screenshot
from tests.support.server import ServerProcess

TAB_SURFACES = {
    "images": "image generation",
    "videos": "video generation",
    "reasoning": "live video reasoning",
    "realtime": "realtime world exploration",
}


@pytest.fixture(scope="module")
def reasoner_only(
    tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path, browser: Any
) -> Iterator[ServerProcess]:
    """A server with only the reasoner stage: images, videos and realtime are not offered."""
    workdir = tmp_path_factory.mktemp("reasoner-only")
    reasoner = {"backend": "fake", "model_path": str(workdir)}
    server = ServerProcess(
        workdir,
        {
            "stages": {
                "generation": {"enabled": False},
                "realtime": {"enabled": False},
                "reasoner": reasoner,
            }
        },
    )
    try:
        server.wait_healthy(timeout_s=120)
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


def test_missing_surfaces_say_so_and_disable_their_tab(page, reasoner_only) -> None:
    offered = page.request.get(f"{reasoner_only.base_url}/web/surfaces").json()
    assert offered["images"] is offered["videos"] is offered["realtime"] is False
    assert offered["streaming"] is True
    for tab, name in TAB_SURFACES.items():
        open_tab(page, reasoner_only, tab)
        note = page.locator(f"#tab-{tab} .unavailable")
        if tab == "reasoning":
            assert note.is_hidden()
            assert page.locator("#reasoning-start").is_enabled()
            continue
        assert note.inner_text() == f"This server does not offer {name}."
        assert page.locator(f"#tab-{tab} button[type=submit]").is_disabled()
    open_tab(page, reasoner_only, "realtime")
    screenshot(page, "unavailable")
    assert page.errors == []


def test_a_404_route_is_reported_as_not_offered(page, reasoner_only) -> None:
    """The same words when a route disappears after the page loaded (real 404 from the server)."""
    open_tab(page, reasoner_only, "images")
    said = page.evaluate("""async () => {
        const { fromResponse, explain } = await import('/web/errors.js');
        const response = await fetch('/v1/images/generations', {method: 'POST', body: '{}',
                                     headers: {'Content-Type': 'application/json'}});
        return [response.status, explain(await fromResponse('images', response))];
    }""")
    assert said[0] == 404
    assert said[1]["title"] == "This server does not offer image generation."
    assert "/v1/images/generations" in said[1]["detail"]


@pytest.mark.parametrize(
    "error, words",
    [
        (
            {"status": 413, "message": "frame is 9000000 bytes; the limit is 8388608"},
            "Frame too large",
        ),
        (
            {
                "status": 503,
                "code": "stage_unavailable",
                "message": "stage 'realtime' is unavailable",
            },
            "is unavailable (stage not running",
        ),
        (
            {
                "code": "admission_rejected",
                "message": "realtime admission rejected: CAPACITY_EXHAUSTED",
                "retryAfterS": 2.5,
            },
            "Capacity reached",
        ),
        (
            {"status": 409, "message": "session busy: a frame is already being processed"},
            "previous frame",
        ),
        ({"status": 400, "message": "unknown retention field 'foo'"}, "refused the request"),
        (
            {
                "code": "connect_failed",
                "closeCode": 1006,
                "message": "WebSocket could not be opened",
            },
            "Could not open",
        ),
    ],
)
def test_error_wording_keeps_the_server_message(
    page, reasoner_only, error: dict, words: str
) -> None:
    open_tab(page, reasoner_only, "images")
    said = page.evaluate(
        """async (error) => {
        const { PlaygroundError, explain } = await import('/web/errors.js');
        return explain(new PlaygroundError('realtime', error));
    }""",
        error,
    )
    assert words in said["title"]
    assert said["detail"].startswith(error["message"])  # never swallowed


def test_msgpack_codec_matches_python(page, reasoner_only) -> None:
    open_tab(page, reasoner_only, "images")
    sample = {
        "type": "event",
        "kind": "camera_actions",
        "event_id": 70000,
        "neg": -129,
        "big": 2**40,
        "f": 0.25,
        "ok": True,
        "none": None,
        "s": "é" * 40,
        "payload": {
            "mode": "state",
            "transitions": [{"actions": ["w", "d"], "client_ts_ms": 12.5}],
        },
        "list": list(range(20)),
    }
    packed = page.evaluate(
        """async (value) => {
        const m = await import('/web/msgpack.js');
        return Array.from(m.encode(value));
    }""",
        sample,
    )
    assert msgpack.unpackb(bytes(packed), raw=False) == sample
    wire = msgpack.packb(
        {**sample, "payload_bytes": b"\x00\x01" * 40000, "wide": list(range(70000))},
        use_bin_type=True,
    )
    decoded = page.evaluate(
        """async (bytes) => {
        const m = await import('/web/msgpack.js');
        const v = m.decode(new Uint8Array(bytes));
        return [v.kind, v.big, v.neg, v.s.length, v.payload_bytes.length, v.payload_bytes[1],
                v.wide.length, v.wide[69999], v.payload.transitions[0].actions];
    }""",
        list(wire),
    )
    assert decoded == ["camera_actions", 2**40, -129, 40, 80000, 1, 70000, 69999, ["w", "d"]]
