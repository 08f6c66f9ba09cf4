"""Start-up messages of the model libraries that read like failures but are not.

Installed in every stage process (and every Ray stage replica) unless `--log-level debug`:
- diffusers: "There are modules in AutoencoderKLWan that should be kept in float32: []" when
  a model with *no* such module is moved with `.to(dtype)` (the list is empty: nothing to keep);
- torch: the FutureWarning that `torch.nn.utils.weight_norm` is deprecated (called inside the
  model libraries' audio modules, not by worldserve);
- transformers / huggingface_hub: the "Loading weights" progress bars (local files, a few ms).

Anything else these libraries say still reaches the log. The messages that stay and are
expected on the dev models are listed in docs/operations.md "Logs".
"""

from __future__ import annotations

import logging
import re
import warnings

# (logger name, message pattern) of benign log records to drop.
BENIGN_RECORDS = (
    ("diffusers.models.modeling_utils", re.compile(r"should be kept in float32: \[\]")),
)
BENIGN_WARNINGS = (
    (FutureWarning, r".*`torch\.nn\.utils\.weight_norm` is deprecated"),
)


class _DropMatching(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet_benign_messages() -> None:
    """Drop the benign start-up messages above in this process (call before loading models)."""
    for name, pattern in BENIGN_RECORDS:
        logging.getLogger(name).addFilter(_DropMatching(pattern))
    for category, message in BENIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    # Before transformers is imported: it reads the setting once, at import.
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()
