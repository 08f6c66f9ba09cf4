"""Write the sample inputs the README and the surface docs use: `frame.jpg` (one camera frame)
and `clip.mp4` (a short clip for `worldserve stream`), a few KB each, next to this script.

    python examples/make_samples.py

They are committed, so a fresh clone runs every example as written; this script says how they
were made (PIL and PyAV only, no model) and remakes them. A red square crosses a grey-blue
floor, so a frame is an image a JPEG decoder, an image processor and the streaming client accept.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

HERE = Path(__file__).resolve().parent
FRAME_SIZE = (160, 96)   # width, height of frame.jpg
CLIP_SIZE = (96, 64)     # width, height of clip.mp4 (even: H.264 yuv420p)
CLIP_FRAMES = 24
CLIP_FPS = 8


def scene(width: int, height: int, t: float) -> Image.Image:
    """The floor, the horizon and the square at time t in [0, 1]."""
    image = Image.new("RGB", (width, height), (150, 180, 210))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, height // 2, width, height), fill=(90, 100, 110))
    side = height // 4
    left = int(t * (width - side))
    draw.rectangle((left, height // 2, left + side, height // 2 + side), fill=(200, 40, 40))
    return image


def frame_jpeg() -> bytes:
    out = io.BytesIO()
    scene(*FRAME_SIZE, 0.3).save(out, format="JPEG", quality=85)
    return out.getvalue()


def clip_mp4() -> bytes:
    out = io.BytesIO()
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=CLIP_FPS)
        stream.width, stream.height = CLIP_SIZE
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "30"}
        for index in range(CLIP_FRAMES):
            pixels = np.asarray(scene(*CLIP_SIZE, index / (CLIP_FRAMES - 1)))
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def main() -> None:
    for name, data in (("frame.jpg", frame_jpeg()), ("clip.mp4", clip_mp4())):
        (HERE / name).write_bytes(data)
        print(f"{HERE / name}: {len(data):,} bytes")


if __name__ == "__main__":
    main()
