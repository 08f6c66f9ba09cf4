"""Request conditioning -> the pipeline's own input types (PIL images, frame lists,
`CosmosActionCondition`). Invalid values raise InvalidRequest naming the field."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ActionCondition, GenerationParams
from worldserve.media.images import decode_failure


def decode_image(data: bytes, field: str = "input_reference") -> Image.Image:
    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except Exception as exc:  # PIL raises assorted errors for bad bytes
        raise InvalidRequest(f"{field} is not a readable image ({decode_failure(exc)})",
                             param=field) from None


def decode_video(data: bytes, field: str = "video") -> list[Image.Image]:
    """Every frame of an encoded video as RGB PIL images (PyAV)."""
    from worldserve.media.video import decode_frames

    try:
        frames = decode_frames(data)
    except Exception as exc:  # PyAV raises assorted errors for bad bytes
        raise InvalidRequest(f"{field} is not a readable video ({decode_failure(exc)})",
                             param=field) from None
    if not frames:
        raise InvalidRequest(f"{field} has no video frames", param=field)
    return [Image.fromarray(frame) for frame in frames]


def conditioning(params: GenerationParams) -> tuple[Image.Image | None, list[Image.Image] | None]:
    """(image, video) for a non-action request: image-to-video or video-to-video."""
    image = decode_image(params.condition_images[0]) if params.condition_images else None
    video = (decode_video(params.condition_video, "video_reference")
             if params.condition_video is not None else None)
    return image, video


def action_condition(action: ActionCondition | None, params: GenerationParams) -> Any:
    """The pipeline's `CosmosActionCondition` (its own checks become 400s)."""
    if action is None:
        return None
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    image = decode_image(params.condition_images[0], "image") if params.condition_images else None
    video = (decode_video(params.condition_video, "video")
             if params.condition_video is not None else None)
    raw = None
    if action.raw_actions is not None:
        raw = torch.from_numpy(np.asarray(action.raw_actions, dtype=np.float32))
    try:
        return CosmosActionCondition(
            mode=action.mode, chunk_size=action.chunk_size, domain_name=action.domain_name,
            resolution_tier=action.resolution_tier, raw_actions=raw, image=image, video=video,
            view_point=action.view_point)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="action") from None
