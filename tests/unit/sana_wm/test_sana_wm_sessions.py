"""SANA-WM sessions against the pipeline's own outputs (shared notes model-families.md 4.B)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tests.unit.sana_wm.helpers import (
    NEW_FRAMES,
    frames_of,
    reference_chunks,
    settings,
)
from worldserve.errors import InvalidRequest
from worldserve.models.camera_keys import action_string, check_camera
from worldserve.models.sana_wm.refiner_stream import RefinerStream

# Keys held per output frame; chunk 0's first entry is its start frame's (no action makes it).
CAMERAS = [[["s"]] + [["w"]] * 10 + [["j", "w"]] * 14, None, [["l"]] * NEW_FRAMES]
# The same chunks in SanaWMPipeline's own action DSL, written out (the reference of the
# chained-call tests goes through no worldserve code that turns keys into actions).
ACTIONS = ["w-10,jw-14", "none-24", "l-24"]


def run(runner, first_frame, cameras, **fields) -> list:
    session = runner.new_session("s", settings(first_frame, **fields), "a road")
    return [runner.run_chunk(session, camera) for camera in cameras]


def test_action_string_is_run_length_dsl():
    assert action_string([["w"], ["w"], ["j", "w", "w"], []], 6) == "w-2,jw-1,none-3"
    assert action_string(None, 3) == "none-3"
    with pytest.raises(InvalidRequest, match="unknown camera key 'x'"):
        check_camera([["x"]], 25)
    with pytest.raises(InvalidRequest, match="at most 25"):
        check_camera([[]] * 26, 25)


def test_stage1_chunks_equal_chained_pipeline_calls(runner, sana_pipe, first_frame):
    outputs = run(runner, first_frame, CAMERAS)
    expected, _ = reference_chunks(sana_pipe, Image.open(io.BytesIO(first_frame)).convert("RGB"),
                                   ACTIONS)
    assert [o.num_frames for o in outputs] == [NEW_FRAMES + 1, NEW_FRAMES, NEW_FRAMES]
    for got, want in zip(outputs, expected):
        np.testing.assert_array_equal(frames_of(got), want)


def test_camera_change_takes_effect_at_its_chunk_only(runner, first_frame):
    still = run(runner, first_frame, [None, None, None])
    turned = run(runner, first_frame, [None, None, [["l"]] * NEW_FRAMES])
    for k in (0, 1):
        np.testing.assert_array_equal(frames_of(still[k]), frames_of(turned[k]))
    assert not np.array_equal(frames_of(still[2]), frames_of(turned[2]))


def test_chunk_zero_camera_keys_steer_chunk_zero(runner, first_frame):
    still = run(runner, first_frame, [None])
    turned = run(runner, first_frame, [[[]] + [["d"]] * NEW_FRAMES])
    assert not np.array_equal(frames_of(still[0]), frames_of(turned[0]))


def test_chunks_continue_from_the_previous_last_frame(runner, first_frame):
    """Chunk k+1 starts from chunk k's last emitted frame: its stage-1 first latent is that
    frame's encoding, so swapping the session image changes the next chunk."""
    session = runner.new_session("s", settings(first_frame), "a road")
    first = frames_of(runner.run_chunk(session, None))
    np.testing.assert_array_equal(np.asarray(session.image), first[-1])


def test_refiner_streamed_per_chunk_equals_one_call(runner, refined_runner, sana_refiner,
                                                    first_frame):
    plain = run(runner, first_frame, CAMERAS)
    refined = run(refined_runner, first_frame, CAMERAS)
    stage1 = torch.cat([o.latents for o in plain], dim=2)  # 1 + 3 + 3 + 3 latent frames
    whole = sana_refiner(stage1, "a road", fps=16, generator=torch.Generator().manual_seed(3),
                         output_type="latent")
    streamed = torch.cat([o.latents for o in refined], dim=2)
    assert streamed.shape == whole.shape
    assert torch.equal(streamed, whole)
    assert [o.num_frames for o in refined] == [NEW_FRAMES + 1, NEW_FRAMES, NEW_FRAMES]
    assert not np.array_equal(frames_of(refined[1]), frames_of(plain[1]))


def test_refiner_stream_any_split_equals_one_call(sana_refiner):
    torch.manual_seed(1)
    latents = torch.randn(1, 8, 16, 2, 2)
    whole = sana_refiner(latents, "a road", fps=16, generator=torch.Generator().manual_seed(5),
                         output_type="latent")
    stream = RefinerStream(sana_refiner, "a road", fps=16, seed=5)
    splits = ((0, 4), (4, 7), (7, 8), (8, 13), (13, 16))
    parts = [stream.push(latents[:, :, a:b]) for a, b in splits]
    assert [p.shape[2] for p in parts] == [4, 3, 0, 6, 3]
    assert torch.equal(torch.cat(parts, dim=2), whole)
    assert stream.cached_frames == 11  # 1 sink + 10 history: the bound, not the length


def test_per_session_state_is_bounded(refined_runner, first_frame):
    session = refined_runner.new_session("s", settings(first_frame), "a road")
    assert session.settings.first_frame is None  # the decoded image is the state, not the PNG
    sizes = []
    for _ in range(5):
        refined_runner.run_chunk(session, None)
        sizes.append((session.cache.num_frames, session.cache.nbytes()))
    assert [frames for frames, _ in sizes] == [4, 7, 10, 11, 11]
    assert sizes[3][1] == sizes[4][1]
    session.release()
    assert session.refiner is None and session.image is None


def test_first_frame_is_required(runner):
    with pytest.raises(InvalidRequest, match="first_frame is required"):
        runner.new_session("s", settings(None), "a road")
    with pytest.raises(InvalidRequest, match="not a decodable image"):
        runner.new_session("s", settings(b"not an image"), "a road")


def test_guidance_doubles_the_batch_and_changes_frames(runner, sana_pipe, first_frame):
    batch_sizes: list[int] = []

    def record(module, args, kwargs):
        batch_sizes.append((args[0] if args else kwargs["hidden_states"]).shape[0])

    hook = sana_pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        guided = run(runner, first_frame, [None], guidance_scale=3.0)
        guided_batches = list(batch_sizes)
        batch_sizes.clear()
        plain = run(runner, first_frame, [None])
    finally:
        hook.remove()
    assert guided_batches == [2, 2] and batch_sizes == [1, 1]  # 2 steps: cond + uncond rows
    expected, _ = reference_chunks(sana_pipe, Image.open(io.BytesIO(first_frame)).convert("RGB"),
                                   ["none-24"], guidance_scale=3.0)
    np.testing.assert_array_equal(frames_of(guided[0]), expected[0])
    assert not np.array_equal(frames_of(guided[0]), frames_of(plain[0]))


def test_refined_frames_equal_one_decode_of_the_whole_refined_video(refined_runner, sana_pipe,
                                                                     first_frame):
    """The session's streaming LTX-2 decoder: chunk by chunk == decoding everything at once."""
    refined = run(refined_runner, first_frame, CAMERAS)
    streamed = np.concatenate([frames_of(o) for o in refined])
    latents = torch.cat([o.latents for o in refined], dim=2)
    with torch.no_grad():
        pixels = sana_pipe._decode_latents(latents)
    whole = sana_pipe.video_processor.postprocess_video(pixels, output_type="np")[0]
    whole = (whole * 255).round().clip(0, 255).astype(np.uint8)
    assert streamed.shape == whole.shape == (1 + 3 * NEW_FRAMES, 64, 64, 3)
    assert np.abs(streamed.astype(int) - whole.astype(int)).max() <= 1  # float rounding only


def test_streaming_decoder_any_split_equals_one_decode(sana_pipe):
    from worldserve.models.sana_wm.vae_stream import StreamingLTX2Decoder

    torch.manual_seed(0)
    latents = torch.randn(1, 8, 10, 2, 2)
    with torch.no_grad():
        whole = sana_pipe.vae.decode(latents, return_dict=False)[0]
    decoder = StreamingLTX2Decoder(sana_pipe.vae)
    parts = [decoder(latents[:, :, a:b]) for a, b in ((0, 4), (4, 7), (7, 8), (8, 10))]
    assert [p.shape[2] for p in parts] == [25, 24, 8, 16]
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, rtol=0, atol=1e-4)
    plain = sana_pipe.vae.decode(latents[:, :, 4:7], return_dict=False)[0]
    assert plain.shape[2] == 17  # the shared VAE is untouched after a streamed call
