"""Streaming causal VAE decode (per-session feature cache) == one-shot decode."""

from __future__ import annotations

import torch

from worldserve.models.causal_dit.vae_stream import StreamingWanDecoder, decoded_frames, to_rgb24


@torch.inference_mode()
def test_streaming_decode_equals_one_shot(rt_model):
    vae = rt_model.vae
    latents = torch.randn(1, 16, 9, 8, 8, generator=torch.Generator().manual_seed(3))
    whole = torch.clamp(vae.decode(latents).sample, -1, 1)  # (1, 3, 33, 64, 64)
    other = StreamingWanDecoder(vae)  # a second session interleaved must not disturb the first
    stream = StreamingWanDecoder(vae)
    parts = []
    for i, start in enumerate(range(0, 9, 3)):
        other(torch.randn(1, 16, 3, 8, 8))
        parts.append(stream(latents[:, :, start:start + 3]))
        assert parts[-1].shape[2] == decoded_frames(vae, i == 0, 3)
    streamed = torch.cat(parts, dim=2)
    assert streamed.shape == whole.shape == (1, 3, 33, 64, 64)
    assert (streamed - whole).abs().max().item() <= 1e-6
    assert [p.shape[2] for p in parts] == [9, 12, 12]


def test_rgb24_layout():
    pixels = torch.zeros(1, 3, 2, 4, 5)
    pixels[0, 0] = 1.0  # red channel full, others mid-grey
    data, n = to_rgb24(pixels)
    assert n == 2 and len(data) == 2 * 4 * 5 * 3
    assert data[:3] == bytes([255, 128, 128])
