"""The block-causal KV-cached forward over diffusers' WanTransformer3DModel weights (the way a
mapped Self-Forcing checkpoint runs) against diffusers' own forward and a masked forward."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel

from worldserve.models.causal_dit.model import block_causal_mask
from worldserve.models.causal_dit.wan_causal import CausalWanDiT

TEXT_DIM = 8


@pytest.fixture(scope="module")
def wan():
    torch.manual_seed(0)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
        out_channels=4, text_dim=TEXT_DIM, freq_dim=16, ffn_dim=32, num_layers=2,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64).eval()


@torch.no_grad()
def test_first_block_equals_the_diffusers_forward(wan):
    dit = CausalWanDiT(wan)
    x = torch.randn(1, 4, 3, 8, 8)
    text = torch.randn(1, 5, TEXT_DIM)
    want = wan(x, torch.tensor([700.0]), text, return_dict=False)[0]
    got, kv = dit(x, torch.full((1, 3), 700.0), None, torch.arange(3), dit.text_kv(text))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert len(kv) == 2 and kv[0][0].shape == (1, 2, 3 * 16, 12)


@torch.no_grad()
def test_cached_blocks_equal_one_block_causal_forward(wan):
    dit = CausalWanDiT(wan)
    x = torch.randn(1, 4, 6, 8, 8)
    t = torch.tensor([[900.0] * 3 + [300.0] * 3])
    text_kv = dit.text_kv(torch.randn(1, 5, TEXT_DIM))
    mask = block_causal_mask(6, 3, dit.tokens_per_frame(8, 8))
    whole, _ = dit(x, t, None, torch.arange(6), text_kv, mask=mask)
    first, kv = dit(x[:, :, :3], t[:, :3], None, torch.arange(3), text_kv)
    second, _ = dit(x[:, :, 3:], t[:, 3:], None, torch.arange(3, 6), text_kv, past_kv=kv)
    torch.testing.assert_close(torch.cat([first, second], dim=2), whole, rtol=1e-4, atol=1e-5)
