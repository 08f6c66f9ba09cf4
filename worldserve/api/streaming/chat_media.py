"""The media of chat requests (`image_url` and `video_url` parts, chat completions and responses).

Images pass the frame policy (JPEG/PNG, 8 MiB, 4 MP). Videos are at most `--max-upload-bytes`
and are sampled here into a clip (`media/clips.py`: `media_io_kwargs.video.fps`, default 2 a
second, at most `num_frames` / 64 frames), so the stage gets frames, never a container. Every
reference goes through the media policy: data URLs; remote http(s) URLs only when
`allowed_media_domains` is configured (fetched hop by hop, non-public addresses refused); local
paths and file:// URLs only inside `--allowed-local-media-path`.
"""

from __future__ import annotations

import asyncio
import dataclasses

from worldserve.api.runtime import ServerRuntime
from worldserve.api.schemas.chat import VideoIO
from worldserve.api.streaming.images import check_frame
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ChatPart
from worldserve.media.clips import DEFAULT_CLIP_FPS, MAX_CLIP_FRAMES, sample_clip
from worldserve.media.data_url import decode_data_url
from worldserve.media.fetch import fetch_remote, load_media
from worldserve.media.frame_limits import MAX_FRAME_BYTES
from worldserve.media.policy import MediaPolicy


class ChatMediaReader:
    """Reads and checks the media parts of one server's chat requests."""

    def __init__(self, runtime: ServerRuntime) -> None:
        policy = MediaPolicy.from_config(runtime.config)
        self.image_policy = dataclasses.replace(policy, max_bytes=MAX_FRAME_BYTES)
        self.video_policy = policy  # --max-upload-bytes

    async def image(self, url: str, field: str = "image_url") -> ChatPart:
        data = await self._read(url, self.image_policy, field)
        check_frame(data)
        return ChatPart(type="image", image=data)

    async def video(self, url: str, io: VideoIO | None, field: str = "video_url") -> ChatPart:
        data = await self._read(url, self.video_policy, field)
        fps = io.fps if io is not None and io.fps is not None else DEFAULT_CLIP_FPS
        limit = io.num_frames if io is not None and io.num_frames else MAX_CLIP_FRAMES
        clip = await asyncio.to_thread(sample_clip, data, fps, limit, field)
        return ChatPart(type="video", frames=clip.frames, fps=clip.fps)

    async def _read(self, url: str, policy: MediaPolicy, field: str) -> bytes:
        if url[:5].lower() == "data:":
            return decode_data_url(url, field=field, max_bytes=policy.max_bytes,
                                   base64_only=True)[1]
        kind = field.removesuffix("_url")
        if url.startswith(("http://", "https://")) and not policy.allowed_domains:
            raise InvalidRequest(f"remote {kind} URLs are not supported by this server; send "
                                 f"the {kind} inline as a base64 data URL or configure "
                                 "allowed_media_domains", param=field)
        if url.startswith(("http://", "https://")):
            return await fetch_remote(url, policy)
        if url[:5].lower() == "file:" or "://" not in url:
            # a local path: only inside --allowed-local-media-path (refused without it)
            return await load_media(url, policy, field)
        raise InvalidRequest(f"unsupported {kind} URL scheme in {url[:40]!r}; send a data URL "
                             "(data:<mime>;base64,...)", param=field)
