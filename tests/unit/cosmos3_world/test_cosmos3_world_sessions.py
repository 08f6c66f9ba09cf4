"""Cosmos3 world sessions (camera_pose forward dynamics, chunk by chunk): each chunk equals the
pipeline's own `__call__` from the previous chunk's last frame with that chunk's pose deltas
(written out from the documented mapping) and prompt; camera keys steer their own chunk, chunk 0
included; first_frame is required; poses follow the documented mapping."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.cosmos3_world.helpers import (
    NEW_FRAMES,
    POSE_OF,
    SIZE,
    assert_frames_match,
    frames_of,
    poses,
    reference_chunks,
    settings,
    start_image,
)
from worldserve.errors import InvalidRequest
from worldserve.models.cosmos3.world import pose_deltas, resolution_tier


def run(runner, first_frame, cameras, **fields):
    session = runner.new_session("s", settings(first_frame, **fields), "a road")
    return session, [runner.run_chunk(session, camera) for camera in cameras]


def test_pose_deltas_follow_the_documented_mapping():
    keys = ["", "w", "s", "a", "d", "l", "j", "i", "k"]
    deltas = pose_deltas([list(k) for k in keys], 10)
    assert deltas.shape == (10, 9) and deltas.dtype == torch.float32
    want = torch.tensor([POSE_OF[k] for k in keys] + [POSE_OF[""]],  # past the list: no key
                        dtype=torch.float32)
    torch.testing.assert_close(deltas, want, atol=1e-6, rtol=0)


def test_chunks_equal_chained_pipeline_calls(world_runner, first_frame):
    # chunk 0's first entry belongs to its start frame; later chunks: one entry per new frame
    cameras = [[["a"]] + [["w"]] * 4, [["j"]] * NEW_FRAMES, [["d"], ["d"], ["i"]]]
    _, outs = run(world_runner, first_frame, cameras)
    assert [o.num_frames for o in outs] == [NEW_FRAMES + 1, NEW_FRAMES, NEW_FRAMES]
    written_out = [poses(("w", 4), ("", 4)), poses(("j", 8)), poses(("d", 2), ("i", 1), ("", 5))]
    want, inputs = reference_chunks(world_runner.model, start_image(first_frame), written_out)
    for k, (out, expected) in enumerate(zip(outs, want)):
        assert_frames_match(frames_of(out), expected, f"chunk {k}")
    # chunk k's input frame is chunk k-1's last output frame
    for k in (1, 2):
        assert_frames_match(inputs[k][None], frames_of(outs[k - 1])[-1:], f"input {k}")


def test_camera_keys_change_only_later_chunks(world_runner, first_frame):
    _, forward = run(world_runner, first_frame, [None, [["w"]] * NEW_FRAMES, None])
    _, turning = run(world_runner, first_frame, [None, [["j"]] * NEW_FRAMES, None])
    np.testing.assert_array_equal(frames_of(forward[0]), frames_of(turning[0]))
    assert not np.array_equal(frames_of(forward[1]), frames_of(turning[1]))
    assert not np.array_equal(frames_of(forward[2]), frames_of(turning[2]))


def test_chunk_zero_camera_keys_steer_chunk_zero(world_runner, first_frame):
    _, still = run(world_runner, first_frame, [None])
    _, moving = run(world_runner, first_frame, [[[]] + [["d"]] * NEW_FRAMES])
    assert not np.array_equal(frames_of(still[0]), frames_of(moving[0]))


def test_chunk_zero_camera_skips_the_start_frame_entry(world_runner, first_frame):
    """Chunk 0's first camera entry belongs to its start frame (no action produces it)."""
    _, a = run(world_runner, first_frame, [[["j"]] + [["w"]] * NEW_FRAMES])
    _, b = run(world_runner, first_frame, [[["d"]] + [["w"]] * NEW_FRAMES])
    np.testing.assert_array_equal(frames_of(a[0]), frames_of(b[0]))


def test_prompt_change_reaches_the_next_chunk(world_runner, first_frame):
    session = world_runner.new_session("s", settings(first_frame), "a road")
    switched = [world_runner.run_chunk(session, None),
                world_runner.run_chunk(session, None, prompt="a forest")]
    _, kept = run(world_runner, first_frame, [None, None])
    want, _ = reference_chunks(world_runner.model, start_image(first_frame),
                               [poses(("", NEW_FRAMES))] * 2, prompts=["a road", "a forest"])
    for out, expected in zip(switched, want):
        np.testing.assert_array_equal(frames_of(out), expected)
    np.testing.assert_array_equal(frames_of(switched[0]), frames_of(kept[0]))
    assert not np.array_equal(frames_of(switched[1]), frames_of(kept[1]))


def test_first_frame_is_required(world_runner):
    with pytest.raises(InvalidRequest, match="first_frame is required"):
        world_runner.new_session("s", settings(None), "a road")


def test_bad_inputs_are_invalid_requests(world_runner, first_frame):
    with pytest.raises(InvalidRequest, match="first_frame is not a readable image"):
        world_runner.new_session("s", settings(b"nope"), "a road")
    with pytest.raises(InvalidRequest, match="fits no Cosmos3 action canvas"):
        world_runner.new_session("s", settings(first_frame, width=1280, height=1280), "x")
    session = world_runner.new_session("s", settings(first_frame), "a road")
    with pytest.raises(InvalidRequest, match="unknown camera key 'x'"):
        world_runner.run_chunk(session, [["x"]])
    with pytest.raises(InvalidRequest, match=f"at most {NEW_FRAMES + 1}"):
        world_runner.run_chunk(session, [["w"]] * (NEW_FRAMES + 2))
    assert session.next_chunk == 0  # refused chunks leave the session where it was


def test_state_is_one_frame_and_release_drops_it(world_runner, first_frame):
    session, _ = run(world_runner, first_frame, [None, None])
    assert session.cache.nbytes() == SIZE * SIZE * 3 and session.cache.num_tokens == 0
    assert session.settings.first_frame is None  # the encoded upload is not kept
    session.release()
    assert session.image is None and session.cache.nbytes() == 0


@pytest.mark.parametrize("size, tier", [((64, 64), 256), ((256, 320), 256), ((640, 640), 480),
                                        ((832, 480), 480), ((1280, 704), 704),
                                        ((1280, 720), 720), ((1280, 1280), None)])
def test_resolution_tier_holds_the_session_size(size, tier):
    assert resolution_tier(*size) == tier
