"""vLLM-Omni's `WS /v1/realtime/video` against a live server with the fake realtime backend.

The fake backend's frames are a pure function of prompt, seed, size and camera keys
(engines/realtime/fake.py), so each test decodes the fMP4 chunks with PyAV and compares them
with the frames the mapped controls must produce. H.264 is lossy: a match is a mean absolute
error under `MATCH`, and every test also checks that the frames of the *default* (or the
previous) value would not match, so a field that silently fell back to its default fails.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.integration.realtime.helpers import ExpectedFrames
from tests.integration.realtime.helpers import Session as SGLangSession
from tests.integration.realtime.helpers import connect as sglang_connect
from tests.integration.realtime.omni_client import (
    OmniSession,
    connect,
    decode_chunk,
    decode_fmp4,
    start,
)

MATCH = 4.0  # mean absolute error of a correct chunk after H.264 (measured about 1.3)
FRAMES = 12  # the fake backend's frames per chunk
W, H = 128, 96


def mae(frames: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(frames.astype(np.int16) - expected.astype(np.int16)).mean())


def assert_matches(frames: np.ndarray, expected: np.ndarray, default: np.ndarray) -> None:
    assert mae(frames, expected) < MATCH
    assert mae(frames, default) > 2 * MATCH, "the default value's frames would match too"


async def admin_sessions(server) -> int:
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"{server.base_url}/admin/stats", timeout=5)).json()
    return body["stages"]["realtime"]["sessions"]


async def wait_released(server) -> None:
    deadline = time.monotonic() + 5
    while await admin_sessions(server) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await admin_sessions(server) == 0


async def test_start_streams_fmp4_chunks_with_the_requested_size_fps_and_seed(rt_server):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("north", size=f"{W}x{H}", fps=12, seed=7, num_frames=30))
        video_start = await session.next_message()
        done = await session.until("session.done")
        code = await session.close_code()
    assert video_start["type"] == "video.start" and video_start["format"] == "m4s"
    request_id = video_start["request_id"]
    assert request_id.startswith("video_stream-")
    assert {k: video_start["config"][k] for k in ("width", "height", "fps", "seed")} == {
        "width": W, "height": H, "fps": 12, "seed": 7}
    assert done == {"type": "session.done", "request_id": request_id, "chunks": 3,
                    "stopped": False}
    assert code == (1000, "generation complete")
    expected = ExpectedFrames("north", seed=7, width=W, height=H)
    default_seed = ExpectedFrames("north", seed=42, width=W, height=H)
    for index, chunk in enumerate(session.chunks):
        meta = chunk.metadata
        assert meta["request_id"] == request_id and meta["kind"] == "media"
        assert meta["transport_chunk_index"] == meta["generation_chunk_index"] == index
        assert meta["byte_length"] == len(chunk.data) and meta["num_frames"] == FRAMES
        decoded = decode_chunk(session.chunks, index)
        assert (decoded.width, decoded.height, decoded.fps) == (W, H, 12)
        assert len(decoded.frames) == meta["num_frames"]
        assert_matches(decoded.frames, expected.chunk(), default_seed.chunk())
    whole = decode_fmp4(b"".join(c.data for c in session.chunks))
    assert len(whole.frames) == 3 * FRAMES
    await wait_released(rt_server)


async def test_start_image_reference_is_the_first_frame(rt_server):
    image = Image.new("RGB", (16, 16), (30, 60, 90))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("framed", size=f"{W}x{H}", num_frames=FRAMES,
                                 image_reference={"image_url": url}))
        await session.until("session.done")
    expected = ExpectedFrames("framed", width=W, height=H, first_frame_mean=60)
    without = ExpectedFrames("framed", width=W, height=H)
    assert_matches(decode_chunk(session.chunks, 0).frames, expected.chunk(), without.chunk())


@pytest.mark.parametrize("extra_params, camera", [
    ({"camera_action_script": [[["d"], ["D"], ["d"]], [["w"], [], ["a", "l"]]]},
     [["d"]] * 12 + [["w"]] * 4 + [[]] * 4 + [["a", "l"]] * 4),
    ({"sana_wm": {"action": "l-6,none-6,k-12"}}, [["l"]] * 6 + [[]] * 6 + [["k"]] * 12),
])
async def test_start_camera_script_drives_the_chunks(rt_server, extra_params, camera):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("east", size=f"{W}x{H}", seed=3, num_frames=24,
                                 extra_params=extra_params))
        await session.until("session.done")
    expected = ExpectedFrames("east", seed=3, width=W, height=H)
    still = ExpectedFrames("east", seed=3, width=W, height=H)
    for index in range(2):
        frames = decode_chunk(session.chunks, index).frames
        assert_matches(frames, expected.chunk(camera[index * FRAMES:(index + 1) * FRAMES]),
                       still.chunk())


async def run_with_interaction(server, interaction: dict, after: int = 2):
    """An open-ended session: one chunk, the interaction, then `after` chunks past the one it
    started in, then `session.stop` (robust to a slow client: the session waits for it)."""
    async with connect(server) as ws:
        session = OmniSession(ws)
        await session.send(start("north", size=f"{W}x{H}", seed=5))
        await session.wait_chunks(1)
        await session.send({"type": "session.interaction", "interaction": interaction})
        queued = await session.until("session.interaction.queued")
        while not any(interaction["event_id"] in c.metadata["started_event_ids"]
                      for c in session.chunks[-after - 1:-after] if len(session.chunks) > after):
            await session.step()
        await session.send({"type": "session.stop"})
        assert (await session.until("session.done"))["stopped"] is True
    return session, queued


def first_chunk_with(session: OmniSession, event_id: str) -> int:
    started = [i for i, c in enumerate(session.chunks)
               if event_id in c.metadata["started_event_ids"]]
    assert len(started) == 1, "an interaction starts in exactly one chunk"
    return started[0]


async def test_interaction_prompt_and_camera_change_the_next_chunk(rt_server):
    camera = {"mode": "velocity", "data": {"translation": [0.05, 0.0, 0.0],
                                           "rotation": [0.0, 0.0523, 0.0, 0.9986]}}
    session, queued = await run_with_interaction(rt_server, {
        "event_id": "turn", "event": {"prompt": "south",
                                      "multi_modal_data": {"camera": camera}}})
    assert queued["event_id"] == "turn"
    switch = first_chunk_with(session, "turn")
    assert 1 <= switch < len(session.chunks)
    assert session.chunks[switch].metadata["completed_event_ids"] == ["turn"]
    expected = ExpectedFrames("north", seed=5, width=W, height=H)
    unchanged = ExpectedFrames("north", seed=5, width=W, height=H)
    for index in range(len(session.chunks)):
        frames = decode_chunk(session.chunks, index).frames
        if index < switch:
            assert mae(frames, expected.chunk()) < MATCH
            unchanged.chunk()
            continue
        assert "turn" in session.chunks[index].metadata["active_event_ids"]
        prompt = "south" if index == switch else None
        assert_matches(frames, expected.chunk([["d", "l"]] * FRAMES, prompt=prompt),
                       unchanged.chunk())


async def test_interaction_camera_script_plays_once_then_stops(rt_server):
    script = {"schema": "lingbot.camera_actions.v1",
              "data": {"mode": "script", "frames": [["w"], ["s", "j"], []]}}
    session, _ = await run_with_interaction(rt_server, {
        "event_id": "dash", "event": {"multi_modal_data": {"camera": script}}})
    switch = first_chunk_with(session, "dash")
    expected = ExpectedFrames("north", seed=5, width=W, height=H)
    unchanged = ExpectedFrames("north", seed=5, width=W, height=H)
    played = [["w"]] * 4 + [["s", "j"]] * 4 + [[]] * 4
    for index in range(len(session.chunks)):
        frames = decode_chunk(session.chunks, index).frames
        if index == switch:
            assert_matches(frames, expected.chunk(played), unchanged.chunk())
        else:  # before: nothing yet; after: the script is used up, the camera stays put
            assert mae(frames, expected.chunk()) < MATCH
            unchanged.chunk()


async def test_ping_pong_then_stop_ends_with_done_and_releases(rt_server):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("west", size="64x48"))  # no num_frames: until stopped
        await session.wait_chunks(2)
        await session.send({"type": "session.ping"})
        assert await session.until("session.pong") == {"type": "session.pong"}
        await session.send({"type": "session.stop"})
        done = await session.until("session.done")
        code = await session.close_code()
    assert done["stopped"] is True and done["chunks"] >= 2
    assert code == (1000, "session stopped")
    await wait_released(rt_server)


@pytest.mark.parametrize("message, param", [
    ({"type": "session.start"}, "prompt"),
    (start(size="big"), "size"),
    (start(format="mp4"), "format"),
    (start(colour="red"), "colour"),
    (start(quality="high"), "quality"),
    (start(width=128), "height"),
    (start(size="100x96"), "size"),
    (start(num_inference_steps=60), "num_inference_steps"),  # the fake model's limit: 50
    (start(guidance_scale=0.5), "guidance_scale"),
    (start(image_reference={"image_url": "data:image/png;base64,AAAA"}),
     "image_reference.image_url"),
    (start(model="someone/else"), "model"),
    (start(image_reference={"file_id": "file-1"}), "image_reference.file_id"),
    (start(extra_params={"flow_shift": 3.0}), "extra_params.flow_shift"),
    (start(extra_params={"camera_action_script": [[["w"]]]}),
     "extra_params.camera_action_script[0]"),
    (start(extra_params={"camera_action_script": [[["w"], ["x"], []]]}),
     "extra_params.camera_action_script[0][1]"),
    (start(extra_params={"sana_wm": {"action": "fly-3"}}), "extra_params.sana_wm.action"),
    ({"type": "session.begin", "prompt": "p"}, "type"),
])
async def test_bad_session_start_is_an_error_naming_the_field(rt_server, message, param):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(message)
        error = await session.next_message()
        code = await session.close_code()
    assert error["type"] == "error" and error["param"] == param, error
    if param != "type":  # vLLM-Omni's own text: "Expected session.start, got: ..."
        assert param.split("[")[0].split(".")[-1] in error["message"].lower(), error
    assert code == (1008, "invalid session.start")


async def test_malformed_first_message_is_an_error_then_1008(rt_server):
    for payload in ("not json", b"\x00binary"):
        async with connect(rt_server) as ws:
            session = OmniSession(ws)
            await ws.send(payload)
            error = await session.next_message()
            assert error["type"] == "error" and error["message"]
            assert await session.close_code() == (1008, "invalid session.start")


async def test_bad_control_messages_are_errors_and_the_session_goes_on(rt_server):
    bad = [
        ({"type": "session.teleport"}, "type"),
        ({"type": "session.interaction"}, "interaction"),
        ({"type": "session.interaction", "interaction": {"event_id": 7, "event": {}}},
         "interaction.event_id"),
        ({"type": "session.interaction", "interaction": {"event": {"prompt": "p"},
                                                         "transition_chunks": 2}},
         "interaction.transition_chunks"),
        ({"type": "session.interaction", "interaction": {"event": {
            "prompt": "p", "negative_prompt": "blur"}}}, "interaction.event.negative_prompt"),
        ({"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {
            "camera": {"mode": "target", "data": {"translation": [0, 0, 1]}}}}}},
         "interaction.event.multi_modal_data.camera.mode"),
        ({"type": "session.interaction", "interaction": {"event": {"multi_modal_data": {
            "camera": {"mode": "velocity", "data": {"translation": [0, 1, 0]}}}}}},
         "interaction.event.multi_modal_data.camera.data"),
    ]
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("calm", size="64x48"))  # until stopped
        await session.wait_chunks(1)
        for message, param in bad:
            await session.send(message)
            error = await session.until("error")
            assert error["param"] == param, (message, error)
        await ws.send(b"\x01binary")
        assert "binary" in (await session.until("error"))["message"]
        ok = {"type": "session.interaction", "interaction": {"event_id": "a",
                                                             "event": {"prompt": "q"}}}
        await session.send(ok)
        assert (await session.until("session.interaction.queued"))["event_id"] == "a"
        await session.send(ok)
        conflict = await session.until("error")
        assert (conflict["code"], conflict["event_id"]) == ("event_id_conflict", "a")
        await session.send({"type": "session.stop"})
        done = await session.until("session.done")
        assert await session.close_code() == (1000, "session stopped")
    assert done["stopped"] is True and done["chunks"] == len(session.chunks)


async def test_two_concurrent_sessions_are_isolated(rt_server):
    async def one(prompt: str, seed: int, keys: list[str], event_id: str):
        async with connect(rt_server) as ws:
            session = OmniSession(ws)
            await session.send(start(prompt, size=f"{W}x{H}", seed=seed))
            await session.wait_chunks(1)
            await session.send({"type": "session.interaction", "interaction": {
                "event_id": event_id, "event": {"multi_modal_data": {"camera": {
                    "schema": "lingbot.camera_actions.v1",
                    "data": {"mode": "state", "transitions": [{"actions": keys}]}}}}}})
            while not any(event_id in c.metadata["started_event_ids"]
                          for c in session.chunks[:-2]):
                await session.step()
            await session.send({"type": "session.stop"})
            await session.until("session.done")
        switch = first_chunk_with(session, event_id)
        expected = ExpectedFrames(prompt, seed=seed, width=W, height=H)
        for index in range(len(session.chunks)):
            camera = [keys] * FRAMES if index >= switch else None
            assert mae(decode_chunk(session.chunks, index).frames,
                       expected.chunk(camera)) < MATCH
        ids = {c.metadata["request_id"] for c in session.chunks}
        assert all(event_id in c.metadata["active_event_ids"]
                   for c in session.chunks[switch:])
        return ids

    ids = await asyncio.gather(one("north", 11, ["w"], "x"), one("south", 12, ["j"], "y"))
    assert len(ids[0] | ids[1]) == 2
    await wait_released(rt_server)


async def test_cadence_figures_for_both_protocols_in_metrics(rt_server):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("metrics", size="64x48", num_frames=3 * FRAMES))
        await session.until("session.done")
    async with sglang_connect(rt_server) as ws:
        sglang = SGLangSession(ws)
        await sglang.send({"type": "init", "prompt": "metrics", "size": "64x48",
                           "max_chunks": 3})
        await sglang.read_until_close()
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{rt_server.base_url}/metrics", timeout=5)).text
    for protocol in ("vllm_omni", "sglang"):
        for name in ("worldserve_realtime_first_chunk_seconds_count",
                     "worldserve_realtime_chunk_interval_seconds_count",
                     "worldserve_realtime_factor_count"):
            line = next(li for li in text.splitlines()
                        if li.startswith(f'{name}{{protocol="{protocol}"}}'))
            assert float(line.split()[-1]) >= 1, line


@pytest.mark.parametrize("how", ["close", "vanish"])
async def test_a_client_that_closes_or_vanishes_frees_the_session(rt_server, how):
    async with connect(rt_server) as ws:
        session = OmniSession(ws)
        await session.send(start("gone", size="64x48"))  # runs until the client leaves
        await session.wait_chunks(2)
        assert await admin_sessions(rt_server) == 1
        if how == "vanish":
            ws.transport.abort()  # no close frame: the TCP connection just drops
    await wait_released(rt_server)
