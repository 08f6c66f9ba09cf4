"""The benign start-up messages a stage drops (runtime/quiet.py), and only those."""

from __future__ import annotations

import logging
import warnings

import pytest

from worldserve.runtime.quiet import quiet_benign_messages

DIFFUSERS = "diffusers.models.modeling_utils"


def test_only_the_benign_messages_are_dropped(caplog: pytest.LogCaptureFixture) -> None:
    quiet_benign_messages()
    logger = logging.getLogger(DIFFUSERS)
    with caplog.at_level(logging.WARNING, logger=DIFFUSERS):
        logger.warning("There are modules in AutoencoderKLWan that should be kept in float32: "
                       "[]. Casting directly with `to()` can lead to inconsistent results")
        logger.warning("There are modules in X that should be kept in float32: ['norm']. ...")
    assert [r.getMessage()[-13:] for r in caplog.records] == ["['norm']. ..."]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_benign_messages()  # catch_warnings reset the filters: install them again
        warnings.warn("`torch.nn.utils.weight_norm` is deprecated in favor of ...", FutureWarning)
        warnings.warn("something else is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    from huggingface_hub.utils import are_progress_bars_disabled

    assert are_progress_bars_disabled()
