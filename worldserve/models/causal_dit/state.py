"""Per-session causal state of the causal DiT (spec realtime-video.md section 6.1)."""

from __future__ import annotations

import torch

from worldserve.models.causal_dit.kv_cache import SelfAttnCache
from worldserve.models.causal_dit.model import KV
from worldserve.models.causal_dit.vae_stream import StreamingWanDecoder
from worldserve.models.types import WorldSessionSettings, WorldSessionState


class CausalSession:
    """Everything one session owns: KV cache + retained latents, cross-attention cache, VAE
    decode state, RNG and the chunk frontier. `release()` frees it all at once."""

    def __init__(self, session_id: str, settings: WorldSessionSettings, prompt: str,
                 text_kv: list[KV], decoder: StreamingWanDecoder, tokens_per_frame: int) -> None:
        self.session_id = session_id
        self.settings = settings
        self.prompt = prompt
        self.text_kv: list[KV] | None = text_kv
        # Classifier-free guidance (guidance_scale != 1): the negative prompt's cross-attention
        # K/V; the self-attention cache is shared by both branches (written by the cond pass).
        self.uncond_kv: list[KV] | None = None
        # Image-conditioned start: the first_frame's latent, pinned clean as the session's
        # first latent frame (dropped after chunk 0: from then on it lives in the cache).
        self.image_latent: torch.Tensor | None = None
        # LingBot-style image condition (36-channel DiT input): the condition of the first
        # chunk's latent frames and of every later chunk's (2 blocks of mask + latent).
        self.condition: tuple[torch.Tensor, torch.Tensor] | None = None
        # LingBot camera branch: intrinsics at session size and the rollout's pitch (steps).
        self.intrinsics: tuple[float, ...] | None = None
        self.pitch_steps = 0
        self.decoder = decoder
        self.cache = SelfAttnCache(tokens_per_frame, settings.sink_frames, settings.window_frames)
        # Noise is drawn on the CPU so a seed gives the same frames on every device.
        self.generator = torch.Generator(device="cpu").manual_seed(settings.seed)
        self.next_chunk = 0  # chunk index the session accepts next
        self.next_frame = 0  # session number of the next latent frame
        self.next_position = 0  # RoPE position of the next latent frame (differs after re-base)
        self.state = WorldSessionState.ACTIVE

    def release(self) -> None:
        if self.state is WorldSessionState.RELEASED:
            return
        self.cache.clear()
        self.decoder.release()
        self.text_kv = self.uncond_kv = self.image_latent = self.condition = None
        self.state = WorldSessionState.RELEASED


