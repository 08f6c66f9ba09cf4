"""The api process's log: uvicorn's lines that `--no-access-log` misses or that read like
failures but are not (uvicorn 0.54).

- uvicorn logs every WebSocket handshake (`"WebSocket /path" [accepted]`, `connection open`,
  `connection closed`, `"WebSocket /path" 503`) on its error logger, not its access log: they
  are access-log lines, so `--no-access-log` drops them too;
- after a WebSocket denial response (the 503 with which a down realtime stage refuses the
  upgrade: the response is sent whole) it still logs `ERROR: ASGI callable returned without
  completing handshake.`; that one line after a denial is dropped, any other is kept.
"""

from __future__ import annotations

import logging
import re

UVICORN_LOGGER = "uvicorn.error"
_HANDSHAKE = re.compile(r'"WebSocket [^"]*" (\[accepted\]|\d{3})$|^connection (open|closed)$')
_DENIAL = re.compile(r'"WebSocket [^"]*" \d{3}$')
_AFTER_DENIAL = "ASGI callable returned without completing handshake."


class UvicornNoise(logging.Filter):
    def __init__(self, access_log: bool) -> None:
        super().__init__()
        self.access_log = access_log
        self.denials = 0  # denial responses whose spurious ERROR has not come yet

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if _DENIAL.search(message):
            self.denials += 1
        if message == _AFTER_DENIAL and self.denials:
            self.denials -= 1
            return False
        return self.access_log or not _HANDSHAKE.search(message)


def quiet_uvicorn(access_log: bool) -> UvicornNoise:
    """Install the filter on uvicorn's error logger (after uvicorn configured its logging)."""
    noise = UvicornNoise(access_log)
    logging.getLogger(UVICORN_LOGGER).addFilter(noise)
    return noise
