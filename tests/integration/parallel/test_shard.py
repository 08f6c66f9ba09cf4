"""cfg=2 with shard=2: the cond and uncond forwards on two ranks whose decoder-block weights
are split between them (each reads only its rows from the checkpoint and holds half; the
blocks are all-gathered one at a time, both ranks running the same blocks in the same order):
the same arithmetic as one process (sound and actions bit-identical; frames through the
strip-parallel VAE decode within FRAME_TOLERANCE)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.images import random_png as png
from tests.support.rank_groups import (
    FRAME_TOLERANCE,
    action_params,
    assert_extras_close,
    assert_frames_close,
    group_fixtures,
    params,
    run_to_end,
)
from worldserve.errors import NotSupported

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


group, solo_runner = group_fixtures("cfg=2,shard=2")


def test_each_rank_holds_half_of_the_block_weights(group, solo_runner):
    shards = group.describe()["parallel"]["shards"]
    blocks = solo_runner.pipe.transformer.layers
    full = sum(p.nbytes for p in blocks.parameters())
    assert shards["params"] == sum(p.numel() for p in blocks.parameters())
    assert 0.5 <= shards["local_bytes"] / full < 0.55  # half, plus odd-row padding
    assert all(p.numel() == 0 for p in group.pipe.transformer.layers.parameters())
    assert group.num_params == solo_runner.num_params


@pytest.mark.parametrize("p", [params(condition_images=[png(56, 40)]),
                               action_params("policy", generate_sound=False)],
                         ids=["i2v", "policy"])
def test_sharded_weights_compute_what_one_process_computes(group, solo_runner, p):
    frames, extras = run_to_end(group, p)
    ref_frames, ref_extras = run_to_end(solo_runner, p)
    assert_frames_close(frames, ref_frames, FRAME_TOLERANCE)
    assert_extras_close(extras, ref_extras, 0.0)


def test_sound_is_bit_identical(group, solo_runner):
    p = params(generate_sound=True, num_frames=1, width=32, height=32)
    assert np.array_equal(run_to_end(group, p)[1].audio, run_to_end(solo_runner, p)[1].audio)


def test_weights_cannot_be_updated_in_place(group, tmp_path):
    with pytest.raises(NotSupported, match="sharded weights"):
        group.update_weights(str(tmp_path))
