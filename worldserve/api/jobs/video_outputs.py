"""What a finished video job is served as besides its MP4: the OpenAI content variants
`thumbnail` and `spritesheet` (JPEG images of its frames) and the tensor body of
`POST /v1/videos/sync?format=safetensors`.

Everything here is derived from the job's MP4 (the one output the stage writes), so the frames
are the decoded H.264 frames a client of the MP4 would see, not the pre-encode pixels. Decoding
is CPU work: callers run these off the event loop (`asyncio.to_thread`).

The tensor body follows TensorRT-LLM's visual-gen payload (tensorrt_llm/media/tensor_payload.py):
`video` uint8 (frames, height, width, 3), `audio` float32 (channels, samples) when the job has
a sound track, `action` float32 (rows, action_dim) for action jobs, and the scalars
`frame_rate` (float32) and `audio_sample_rate` (int64) both as 0-d tensors and as strings in
the header's metadata.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import av
import numpy as np
from PIL import Image
from safetensors.numpy import save

from worldserve.media.video import decode_audio

JPEG_QUALITY = 90
SPRITESHEET_COLUMNS = 5
MAX_SPRITESHEET_FRAMES = 25  # a 5 x 5 grid of frames taken evenly across the clip
SAFETENSORS_TYPE = "application/octet-stream"  # the safetensors format has no registered type


def _frames_and_rate(data: bytes) -> tuple[np.ndarray, float]:
    """(frames (T, H, W, 3) uint8, frames per second) of a video file."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.base_rate or 0)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack(frames), rate


def _jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def thumbnail(path: Path) -> bytes:
    """The first frame as a JPEG."""
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            return _jpeg(frame.to_ndarray(format="rgb24"))
    raise ValueError(f"{path.name} has no video frame")


def spritesheet(path: Path) -> bytes:
    """Up to 25 frames taken evenly across the clip, in rows of 5, as one JPEG."""
    frames, _ = _frames_and_rate(path.read_bytes())
    count = min(len(frames), MAX_SPRITESHEET_FRAMES)
    picks = frames[np.linspace(0, len(frames) - 1, count).round().astype(int)]
    columns = min(count, SPRITESHEET_COLUMNS)
    rows = math.ceil(count / columns)
    height, width = picks.shape[1:3]
    sheet = np.zeros((rows * height, columns * width, 3), np.uint8)
    for i, frame in enumerate(picks):
        row, column = divmod(i, columns)
        sheet[row * height:(row + 1) * height, column * width:(column + 1) * width] = frame
    return _jpeg(sheet)


def tensor_body(path: Path, action: dict[str, Any] | None) -> bytes:
    """The job's output as one safetensors body (names and dtypes above)."""
    data = path.read_bytes()
    frames, rate = _frames_and_rate(data)
    tensors: dict[str, np.ndarray] = {"video": np.ascontiguousarray(frames),
                                      "frame_rate": np.asarray(rate, np.float32)}
    metadata = {"frame_rate": str(rate)}
    audio = decode_audio(data)
    if audio is not None:
        samples, sample_rate = audio
        tensors["audio"] = np.ascontiguousarray(samples, np.float32)
        tensors["audio_sample_rate"] = np.asarray(sample_rate, np.int64)
        metadata["audio_sample_rate"] = str(sample_rate)
    if action is not None and action.get("data"):
        tensors["action"] = np.asarray(action["data"], np.float32)
    return save(tensors, metadata=metadata)
