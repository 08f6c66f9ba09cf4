"""Realtime world tab: msgpack WebSocket frames on a canvas, steered with held keys
(fake realtime backend: its frames encode the camera position, so movement is checkable)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import open_tab, require_surface, screenshot

WIDTH, HEIGHT = 256, 144
PROBE_X, PROBE_Y = 128, 72
# The fake backend draws green = (y + camera_y) % 256 and blue = a tint from (seed, prompt);
# W moves the camera up by 4 px per frame. Lossy encodings get a tolerance.
TOLERANCE = {"raw": 0, "delta-gzip": 0, "jpeg": 12, "webp": 12}

PIXEL_JS = f"""() => {{
    const c = document.querySelector('#realtime-canvas');
    if (c.width !== {WIDTH}) return null;
    return Array.from(c.getContext('2d').getImageData({PROBE_X}, {PROBE_Y}, 1, 1).data.slice(0, 3));
}}"""


def probe(page) -> list[int] | None:
    return page.evaluate(PIXEL_JS)


def start_session(page, encoding: str) -> None:
    form = page.locator("#realtime-form")
    form.locator("select[name=encoding]").select_option(encoding)
    form.locator("select[name=size]").select_option(f"{WIDTH}x{HEIGHT}")
    page.locator("#realtime-start").click()
    page.wait_for_function(
        "() => Number(document.querySelector('#tab-realtime').dataset.chunks) >= 1", timeout=20_000
    )
    page.wait_for_function(f"() => ({PIXEL_JS})() !== null")


def green_moved(page, baseline: int, tolerance: int) -> None:
    page.wait_for_function(
        f"() => {{ const p = ({PIXEL_JS})(); return p && Math.abs(p[1] - {baseline}) > {tolerance + 8}; }}",  # noqa: E501
        timeout=15_000,
    )


@pytest.mark.parametrize("encoding", ["raw", "jpeg", "delta-gzip", "webp"])
def test_frames_follow_held_keys(page, playground, encoding: str) -> None:
    require_surface(playground, "realtime")
    open_tab(page, playground, "realtime")
    start_session(page, encoding)
    tolerance = TOLERANCE[encoding]
    green = probe(page)[1]
    assert abs(green - PROBE_Y) <= tolerance, "no key held yet: the camera has not moved"

    page.keyboard.down("w")
    assert page.locator("#realtime-keys").inner_text() == "W"
    green_moved(page, PROBE_Y, tolerance)
    page.keyboard.up("w")
    assert page.locator("#realtime-keys").inner_text() == "none"
    assert page.locator("#realtime-control").inner_text().endswith(" ms")
    if encoding == "raw":
        screenshot(page, "realtime")
    page.locator("#realtime-stop").click()
    page.wait_for_selector("#tab-realtime[data-state=stopped]")
    assert page.locator("#realtime-form .error").is_hidden()
    assert page.errors == []


def test_prompt_switch_and_chunk_stats(page, playground) -> None:
    require_surface(playground, "realtime")
    from worldserve.engines.realtime.fake import prompt_tint

    open_tab(page, playground, "realtime")
    form = page.locator("#realtime-form")
    seed = int(form.locator("input[name=seed]").input_value())
    first_prompt = form.locator("textarea[name=prompt]").input_value()
    start_session(page, "raw")
    assert probe(page)[2] == prompt_tint(first_prompt, seed)

    new_prompt = "a desert canyon at noon"
    form.locator("input[name=next_prompt]").fill(new_prompt)
    page.locator("#realtime-prompt").click()
    expected = prompt_tint(new_prompt, seed)
    page.wait_for_function(f"() => ({PIXEL_JS})()[2] === {expected}", timeout=15_000)

    bytes_text = page.locator("#realtime-bytes").inner_text()
    per_frame = int(bytes_text.split(" B")[0].replace(",", ""))
    raw_frame = WIDTH * HEIGHT * 3
    assert raw_frame <= per_frame < raw_frame + 512, bytes_text  # payload plus msgpack headers
    assert "application/x-raw-rgb" in bytes_text
    assert " ms total" in page.locator("#realtime-chunk").inner_text()
    page.wait_for_function(
        "() => parseFloat(document.querySelector('#realtime-fps').textContent) > 1"
    )
    page.locator("#realtime-stop").click()
    assert page.errors == []


def test_refused_init_is_shown_and_ends_the_session(page, playground) -> None:
    require_surface(playground, "realtime")
    open_tab(page, playground, "realtime")
    # a size the model cannot make (not a multiple of 16), as a hand-edited request would be
    page.evaluate("""() => { const s = document.querySelector('#realtime-form select[name=size]');
                            s.add(new Option('100x100', '100x100')); s.value = '100x100'; }""")
    page.locator("#realtime-start").click()
    error = page.locator("#realtime-form .error")
    error.wait_for(state="visible", timeout=15_000)
    assert (
        error.locator("strong").inner_text()
        == "The server refused the request: check the settings."
    )
    assert "invalid generate request" in error.locator(".detail").inner_text()
    page.wait_for_selector("#tab-realtime[data-state=stopped]")
    assert page.locator("#realtime-start").is_enabled()
    assert [e for e in page.errors if e.startswith("uncaught")] == []
