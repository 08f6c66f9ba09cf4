"""VAE decode options of the generation stage: a Wan VAE decode spread over calls (its causal
feature cache kept in between) equals one `vae.decode`, tiled or not; the engine decodes a long
video a few latent frames per step and another job's denoising steps run between the chunks;
several seeds of one request, decoded that way, each equal their solo request; tiling reaches
the VAE and /admin/model_info; settings a runner cannot honour fail startup."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.support.seeds import SEEDS, assert_pairwise_different
from tests.unit.generation.test_cosmos3_engine import Replies, drain, engine_for, media
from worldserve.config import GenerationStageConfig
from worldserve.engines.generation.levers import configure_vae
from worldserve.ipc.messages import GenerationResult
from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_vae
from worldserve.models.wan.vae import TilingOptions, WanDecodeJob, configure_tiling

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return build_vae(Cosmos3DevConfig())


@pytest.mark.parametrize("tiling", [None, TilingOptions(64, 48)], ids=["untiled", "tiled"])
def test_decode_in_chunks_equals_one_decode(vae, tiling):
    z = torch.randn(1, 8, 3, 5, 6, generator=torch.Generator().manual_seed(1))
    configure_tiling(vae, tiling)
    try:
        with torch.no_grad():
            whole = vae.decode(z).sample
            for chunk in (1, 2):
                job = WanDecodeJob(vae, z)
                assert job.tiled is (tiling is not None)
                calls = 1
                while not job.advance(chunk):
                    calls += 1
                assert calls == len(job.tiles) * -(-3 // chunk)  # ceil(frames / chunk) per tile
                assert torch.equal(job.result(), whole), chunk
    finally:
        configure_tiling(vae, None)


def test_tile_sizes_the_vae_cannot_cut_are_refused(vae):
    try:
        with pytest.raises(ValueError, match="vae_tile_size 40 is not a multiple of"):
            configure_tiling(vae, TilingOptions(40, 32))
        with pytest.raises(ValueError, match="vae_tile_stride 192 is larger than"):
            configure_tiling(vae, TilingOptions(128, None))  # the VAE's own stride stays
    finally:
        configure_tiling(vae, None)


def test_an_unfinished_job_has_no_result(vae):
    job = WanDecodeJob(vae, torch.zeros(1, 8, 3, 2, 2))
    with torch.no_grad():
        job.advance(1)
    with pytest.raises(RuntimeError, match="advance"):
        job.result()


def record_calls(engine) -> list[tuple[str, str]]:
    """(call, request id) of every denoise_step / decode_chunk the engine makes."""
    calls: list[tuple[str, str]] = []
    runner = engine.runner
    denoise, chunk = runner.denoise_step, runner.decode_chunk

    def denoise_step(state):
        calls.append(("denoise", state.row_owner[0]))
        return denoise(state)

    def decode_chunk(state, row, max_frames):
        calls.append(("decode", state.row_owner[row]))
        return chunk(state, row, max_frames)

    runner.denoise_step, runner.decode_chunk = denoise_step, decode_chunk
    return calls


def record_decoded(engine) -> dict[tuple[str, int], np.ndarray]:
    """(request id, row) -> the frames the engine decoded for that row, once it finished."""
    frames: dict[tuple[str, int], np.ndarray] = {}
    original = engine._decode

    def keep(state, row):
        out = original(state, row)
        if out is not None:
            frames[state.row_owner[row], row] = out
        return out

    engine._decode = keep
    return frames


def tiling_settings(tiled: bool) -> dict:
    """32-pixel tiles at stride 32: a 48x32 video is 1 row x 2 columns of tiles."""
    return dict(vae_tiling=True, vae_tile_size=32, vae_tile_stride=32) if tiled else {}


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
def test_long_decode_lets_another_job_step_between_its_chunks(cosmos3_dir, tmp_path, tiled):
    engine = engine_for(cosmos3_dir, tmp_path / "out", max_running_requests=2,
                        vae_decode_chunk_frames=1, warmup_resolutions=["48x32"],
                        **tiling_settings(tiled))
    calls = record_calls(engine)
    frames = record_decoded(engine)
    long_video = media("long", num_frames=13, num_inference_steps=2)  # 4 latent frames
    replies = {"long": Replies(), "other": Replies()}
    engine.submit(long_video, replies["long"])
    engine.submit(media("other", num_inference_steps=10), replies["other"])
    while engine.has_work():
        engine.step()
    assert all(isinstance(r.last, GenerationResult) for r in replies.values())
    chunks = [i for i, call in enumerate(calls) if call == ("decode", "long")]
    # 48x32 pixels = 3x2 latent pixels; 32-pixel tiles at stride 32 = 2 latent pixels at
    # stride 2: 1 row x 2 columns of tiles (the seam blending: test_decode_in_chunks_...)
    tiles = 2 if tiled else 1
    assert len(chunks) == 4 * tiles
    between = calls[chunks[0]:chunks[-1]]
    assert ("denoise", "other") in between, calls
    # the chunked decode equals the plain one (same VAE settings), frame for frame
    solo = engine.runner.run_to_end(long_video.params, 5)[0]
    assert np.array_equal(frames["long", 0], solo)
    described = engine.admin.model_info()["vae"]
    assert described["decode_chunk_frames"] == 1 and described["tiling"] is tiled
    if tiled:
        assert (described["tile_size"], described["tile_stride"]) == (32, 32)
        assert engine.runner.pipe.vae.use_tiling


@pytest.mark.parametrize("tiled", [False, True], ids=["untiled", "tiled"])
def test_several_seeds_of_one_request_decoded_in_chunks_equal_each_seeds_solo_request(
        cosmos3_dir, tmp_path, tiled):
    """Each row keeps its own decode job (the causal feature cache between chunks)."""
    engine = engine_for(cosmos3_dir, tmp_path / "out", vae_decode_chunk_frames=1,
                        warmup_resolutions=["48x32"], **tiling_settings(tiled))
    frames = record_decoded(engine)
    for msg in [media("n", num_frames=9, num_inference_steps=2, seeds=SEEDS),
                *(media(f"solo-{seed}", num_frames=9, num_inference_steps=2, seeds=[seed])
                  for seed in SEEDS)]:
        replies = Replies()
        engine.submit(msg, replies)
        drain(engine)
        assert isinstance(replies.last, GenerationResult), replies.last
    rows = [frames["n", row] for row in range(len(SEEDS))]
    for seed, row in zip(SEEDS, rows, strict=True):
        assert np.array_equal(row, frames[f"solo-{seed}", 0]), seed
    assert_pairwise_different(rows)


def test_tile_settings_are_checked():
    with pytest.raises(ValueError, match="need vae_tiling"):
        GenerationStageConfig(vae_tile_size=256)
    with pytest.raises(ValueError, match="must not exceed"):
        GenerationStageConfig(vae_tiling=True, vae_tile_size=128, vae_tile_stride=192)


def test_a_runner_without_chunked_decode_refuses_the_settings(tmp_path: Path):
    plain = SimpleNamespace(features=SimpleNamespace(family="wan"))
    assert configure_vae(plain, GenerationStageConfig()) == {"tiling": False,
                                                             "decode_chunk_frames": 0}
    for settings in (dict(vae_tiling=True), dict(vae_decode_chunk_frames=2)):
        with pytest.raises(ValueError, match="wan runner decodes in one call"):
            configure_vae(plain, GenerationStageConfig(**settings))
