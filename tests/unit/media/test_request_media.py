"""The one media pass of a `/v1/videos` request: uploads, the policy, then the references."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.media.policy import MediaPolicy
from worldserve.media.uploads import MediaRules, read_request_media
from worldserve.media.video import encode_mp4


class Upload:
    """What the pass reads of a Starlette UploadFile."""

    def __init__(self, filename: str, content_type: str, data: bytes) -> None:
        self.filename, self.content_type, self.size = filename, content_type, len(data)
        self._data = io.BytesIO(data)

    async def read(self, size: int) -> bytes:
        return self._data.read(size)


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def mp4() -> bytes:
    buf = io.BytesIO()
    encode_mp4(np.zeros((2, 16, 16, 3), np.uint8), 8, buf)
    return buf.getvalue()


def rules(tmp_path: Path, video_conditioning: bool = True) -> MediaRules:
    return MediaRules(MediaPolicy(allowed_local_dir=tmp_path), 1 << 20, video_conditioning)


async def test_uploads_and_references_come_back_read(tmp_path: Path) -> None:
    (tmp_path / "start.png").write_bytes(png())
    files = {"input_reference": [Upload("clip.mp4", "video/mp4", mp4())]}
    fields = {"prompt": "p", "reference_url": str(tmp_path / "start.png"), "video_path": 7}
    media = await read_request_media(fields, files, rules(tmp_path))
    assert media.videos == [files["input_reference"][0]._data.getvalue()]
    assert media.images == [png()]  # the non-string video_path is left to the schema


async def test_the_policy_runs_before_any_reference_is_read(tmp_path: Path) -> None:
    outside = tmp_path.parent / "outside.png"
    with pytest.raises(InvalidRequest, match="output_path"):
        await read_request_media({"output_path": "/tmp/x", "reference_url": str(outside)}, {},
                                 rules(tmp_path))


async def test_one_conditioning_video_and_only_when_the_model_takes_one(tmp_path: Path) -> None:
    (tmp_path / "clip.mp4").write_bytes(mp4())
    files = {"video_reference": [Upload("a.mp4", "video/mp4", mp4())]}
    with pytest.raises(InvalidRequest, match="give one conditioning video"):
        await read_request_media({"video_path": str(tmp_path / "clip.mp4")}, files,
                                 rules(tmp_path))
    with pytest.raises(InvalidRequest, match="video conditioning is not supported"):
        await read_request_media({}, files, rules(tmp_path, video_conditioning=False))
    with pytest.raises(InvalidRequest, match="unexpected file field 'mask'"):
        await read_request_media({}, {"mask": files["video_reference"]}, rules(tmp_path))
