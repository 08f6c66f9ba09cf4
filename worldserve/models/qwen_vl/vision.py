"""The Qwen-VL family's prompt conventions for images and videos (the reasoner's runner contract,
`engines/reasoner/contract.py` `VisionPrompting`).

The engine renders chat templates and splices turns; everything the template's vision
placeholders mean is here: decoding and preprocessing a frame with the checkpoint's image
processor, the patch grid of a video clip, how many `<|image_pad|>` / `<|video_pad|>` tokens an
item takes, the timestamps Qwen3-VL-style processors write before each frame group, and the token
types the model reads back (`mm_token_type_ids`). The payload of a `VisionInput` this module makes
is a `VisionPayload`; nothing outside the family reads it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from importlib.metadata import version as installed_version
from typing import Any, Literal

import torch
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.media.frame_limits import check_frame_pixels
from worldserve.models.types import VisionInput

IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
# Token types the Qwen-VL models read from `mm_token_type_ids` to build 3-D (M-RoPE) positions.
TEXT_TOKEN_TYPE, IMAGE_TOKEN_TYPE, VIDEO_TOKEN_TYPE = 0, 1, 2
MAX_VIDEO_FRAMES = 512

# How a checkpoint's processor writes a video into the prompt:
#   plain        `<|video_pad|>` x tokens (Qwen2-VL, Qwen2.5-VL)
#   timestamped  `<|video_pad|>` becomes `<t seconds><|vision_start|>pads<|vision_end|>` per frame
#                group (Qwen3-VL)
#   framewise    the template's whole `<|vision_start|><|video_pad|><|vision_end|>` becomes those
#                spans, one per frame (Cosmos3 Edge)
VideoStyle = Literal["plain", "timestamped", "framewise"]
# The processors moved: from transformers 5.25.0 `Qwen3VLProcessor` (so Qwen3-VL and Cosmos3 Omni,
# the "timestamped" style) collapses the template's outer `<|vision_start|><|video_pad|>
# <|vision_end|>` into the per-group spans as Cosmos3 Edge always did
# (`get_text_with_replacements`, processing_qwen3_vl.py); up to 5.24.x the spans sat inside that
# wrapper. The prompt follows the installed processor, so the model sees what its own processor
# would give it.
TIMESTAMPED_WRAPPER_COLLAPSED_SINCE = (5, 25)


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version string: "5.25.0.dev0" -> (5, 25, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def collapses_video_wrapper(video_style: VideoStyle, transformers_version: str) -> bool:
    """Whether a processor of `video_style` under `transformers_version` replaces the template's
    whole video wrapper (not only `<|video_pad|>`) with the clip's spans."""
    if video_style == "framewise":
        return True
    return (video_style == "timestamped"
            and _release(transformers_version)[:2] >= TIMESTAMPED_WRAPPER_COLLAPSED_SINCE)


@dataclass
class VisionPayload:
    """The processor output of one image or clip: patches (N, C*tp*p*p), grid (1, 3) =
    (temporal groups, patch rows, patch columns), and for a clip the seconds each temporal
    group spans (its timestamps and their step)."""

    pixel_values: torch.Tensor
    grid_thw: torch.Tensor
    timestamps: list[float] | None = None
    seconds_per_group: float | None = None


def decode_image(data: bytes) -> Image.Image:
    """JPEG/PNG bytes -> RGB image; anything else, or a corrupt file, is a 400 (413 when the
    frame has more pixels than live reasoning allows)."""
    try:
        image = Image.open(io.BytesIO(data))
        if image.format not in ("JPEG", "PNG"):
            raise InvalidRequest(f"unsupported image format {image.format!r}; send JPEG or PNG")
        check_frame_pixels(image.width, image.height)
        return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"invalid image: {exc}") from None


class QwenVLPrompting:
    """Images and clips in, placeholders and processor outputs out, for one checkpoint."""

    def __init__(self, tokenizer: Any, image_processor: Any, video_style: VideoStyle,
                 transformers_version: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.video_style = video_style
        self.merge = int(getattr(image_processor, "merge_size", 2)) ** 2
        self.temporal_patch = int(getattr(image_processor, "temporal_patch_size", 1) or 1)
        ids = tokenizer.convert_tokens_to_ids
        self.image_token_id, self.video_token_id = ids(IMAGE_PAD), ids(VIDEO_PAD)
        unk = getattr(tokenizer, "unk_token_id", None)
        self.placeholder_ids = tuple(t for t in (self.image_token_id, self.video_token_id)
                                     if isinstance(t, int) and t != unk)
        # the whole wrapper the template puts around a video becomes the spans where the
        # installed processor does so (`collapses_video_wrapper`)
        self.collapses_wrapper = collapses_video_wrapper(
            video_style, transformers_version or installed_version("transformers"))
        units = [VISION_START + VIDEO_PAD + VISION_END] if self.collapses_wrapper else []
        self._units = {**{u: "video" for u in units}, IMAGE_PAD: "image", VIDEO_PAD: "video"}
        self._split = re.compile("(" + "|".join(re.escape(u) for u in self._units) + ")")

    # ------------------------------------------------------------------ images and clips

    def read_image(self, data: bytes) -> VisionInput:
        """An encoded JPEG/PNG frame -> the image the prompt's next image placeholder stands for."""
        out = self.image_processor(images=[decode_image(data)], return_tensors="pt")
        grid = out["image_grid_thw"]
        return VisionInput("image", VisionPayload(out["pixel_values"], grid),
                           int(grid.prod()) // self.merge)

    def read_video(self, frames: list[bytes], fps: float) -> VisionInput:
        """Encoded frames of one clip, `fps` frames a second apart -> the clip: every frame through
        the image processor (so a frame's pixels equal its image's), grouped `temporal_patch_size`
        frames per temporal patch as the family's video processors do (the last frame repeated to
        fill the last group)."""
        if not frames or len(frames) > MAX_VIDEO_FRAMES:
            raise InvalidRequest(f"a video needs 1 to {MAX_VIDEO_FRAMES} frames, got {len(frames)}")
        if not fps > 0:
            raise InvalidRequest(f"a video's fps must be positive, got {fps}")
        images = [decode_image(data) for data in frames]
        if len({image.size for image in images}) > 1:
            raise InvalidRequest("every frame of a video must have the same size, got "
                                 f"{sorted({image.size for image in images})}")
        tp = self.temporal_patch
        images += [images[-1]] * (-len(images) % tp)
        out = self.image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"][0]
        per_frame = out["pixel_values"].view(len(images), int(grid[1] * grid[2]), -1, tp,
                                             *self._patch_shape())
        # frame f of group g sits at temporal slot f % tp of the group's patches
        first_slot = per_frame[:, :, :, 0]  # (T, N, C, p, p): each frame once
        groups = first_slot.view(len(images) // tp, tp, *first_slot.shape[1:])
        pixels = groups.permute(0, 2, 3, 1, 4, 5).reshape(-1, per_frame[0, 0].numel())
        grid_thw = torch.tensor([[len(images) // tp, int(grid[1]), int(grid[2])]])
        stamps = self._timestamps(len(frames), fps)
        payload = VisionPayload(pixels, grid_thw, stamps, tp / fps)
        return VisionInput("video", payload, int(grid_thw.prod()) // self.merge)

    def _patch_shape(self) -> tuple[int, int]:
        p = int(self.image_processor.patch_size)
        return p, p

    def _timestamps(self, num_frames: int, fps: float) -> list[float]:
        """Seconds of each temporal group: the mean of its first and last frame's time (the
        last frame repeated to fill the last group), as Qwen3-VL's processor computes them."""
        tp = self.temporal_patch
        indices = list(range(num_frames)) + [num_frames - 1] * (-num_frames % tp)
        seconds = [i / fps for i in indices]
        return [(seconds[i] + seconds[i + tp - 1]) / 2 for i in range(0, len(seconds), tp)]

    # ------------------------------------------------------------------ prompt tokens

    def tokenize(self, text: str, media: list[VisionInput]) -> list[int]:
        """Tokenise `text`, expanding its i-th vision placeholder (as the chat template renders
        an image or video part) for `media[i]`."""
        pieces = self._split.split(text)
        kinds = [self._units[p] for p in pieces[1::2]]
        if kinds != [item.kind for item in media]:
            raise InvalidRequest(f"the prompt has vision placeholders {kinds} for inputs "
                                 f"{[item.kind for item in media]}")
        out = pieces[0]
        for item, piece in zip(media, pieces[2::2]):
            out += self._expansion(item) + piece
        return list(self.tokenizer(out, add_special_tokens=False)["input_ids"])

    def _expansion(self, item: VisionInput) -> str:
        if item.kind == "image":
            return IMAGE_PAD * item.num_tokens
        if self.video_style == "plain":
            return VIDEO_PAD * item.num_tokens
        payload: VisionPayload = item.payload
        per_group = item.num_tokens // int(payload.grid_thw[0, 0])
        return "".join(f"<{t:.1f} seconds>{VISION_START}{VIDEO_PAD * per_group}{VISION_END}"
                       for t in payload.timestamps or [])

    def token_types(self, ids: torch.Tensor) -> torch.Tensor:
        """0 for text, 1 for image tokens, 2 for video tokens; same shape as `ids`."""
        return ((ids == self.image_token_id).long() * IMAGE_TOKEN_TYPE
                + (ids == self.video_token_id).long() * VIDEO_TOKEN_TYPE)
