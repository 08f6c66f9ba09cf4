"""The live-reasoning frame limits and their messages (streaming-reasoning §5.1), one place.

Read by the api's frame policy (api/streaming/images.py) and meant for every other side that
checks or fits a frame (the reasoner's image decoder, the stream client's downscaler), so the
numbers and the words a client sees cannot drift apart.
"""

from __future__ import annotations

from worldserve.errors import PayloadTooLarge

MAX_FRAME_BYTES = 8 * 1024 * 1024  # 8 MiB per encoded JPEG/PNG frame
MAX_FRAME_PIXELS = 4_194_304  # 4 MP, e.g. 2048 x 2048


def frame_too_large(num_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"frame is {num_bytes} bytes; the limit is {MAX_FRAME_BYTES} bytes "
                           "(8 MiB); resize or re-encode")


def check_frame_pixels(width: int, height: int) -> None:
    """413 naming the size when `width x height` is above MAX_FRAME_PIXELS."""
    if width * height > MAX_FRAME_PIXELS:
        raise PayloadTooLarge(f"frame is {width}x{height} = {width * height} pixels; the limit "
                              f"is {MAX_FRAME_PIXELS} (4 MP); resize or re-encode")
