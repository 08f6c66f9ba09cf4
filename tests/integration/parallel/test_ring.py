"""Ring-2 (the sequence split in two; each rank's queries meet the other chunk's keys after one
exchange, merged by log-sum-exp): equal to one process within the documented float bound, on
a video with sound and a policy action run with guidance; several seeds of one request each
equal that seed's solo request."""

from __future__ import annotations

import pytest

from tests.support.rank_groups import (
    FRAME_TOLERANCE,
    RING_TOLERANCE,
    action_params,
    assert_extras_close,
    assert_frames_close,
    group_fixtures,
    params,
    run_to_end,
)
from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


group, solo_runner = group_fixtures("ring=2")


@pytest.mark.parametrize("p", [params(generate_sound=True, num_inference_steps=3),
                               action_params("policy")], ids=["t2v-sound", "policy"])
def test_ring_attention_equals_one_process_within_the_bound(group, solo_runner, p):
    frames, extras = run_to_end(group, p)
    ref_frames, ref_extras = run_to_end(solo_runner, p)
    assert_frames_close(frames, ref_frames, FRAME_TOLERANCE)
    assert_extras_close(extras, ref_extras, RING_TOLERANCE)


def test_several_seeds_of_one_request_equal_each_seeds_solo_request(group):
    assert_each_seed_equals_its_solo_run(group, params(generate_sound=True, seeds=SEEDS))
