"""H.264 MP4 encoding and decoding with PyAV (cpu-stack notes §10)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025,
             8000, 7350)


def compression_to_crf(compression: int) -> int:
    """Compression level 0..100 (higher = better quality) -> x264 CRF 45..10."""
    compression = max(0, min(100, compression))
    return round(45 - 35 * compression / 100)


def encode_mp4(
    frames: np.ndarray, fps: int, target: Path | io.BytesIO, compression: int = 50, *,
    audio: np.ndarray | None = None, sample_rate: int | None = None,
) -> None:
    """uint8 frames (T, H, W, 3) -> H.264 (yuv420p) MP4 written to `target`; with `audio`
    (channels, samples) float in [-1, 1] at `sample_rate` Hz, also an AAC track."""
    if isinstance(target, io.BytesIO):
        _encode_mp4(frames, fps, target, compression, audio, sample_rate)
        return
    # A file PyAV opens from a path stays open when a write fails (ENOSPC: one fd, and the
    # deleted partial file's disk space, per failed video until the stage exits; issue 34's
    # fault soak): the file is opened, and always closed, here.
    with open(target, "wb") as out:
        _encode_mp4(frames, fps, out, compression, audio, sample_rate)


def _encode_mp4(frames: np.ndarray, fps: int, out: BinaryIO, compression: int,
                audio: np.ndarray | None, sample_rate: int | None) -> None:
    height, width = frames.shape[1:3]
    with av.open(out, mode="w", format="mp4") as container:
        audio_stream = None
        if audio is not None:
            if not sample_rate:
                raise ValueError("an audio track needs its sample_rate")
            audio_stream = container.add_stream("aac", rate=aac_rate(int(sample_rate)))
            audio_stream.layout = "stereo" if audio.shape[0] == 2 else "mono"
        stream = container.add_stream("libx264", rate=max(1, fps))
        stream.width, stream.height = width - width % 2, height - height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": str(compression_to_crf(compression))}
        for frame in frames:
            image = av.VideoFrame.from_ndarray(
                np.ascontiguousarray(frame[: stream.height, : stream.width]), format="rgb24"
            )
            for packet in stream.encode(image):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if audio_stream is not None:
            _encode_audio(container, audio_stream, audio, int(sample_rate or 0))


def aac_rate(sample_rate: int) -> int:
    """The track's rate: `sample_rate` itself when AAC supports it (48 kHz Cosmos3 sound),
    else the nearest supported rate above it (tiny dev checkpoints use 400 Hz)."""
    if sample_rate in AAC_RATES:
        return sample_rate
    higher = [rate for rate in AAC_RATES if rate > sample_rate]
    return min(higher) if higher else max(AAC_RATES)


def _encode_audio(container: av.container.OutputContainer, stream: av.audio.stream.AudioStream,
                  audio: np.ndarray, sample_rate: int) -> None:
    """Planar float samples -> AAC packets (resampled when the rate is not an AAC rate)."""
    samples = np.ascontiguousarray(np.clip(audio, -1.0, 1.0), dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout=stream.layout.name)
    frame.sample_rate = sample_rate
    frame.pts = 0
    resampler = av.AudioResampler(format="fltp", layout=stream.layout.name, rate=stream.rate)
    for chunk in [*resampler.resample(frame), *resampler.resample(None)]:
        for packet in stream.encode(chunk):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def decode_audio(data: bytes) -> tuple[np.ndarray, int] | None:
    """The first audio track as float (channels, samples) and its sample rate, or None."""
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        chunks = [f.to_ndarray() for f in container.decode(audio=0)]
        rate = stream.rate
    if not chunks:
        return np.zeros((stream.channels, 0), np.float32), rate
    return np.concatenate(chunks, axis=1), rate


def decode_frames(data: bytes) -> list[np.ndarray]:
    """Every frame of a video file as uint8 RGB arrays."""
    with av.open(io.BytesIO(data)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def check_video(data: bytes, field: str) -> None:
    """400 naming `field` unless `data` is a container with a decodable video frame."""
    from worldserve.errors import InvalidRequest
    from worldserve.media.images import decode_failure

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise InvalidRequest(f"{field} has no video stream", param=field)
            next(container.decode(video=0))
    except InvalidRequest:
        raise
    except Exception as exc:  # PyAV raises assorted errors for bad bytes
        raise InvalidRequest(f"{field} is not a readable video ({decode_failure(exc)})",
                             param=field) from None
