"""One real server for the NIM client tests: `worldserve serve --model-path <the Cosmos3 dev
directory>` (generator and reasoner from one directory, as a published Cosmos3 checkpoint), the
way the cookbook's clients reach it: `NIM_URL=<server>/nim/generator` and `.../nim/reasoner`."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from tests.support.server import ServerProcess
from worldserve.media.video import encode_mp4

MAX_UPLOAD_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="package")
def nim_server(tmp_path_factory: pytest.TempPathFactory,
               dev_models_dir: Path) -> Iterator[ServerProcess]:
    config = {"max_upload_bytes": MAX_UPLOAD_BYTES,
              "stages": {"realtime": {"enabled": False}}}
    server = ServerProcess(tmp_path_factory.mktemp("nim"), config,
                           args=["--model-path", str(dev_models_dir / "generation")])
    try:
        server.wait_healthy(timeout_s=180)
        yield server
    finally:
        server.stop()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def jpeg(width: int = 96, height: int = 64, seed: int = 0) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def mp4(num_frames: int = 24, fps: int = 12, width: int = 64, height: int = 48) -> bytes:
    """A clip whose frame i is a flat colour of its own (distinguishable after H.264)."""
    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    for i in range(num_frames):
        frames[i] = ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)
    out = io.BytesIO()
    encode_mp4(frames, fps, out, compression=90)
    return out.getvalue()
