"""A request past the checkpoint's declared limits (its family's resolution template, the dev
checkpoint's CPU budget) is a 400 naming the field and the limits, never an hours-long job;
a request exactly at each limit passes (ipc/rules.py `_check_limits`)."""

from __future__ import annotations

import msgspec
import pytest

from worldserve.errors import InvalidRequest
from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.ipc.messages import GenerationParams
from worldserve.ipc.rules import check_generation
from worldserve.models.cosmos3.family import DEFAULTS, DEV_DEFAULTS


def caps(defaults) -> GenerationCapabilities:
    return GenerationCapabilities(defaults=defaults, size_multiple=16, temporal_stride=4,
                                  exact_num_frames=True)


def params(width: int, height: int, num_frames: int) -> GenerationParams:
    return GenerationParams(prompt="x", width=width, height=height, num_frames=num_frames,
                            num_inference_steps=2, guidance_scale=1.0, seeds=[0])


@pytest.mark.parametrize("at_limit, one_over, field", [
    ((1280, 720, 197), (1280, 720, 201), "num_frames"),  # 720p template: 197 frames
    ((320, 256, 397), (320, 256, 401), "num_frames"),  # 256p: the longest clip
    ((1280, 720, 1), (1296, 720, 1), "width"),
    ((720, 1280, 1), (720, 1296, 1), "height"),
    ((960, 960, 1), (976, 960, 1), "size"),  # 960x960 is the area of 1280x720
])
def test_the_real_cosmos3_template_is_asked_exactly(at_limit, one_over, field):
    check_generation(params(*at_limit), caps(DEFAULTS))
    with pytest.raises(InvalidRequest) as err:
        check_generation(params(*one_over), caps(DEFAULTS))
    assert err.value.param == field
    assert "width <= 1280" in err.value.message and "num_frames <= 397" in err.value.message


def test_the_dev_checkpoint_refuses_720p_x_189_frames_and_names_its_limits():
    with pytest.raises(InvalidRequest) as err:
        check_generation(params(1280, 720, 189), caps(DEV_DEFAULTS))
    assert err.value.param == "width"
    assert "width <= 256, height <= 256" in err.value.message
    check_generation(params(256, 256, 9), caps(DEV_DEFAULTS))
    check_generation(params(80, 80, 397), caps(DEV_DEFAULTS))  # the NIM's longest dev clip
    with pytest.raises(InvalidRequest) as err:
        check_generation(params(96, 80, 397), caps(DEV_DEFAULTS))
    assert err.value.param == "num_frames" and "<= 2540800" in err.value.message


def test_a_model_that_declares_no_limits_takes_any_size():
    unlimited = msgspec.structs.replace(DEFAULTS, max_width=None, max_height=None,
                                        max_pixels=None, max_num_frames=None,
                                        max_video_pixels=None)
    check_generation(params(4096, 4096, 1001), caps(unlimited))
