"""SGLang's own realtime client rules (tests/integration/realtime/sglang_client.py) accept both
transport paths of spec realtime-video §4.2: an inline `frame_batch` (payload < 64 KiB) and
`frame_batch_header` + one binary message (≥ 64 KiB), for raw and delta-gzip payloads."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.realtime.helpers import ENDPOINT, ExpectedFrames
from tests.integration.realtime.sglang_client import collect

CHUNKS = 2


@pytest.mark.parametrize(("size", "fmt", "paths"), [
    ("32x32", "raw", {"inline"}),          # 12 × 32 × 32 × 3 = 36,864 bytes per chunk
    ("96x80", "raw", {"split"}),           # 12 × 96 × 80 × 3 = 276,480 bytes
    ("32x32", "delta-gzip", {"inline"}),
    ("256x192", "delta-gzip", None),       # whatever size gzip reaches: either path
])
async def test_sglang_client_accepts_inline_and_split_batches(rt_server, size, fmt, paths):
    width, height = (int(v) for v in size.split("x"))
    init = {"type": "init", "prompt": "a quiet valley", "size": size, "max_chunks": CHUNKS,
            "realtime_output_format": fmt}
    got = await collect(rt_server.ws_url + ENDPOINT, init, CHUNKS)
    if paths is not None:
        assert set(got.paths) == paths
    expected = ExpectedFrames("a quiet valley", width=width, height=height)
    want = np.concatenate([expected.chunk() for _ in range(CHUNKS)])
    assert np.array_equal(np.stack(got.frames), want)
    assert [s["chunk_index"] for s in got.chunk_stats][:1] == [0]
