"""Per-session causal state (spec realtime-video.md section 6.1) and the bounded session table."""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

import torch

from worldserve.engines.realtime.kv_cache import SelfAttnCache
from worldserve.engines.realtime.model import KV
from worldserve.engines.realtime.vae_stream import StreamingWanDecoder


class SessionState(enum.Enum):
    ACTIVE = "active"
    RELEASED = "released"


@dataclass(frozen=True)
class SessionSettings:
    """Fixed at chunk 0. Frame counts are latent frames."""

    seed: int
    width: int
    height: int
    num_inference_steps: int
    sink_frames: int
    window_frames: int
    frames_per_block: int


class RealtimeSession:
    """Everything one session owns: KV cache + retained latents, cross-attention cache, VAE
    decode state, RNG and the chunk frontier. `release()` frees it all at once."""

    def __init__(self, session_id: str, settings: SessionSettings, prompt: str,
                 text_kv: list[KV], decoder: StreamingWanDecoder, tokens_per_frame: int) -> None:
        self.session_id = session_id
        self.settings = settings
        self.prompt = prompt
        self.text_kv: list[KV] | None = text_kv
        self.decoder = decoder
        self.cache = SelfAttnCache(tokens_per_frame, settings.sink_frames, settings.window_frames)
        # Noise is drawn on the CPU so a seed gives the same frames on every device.
        self.generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self.next_chunk = 0  # chunk index the session accepts next
        self.next_frame = 0  # session number of the next latent frame
        self.next_position = 0  # RoPE position of the next latent frame (differs after re-base)
        self.state = SessionState.ACTIVE

    def release(self) -> None:
        if self.state is SessionState.RELEASED:
            return
        self.cache.clear()
        self.decoder.release()
        self.text_kv = None
        self.state = SessionState.RELEASED


class SessionTable:
    """Sessions by id, least recently used first; bounded as a safety net against lost releases."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._sessions: OrderedDict[str, RealtimeSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> RealtimeSession | None:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
        return session

    def put(self, session: RealtimeSession) -> list[RealtimeSession]:
        """Insert (replacing and releasing an older state of the same id); returns the
        least-recently-used sessions evicted to stay within capacity (already released)."""
        self.pop(session.session_id)
        self._sessions[session.session_id] = session
        evicted = []
        while len(self._sessions) > self.capacity:
            _, old = self._sessions.popitem(last=False)
            old.release()
            evicted.append(old)
        return evicted

    def pop(self, session_id: str) -> RealtimeSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.release()
        return session

    def values(self) -> list[RealtimeSession]:
        return list(self._sessions.values())
