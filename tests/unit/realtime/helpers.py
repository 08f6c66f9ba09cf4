"""Helpers shared by the realtime engine unit tests."""

from __future__ import annotations

from typing import Any

import torch

from worldserve.engines.realtime.engine import RealtimeEngine
from worldserve.ipc.messages import Message, RealtimeChunk


class Replies:
    """Collects what an engine sends back, like the stage loop's reply function."""

    def __init__(self) -> None:
        self.items: list[Message] = []

    def __call__(self, message: Message) -> None:
        self.items.append(message)

    def last(self) -> Message:
        return self.items[-1]


def chunk(session_id: str, index: int, **fields) -> RealtimeChunk:
    fields.setdefault("prompt", "a red car" if index == 0 else None)
    return RealtimeChunk(request_id=f"{session_id}-{index}-{fields.pop('tag', '')}",
                         session_id=session_id, chunk_index=index, **fields)


def run_session(engine: RealtimeEngine, session_id: str, num_chunks: int, **first) -> list:
    """Submit and run chunks one by one; returns the replies."""
    out = Replies()
    for k in range(num_chunks):
        engine.submit(chunk(session_id, k, **(first if k == 0 else {})), out)
        while engine.has_work():
            engine.step()
    return out.items


def upstream_wan_state(seed: int = 0, dim: int = 16, layers: int = 2, ffn: int = 32,
                       text: int = 8, freq: int = 16, channels: int = 4) -> dict[str, Any]:
    """A causal Wan DiT's weights under the original WanModel parameter names and shapes
    (patch 1x2x2), written out by hand (the upstream layout tests load)."""
    DIM, LAYERS, FFN, TEXT, FREQ = dim, layers, ffn, text, freq
    CHANNELS, PATCH = channels, (1, 2, 2)
    g = torch.Generator().manual_seed(seed)

    def t(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(*shape, generator=g)

    state = {"patch_embedding.weight": t(DIM, CHANNELS, *PATCH), "patch_embedding.bias": t(DIM),
             "text_embedding.0.weight": t(DIM, TEXT), "text_embedding.0.bias": t(DIM),
             "text_embedding.2.weight": t(DIM, DIM), "text_embedding.2.bias": t(DIM),
             "time_embedding.0.weight": t(DIM, FREQ), "time_embedding.0.bias": t(DIM),
             "time_embedding.2.weight": t(DIM, DIM), "time_embedding.2.bias": t(DIM),
             "time_projection.1.weight": t(6 * DIM, DIM), "time_projection.1.bias": t(6 * DIM),
             "head.modulation": t(1, 2, DIM), "head.head.weight": t(CHANNELS * 4, DIM),
             "head.head.bias": t(CHANNELS * 4)}
    for i in range(LAYERS):
        b = f"blocks.{i}."
        state[b + "modulation"] = t(1, 6, DIM)
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                state[f"{b}{attn}.{proj}.weight"] = t(DIM, DIM)
                state[f"{b}{attn}.{proj}.bias"] = t(DIM)
            state[f"{b}{attn}.norm_q.weight"] = t(DIM)
            state[f"{b}{attn}.norm_k.weight"] = t(DIM)
        state[b + "norm3.weight"], state[b + "norm3.bias"] = t(DIM), t(DIM)
        state[b + "ffn.0.weight"], state[b + "ffn.0.bias"] = t(FFN, DIM), t(FFN)
        state[b + "ffn.2.weight"], state[b + "ffn.2.bias"] = t(DIM, FFN), t(DIM)
    return state


def lingbot_world_state(seed: int = 0, dim: int = 24, layers: int = 2, latent: int = 16,
                        mask: int = 4, text: int = 32, ray_stride: int = 8) -> dict[str, Any]:
    """A LingBot-World-style causal DiT in the upstream key layout: the Wan keys with an
    image-conditioned patch embedding (latent + mask + latent input channels, latent out) and
    the camera keys of `wan/modules/model.py` (:219-222, :396-399)."""
    state = upstream_wan_state(seed, dim=dim, layers=layers, channels=latent, text=text)
    g = torch.Generator().manual_seed(seed + 1000)

    def t(*shape: int) -> torch.Tensor:
        return 0.2 * torch.randn(*shape, generator=g)

    state["patch_embedding.weight"] = t(dim, 2 * latent + mask, 1, 2, 2)
    cams = {"patch_embedding_wancamctrl": 6 * ray_stride * ray_stride * 4,
            "c2ws_hidden_states_layer1": dim, "c2ws_hidden_states_layer2": dim}
    for i in range(layers):
        for name in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer",
                     "cam_shift_layer"):
            cams[f"blocks.{i}.{name}"] = dim
    for name, fan_in in cams.items():
        state[f"{name}.weight"], state[f"{name}.bias"] = t(dim, fan_in), t(dim)
    return state
