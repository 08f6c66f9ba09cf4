"""DFlash drafters that draft right and drafters in published layouts.

* A drafter fitted to a Cosmos3 dev reasoner's own greedy replies (`models/dflash/fit.py`) has
  most of its drafts accepted on both reasoners (Omni, Edge), and the replies stay those of
  decoding without speculation: the acceptance path, not only the rejection path, is lossless.
* The layouts DFlash drafters are published in (z-lab's `DFlashDraftModel`, vLLM speculators'
  `dflash`) load as the same network: equal to an independent forward written here from z-lab's
  `dflash/model.py`, and a published drafter given alone makes DFlash the method.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel

from tests.unit.reasoner.conftest import GREEDY, Driver
from tests.unit.reasoner.drive import windowed_greedy_replies
from tests.unit.reasoner.reference import reply_tokens
from tests.unit.reasoner.tiny_vlm import frame_bytes
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig
from worldserve.models import registry
from worldserve.models.dflash import fit
from worldserve.models.dflash.dev import write_drafter_for
from worldserve.models.dflash.layouts import read_drafter, write_published
from worldserve.models.types import ModelLoadError


def _engine(model_dir: Path, **streaming) -> Driver:
    from worldserve.engines.reasoner.engine import ReasonerEngine

    return Driver(ReasonerEngine(ReasonerStageConfig(
        model_path=model_dir, streaming=StreamingConfig(**streaming)), ServerConfig()))


@pytest.fixture(scope="module")
def fitted(cosmos3_dir: Path, tmp_path_factory) -> tuple[Path, list[list[int]]]:
    """A drafter fitted to the reasoner's greedy replies of the windowed workload
    (`drive.windowed_greedy_replies`, replayed here to collect them), and those replies
    (decoded without speculation)."""
    plain = _engine(cosmos3_dir)
    plain.create(retention={"max_video_segments": 2}, sampling={"max_tokens": 16, **GREEDY})
    runner = registry.load_runner("reasoner", cosmos3_dir)
    target = tmp_path_factory.mktemp("fitted-drafter")
    write_drafter_for(target, 0, cosmos3_dir)
    drafter = AutoModel.from_pretrained(target)
    replies, data = [], []
    for i in range(4):
        plain.frame("s1", frame_bytes(i))
        session = plain.engine.sessions["s1"]
        replies.append(reply_tokens(session))
        ids = list(session.kv.ids) + [session.pending_token]
        media = [seg.image for seg in session.segments if seg.image is not None]
        data += fit.examples(runner, drafter.config.target_layer_ids, ids, media,
                             len(ids) - len(replies[-1]) - 1, drafter.config.block_size)
    fit.fit(drafter, runner.model, data, steps=100)
    drafter.save_pretrained(target)
    return target, replies


def test_a_fitted_drafter_is_accepted_and_replies_stay_lossless(cosmos3_dir, fitted):
    drafter_dir, plain = fitted
    spec = _engine(cosmos3_dir, spec_method="dflash", spec_model_path=drafter_dir)
    assert windowed_greedy_replies(spec) == plain
    extra = spec.engine.stats()["extra"]
    assert extra["spec_accepted"] >= 0.4 * extra["spec_drafted"] > 0
    assert extra["spec_accepted"] / extra["spec_steps"] > 1.0  # tokens gained per drafting step


# ---------------------------------------------------------------- published layouts


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def zlab_forward(w: dict, c: dict, target_hidden: torch.Tensor, noise: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """z-lab's `DFlashDraftModel.forward` (Qwen3 DFlash layers, full attention, no mask:
    the block attends to the context and to itself in both directions), written out from
    `dflash/model.py` over the published weight names."""
    eps, d = c["rms_norm_eps"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    ctx = _rms(F.linear(target_hidden, w["fc.weight"]), w["hidden_norm.weight"], eps)
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    freqs = positions[0, :, None].float() * inv_freq
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    h = noise
    q_len, kv_len = noise.shape[1], ctx.shape[1] + noise.shape[1]
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(1, q_len, nh, d)
        q = _rms(q, w[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        both = torch.cat([ctx, x], dim=1)
        k = F.linear(both, w[p + "self_attn.k_proj.weight"]).view(1, kv_len, nkv, d)
        k = _rms(k, w[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = F.linear(both, w[p + "self_attn.v_proj.weight"]).view(1, kv_len, nkv, d)
        v = v.transpose(1, 2)
        q = q * cos[-q_len:] + _rotate_half(q) * sin[-q_len:]
        k = k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        attn = F.scaled_dot_product_attention(q, k, v, scale=d ** -0.5)
        h = h + F.linear(attn.transpose(1, 2).reshape(1, q_len, -1),
                         w[p + "self_attn.o_proj.weight"])
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"]))
        h = h + F.linear(gate * F.linear(x, w[p + "mlp.up_proj.weight"]),
                         w[p + "mlp.down_proj.weight"])
    return _rms(h, w["norm.weight"], eps)


@pytest.fixture(scope="module")
def distinct_drafter(cosmos3_dir, tmp_path_factory) -> AutoModel:
    """A dev drafter with non-unit norms (so that swapped norms cannot pass)."""
    target = tmp_path_factory.mktemp("drafter-src")
    write_drafter_for(target, 1, cosmos3_dir)
    model = AutoModel.from_pretrained(target)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=gen))
    return model


@pytest.mark.parametrize("layout", ["zlab", "speculators"])
def test_published_layouts_load_as_the_same_drafter(distinct_drafter, tmp_path, layout):
    from safetensors.torch import load_file

    write_published(distinct_drafter, tmp_path, layout)
    loaded = read_drafter(tmp_path, "float32")
    c = distinct_drafter.config
    gen = torch.Generator().manual_seed(3)
    context = torch.randn(1, 9, len(c.target_layer_ids) * c.hidden_size, generator=gen)
    noise = torch.randn(1, c.block_size, c.hidden_size, generator=gen)
    positions = (torch.arange(9 + c.block_size) + 5).view(1, -1)
    with torch.no_grad():
        got = loaded(noise_embeds=noise, context_hidden_states=context,
                     position_ids=positions).last_hidden_state
        original = distinct_drafter(noise_embeds=noise, context_hidden_states=context,
                                    position_ids=positions).last_hidden_state
    torch.testing.assert_close(got, original, atol=1e-6, rtol=1e-6)
    if layout == "zlab":
        config = json.loads((tmp_path / "config.json").read_text())
        expected = zlab_forward(load_file(tmp_path / "model.safetensors"), config, context,
                                noise, positions)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_published_drafter_alone_makes_dflash_the_method(cosmos3_dir, fitted, tmp_path):
    drafter_dir, plain = fitted
    write_published(AutoModel.from_pretrained(drafter_dir), tmp_path, "zlab")
    spec = _engine(cosmos3_dir, spec_model_path=tmp_path)  # no spec_method given
    assert spec.engine.capabilities().spec_method == "dflash"
    assert windowed_greedy_replies(spec) == plain
    assert spec.engine.stats()["extra"]["spec_accepted"] > 0


@pytest.mark.parametrize("change, message", [
    ({"attention_bias": True}, "attention_bias"),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0], "selector_rank": 8}},
     "DFlash2's candidate selector"),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [0],
                        "output_multiplier": 0.2}}, "output_multiplier"),
    ({"layer_types": ["sliding_attention"]}, "causal sliding-window layers"),
])
def test_published_features_the_drafter_lacks_are_load_errors(distinct_drafter, tmp_path,
                                                              change, message):
    write_published(distinct_drafter, tmp_path, "zlab")
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(change)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        read_drafter(tmp_path, "float32")


def test_a_reduced_draft_vocabulary_is_a_load_error(distinct_drafter, tmp_path):
    write_published(distinct_drafter, tmp_path, "speculators")
    config = json.loads((tmp_path / "config.json").read_text())
    config["transformer_layer_config"]["vocab_size"] = 512
    config["draft_vocab_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="reduced draft vocabulary"):
        read_drafter(tmp_path, "float32")
