"""A group of four ranks: Ulysses x Ring (USP: an all-to-all over heads inside each pair, the
ring across the pairs) with the decoder blocks sharded four ways and the VAE decode in four
strips. Equal to one process within the documented bounds."""

from __future__ import annotations

import pytest

from tests.support.images import random_png as png
from tests.support.rank_groups import (
    FRAME_TOLERANCE,
    RING_TOLERANCE,
    action_params,
    assert_extras_close,
    assert_frames_close,
    params,
    rank_group,
    run_to_end,
    solo_fixture,
)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


solo_runner = solo_fixture()


def test_ulysses_times_ring_with_sharded_weights(cosmos3_dir, solo_runner):
    video = params(generate_sound=True, condition_images=[png(56, 40)], seeds=[6])
    policy = action_params("policy")  # 32 px tall: two latent rows, rank 0 decodes alone
    with rank_group(cosmos3_dir, "ulysses=2,ring=2,shard=4") as group:
        info = group.describe()
        outputs = [run_to_end(group, p) for p in (video, policy)]
    assert info["rank_group"]["world_size"] == 4 and info["parallel"]["shards"] is not None
    for p, (frames, extras) in zip((video, policy), outputs):
        ref_frames, ref_extras = run_to_end(solo_runner, p)
        assert_frames_close(frames, ref_frames, FRAME_TOLERANCE)
        assert_extras_close(extras, ref_extras, RING_TOLERANCE)
