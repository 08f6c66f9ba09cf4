"""Live reasoning tab: the fake camera feed over WS /v1/streaming/ws (fake reasoner backend)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Iterator

import httpx
from websockets.sync.client import connect

from tests.e2e.conftest import REASONING_DELAY_MS, open_tab, require_surface, screenshot
from tests.support.server import ServerProcess


@contextmanager
def held_session(server: ServerProcess) -> Iterator[dict[str, Any]]:
    """A streaming session opened from Python (binary frames), deleted on exit."""
    with connect(f"{server.ws_url}/v1/streaming/ws", open_timeout=10) as ws:
        ws.send(
            json.dumps({"op": "create", "frame_format": "binary", "system_prompt": "Describe."})
        )
        created = json.loads(ws.recv(timeout=10))
        yield created
        if created.get("op") == "created":
            ws.send(json.dumps({"op": "delete"}))
            assert json.loads(ws.recv(timeout=10))["op"] == "closed"


def reasoner_sessions(server: ServerProcess) -> int:
    stats = httpx.get(f"{server.base_url}/admin/stats", timeout=10).json()
    return stats["stages"]["reasoner"]["sessions"]


def test_replies_for_the_camera_and_stop_deletes_the_session(page, playground) -> None:
    require_surface(playground, "streaming")
    open_tab(page, playground, "reasoning")
    form = page.locator("#reasoning-form")
    form.locator("input[name=fps]").fill("5")
    form.locator("input[name=width]").fill("320")
    page.locator("#reasoning-start").click()

    page.wait_for_function(
        "() => Number(document.querySelector('#reasoning-count').textContent) >= 4", timeout=30_000
    )
    assert page.locator("#reasoning-text").inner_text().strip() != ""
    latency = page.locator("#reasoning-latency").inner_text()
    assert "ms round trip" in latency and "server" in latency
    config = httpx.get(f"{playground.base_url}/v1/streaming/config", timeout=10).json()
    assert page.locator("#reasoning-model").inner_text() == config["model"]
    retention = page.locator("#reasoning-retention").inner_text()
    assert retention.startswith(f"{config['retention']['max_video_segments']} frames")
    # the chart drew something besides its background (the latency line)
    lit = page.locator("#reasoning-chart").evaluate("""c => {
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 200) n++; return n; }""")
    assert lit > 300  # a 2 px line across the 640 px chart, whatever the latencies
    session_id = page.locator("#tab-reasoning").get_attribute("data-session-id")
    assert session_id.startswith("sess-") and reasoner_sessions(playground) == 1
    screenshot(page, "reasoning")

    page.locator("#reasoning-stop").click()
    page.wait_for_selector("#tab-reasoning[data-state=closed]", timeout=15_000)
    frames = int(page.locator("#tab-reasoning").get_attribute("data-closed-frames"))
    assert frames >= 4
    assert (
        f"{session_id} — closed after {frames} frames"
        == page.locator("#reasoning-session").inner_text()
    )
    # Server side: the slot is free again (max_sessions is 1), with the page still open.
    assert reasoner_sessions(playground) == 0
    with held_session(playground) as created:
        assert created["op"] == "created", created
    assert page.locator("#reasoning-form .error").is_hidden()
    assert page.errors == []


def test_capacity_reached_is_said_in_plain_words(page, playground) -> None:
    require_surface(playground, "streaming")
    open_tab(page, playground, "reasoning")
    with held_session(playground) as created:
        assert created["op"] == "created"
        page.locator("#reasoning-start").click()
        error = page.locator("#reasoning-form .error")
        error.wait_for(state="visible", timeout=15_000)
        assert error.locator("strong").inner_text().startswith("Capacity reached")
        assert "session slots exhausted" in error.locator(".detail").inner_text()
        page.wait_for_selector("#tab-reasoning[data-state=stopped]")
        assert page.locator("#reasoning-start").is_enabled()
        screenshot(page, "reasoning-capacity")
    # the page logs the error it showed (console.warn), nothing uncaught
    assert [e for e in page.errors if e.startswith("uncaught")] == []


def test_reasoning_latency_includes_the_engine_time(page, playground) -> None:
    """The server's latency_s shown on the page covers the fake engine's delay per frame."""
    require_surface(playground, "streaming")
    open_tab(page, playground, "reasoning")
    page.locator("#reasoning-start").click()
    page.wait_for_function(
        "() => Number(document.querySelector('#reasoning-count').textContent) >= 1"
    )
    text = page.locator("#reasoning-latency").inner_text()
    server_ms = int(text.split("server ")[1].split(" ms")[0])
    round_trip_ms = int(text.split(" · ")[1].split(" ms")[0])
    assert REASONING_DELAY_MS <= server_ms <= round_trip_ms
    page.locator("#reasoning-stop").click()
    page.wait_for_selector("#tab-reasoning[data-state=closed]", timeout=15_000)


def write_test_video(path, num_frames: int = 40, fps: int = 10) -> None:
    """A short H.264 MP4 of a moving bar (PyAV), as a person would pick from disk."""
    import av
    import numpy as np

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 160, 120, "yuv420p"
        for i in range(num_frames):
            rgb = np.zeros((120, 160, 3), np.uint8)
            rgb[:, (i * 4) % 160 : (i * 4) % 160 + 16] = (255, 200, 0)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        container.mux(stream.encode())


def test_replies_for_a_local_video_file(page, playground, tmp_path) -> None:
    require_surface(playground, "streaming")
    video_path = tmp_path / "clip.mp4"
    write_test_video(video_path)
    open_tab(page, playground, "reasoning")
    form = page.locator("#reasoning-form")
    form.locator("select[name=source]").select_option("file")
    form.locator("input[name=file]").set_input_files(str(video_path))
    form.locator("input[name=fps]").fill("8")
    page.locator("#reasoning-start").click()
    page.wait_for_function(
        "() => Number(document.querySelector('#reasoning-count').textContent) >= 3"
    )
    size = page.locator("#reasoning-video").evaluate(
        "v => [v.videoWidth, v.videoHeight, v.srcObject === null]"
    )
    assert size == [160, 120, True]
    page.locator("#reasoning-stop").click()
    page.wait_for_selector("#tab-reasoning[data-state=closed]", timeout=15_000)
    assert page.errors == []
