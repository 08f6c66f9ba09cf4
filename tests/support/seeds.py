"""One request with several seeds (`n > 1`) through a speed lever, and the checks each lever's
equivalence tests make on it: every seed's output equals that seed's solo request through the
same lever, and the seeds' outputs differ pairwise (else a bug that gives every row one noise,
or hands one row's result to another, would pass)."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import msgspec
import numpy as np

from tests.support.rank_groups import assert_extras_close, assert_frames_close
from worldserve.ipc.messages import GenerationParams
from worldserve.models.types import RowExtras

SEEDS = [3, 7, 11]  # one request, three outputs


def solo(p: GenerationParams, seed: int) -> GenerationParams:
    """The request `p` asking for `seed` alone."""
    return msgspec.structs.replace(p, seeds=[seed])


def run_rows(runner: Any, p: GenerationParams) -> list[tuple[np.ndarray, RowExtras | None]]:
    """(frames, extras) of each seed of `p`, one batch as the engine runs a request: one row
    per seed, every row owned by the request, stepped together, decoded row by row."""
    num_rows = len(p.seeds)
    state = runner.prepare(["r"] * num_rows, [p] * num_rows, p.seeds)
    while not state.done_denoising:
        runner.denoise_step(state)
    return [(runner.decode(state, row), runner.extras(state, row)) for row in range(num_rows)]


def assert_each_seed_equals_its_solo_run(runner: Any, p: GenerationParams,
                                         tolerance: float = 0.0) -> None:
    """`p`'s seeds as one batch on `runner`, then each seed as its own request on it: frames,
    sound and actions equal row by row, frames pairwise different. `tolerance` 0 (bit-equal)
    where a runner steps a batch's rows one by one (Cosmos3: the same arithmetic whatever else
    is in the batch); a runner with a batch axis (Wan) rounds a batched forward differently."""
    rows = run_rows(runner, p)
    for seed, (frames, extras) in zip(p.seeds, rows, strict=True):
        solo_frames, solo_extras = run_rows(runner, solo(p, seed))[0]
        try:
            assert_frames_close(frames, solo_frames, tolerance)
            assert_extras_close(extras, solo_extras, tolerance)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc
    assert_pairwise_different([frames for frames, _ in rows])


def assert_pairwise_different(outputs: list[Any]) -> None:
    """No two seeds gave the same array."""
    assert len(outputs) > 1
    for i, j in combinations(range(len(outputs)), 2):
        assert not np.array_equal(np.asarray(outputs[i]), np.asarray(outputs[j])), (i, j)
