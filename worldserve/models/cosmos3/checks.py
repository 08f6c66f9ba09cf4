"""The Cosmos3 request rules at the stage: the declaration the shared rules
(`worldserve/ipc/rules.py`) read, the same one the api checks requests against first.

The declaration is built from the runner's features (domains, widths and resolution tiers are the
pipeline's own tables); what needs the weights stays in the pipeline's `check_inputs`."""

from __future__ import annotations

from typing import Any

from worldserve.ipc.capabilities import GenerationCapabilities
from worldserve.models.types import feature_capabilities


def declaration(runner: Any) -> GenerationCapabilities:
    """What the stage declares about this runner, as the api reads it."""
    return GenerationCapabilities(size_multiple=runner.size_multiple,
                                  temporal_stride=runner.temporal_stride,
                                  **feature_capabilities(runner.features))
