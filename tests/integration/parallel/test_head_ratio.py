"""Rank groups on a dev Cosmos3 with Nano's kind of head grouping (4 query heads over 2 K/V
heads, not the default dev model's 2 over 1) and an odd group size: Ulysses-2 splits the K/V
heads (a head-group mix-up shows), Ring-3 passes chunks around three ranks over a sequence
that does not divide by 3 (a direction or padding mix-up shows). Equal to one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.rank_groups import (
    FRAME_TOLERANCE,
    RING_TOLERANCE,
    assert_extras_close,
    assert_frames_close,
    params,
    rank_group,
    run_to_end,
)
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def grouped_heads_dir(tmp_path_factory) -> Path:
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

    target = tmp_path_factory.mktemp("cosmos3-4q2kv")
    config = Cosmos3DevConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              rope_axes_dim=(2, 1, 1), actions=False)
    build_cosmos3(target, 0, config)
    (target / "worldserve_dev.json").write_text('{"name": "cosmos3-4q2kv"}')
    return target


@pytest.mark.parametrize("parallel", ["ulysses=2", "ring=3"])
def test_grouped_heads_and_three_ranks_equal_one_process(grouped_heads_dir, parallel):
    torch.set_num_threads(1)
    solo = registry.load_runner("generation", grouped_heads_dir)
    p = params(generate_sound=True, num_inference_steps=2, seeds=[4])
    ref_frames, ref_extras = run_to_end(solo, p)
    with rank_group(grouped_heads_dir, parallel) as group:
        assert group.describe()["rank_group"]["world_size"] == int(parallel[-1])
        frames, extras = run_to_end(group, p)
    assert_frames_close(frames, ref_frames, FRAME_TOLERANCE)
    assert_extras_close(extras, ref_extras, RING_TOLERANCE)
