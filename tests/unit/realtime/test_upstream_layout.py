"""Causal Wan checkpoints in their upstream key layout (Self-Forcing pickle, original Wan
directory, LingBot-World camera keys) -> diffusers WanTransformer3DModel."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from tests.unit.realtime.helpers import lingbot_world_state, upstream_wan_state
from worldserve.models.causal_dit.upstream import load_upstream, load_upstream_transformer
from worldserve.models.types import ModelLoadError

DIM, LAYERS, FFN, TEXT, FREQ, CHANNELS, PATCH = 16, 2, 32, 8, 16, 4, (1, 2, 2)


def check_mapped(model, state: dict[str, torch.Tensor]) -> None:
    params = model.state_dict()
    pairs = {"head.modulation": "scale_shift_table", "head.head.weight": "proj_out.weight",
             "blocks.1.norm3.weight": "blocks.1.norm2.weight",
             "blocks.0.self_attn.o.weight": "blocks.0.attn1.to_out.0.weight",
             "blocks.1.cross_attn.norm_k.weight": "blocks.1.attn2.norm_k.weight",
             "blocks.0.ffn.0.weight": "blocks.0.ffn.net.0.proj.weight",
             "time_projection.1.bias": "condition_embedder.time_proj.bias"}
    for upstream, diffusers_key in pairs.items():
        assert torch.equal(params[diffusers_key], state[upstream]), upstream
    assert sum(v.numel() for v in params.values()) == sum(v.numel() for v in state.values())


def test_self_forcing_pickle_loads_its_ema_generator(tmp_path):
    ema, raw = upstream_wan_state(0), upstream_wan_state(1)
    path = tmp_path / "self_forcing_dmd.pt"
    torch.save({"generator": {f"model.{k}": v for k, v in raw.items()},
                "generator_ema": {f"model.{k}": v for k, v in ema.items()}}, path)
    model = load_upstream_transformer(path)
    check_mapped(model, ema)
    cfg = model.config
    assert (cfg.num_layers, cfg.ffn_dim, cfg.text_dim, cfg.in_channels) == (LAYERS, FFN, TEXT, 4)
    x = torch.randn(1, CHANNELS, 3, 4, 4)
    out = model(x, torch.tensor([500]), torch.randn(1, 5, TEXT), return_dict=False)[0]
    assert out.shape == x.shape


def test_original_wan_directory_with_declared_heads(tmp_path):
    state = upstream_wan_state(2)
    save_file(state, str(tmp_path / "diffusion_pytorch_model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "WanModel", "dim": DIM,
                                                      "num_heads": 2}))
    model = load_upstream_transformer(tmp_path)
    check_mapped(model, state)
    assert model.config.num_attention_heads == 2 and model.config.attention_head_dim == 8


def test_lingbot_world_camera_weights_load_into_the_camera_branch(tmp_path):
    state = lingbot_world_state(3, dim=DIM, latent=CHANNELS, text=TEXT)
    path = tmp_path / "lingbot.pt"
    torch.save(state, path)
    model, camera = load_upstream(path)
    cams = {k: v for k, v in state.items() if "cam" in k or "c2ws" in k}
    assert set(camera.state_dict()) == set(cams)
    for key, value in cams.items():
        assert torch.equal(camera.state_dict()[key], value), key
    assert model.config.in_channels == 2 * CHANNELS + 4 and model.config.out_channels == CHANNELS
    with pytest.raises(ModelLoadError, match="load_upstream"):
        load_upstream_transformer(path)


def test_partial_camera_weights_are_refused_naming_the_missing(tmp_path):
    state = lingbot_world_state(3, dim=DIM, latent=CHANNELS, text=TEXT)
    del state["blocks.1.cam_shift_layer.weight"]
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(ModelLoadError, match="blocks.1.cam_shift_layer.weight"):
        load_upstream(tmp_path / "partial.pt")


def test_unknown_keys_are_named(tmp_path):
    state = upstream_wan_state(4)
    state["blocks.0.mystery.weight"] = torch.zeros(1)
    torch.save({"generator_ema": state}, tmp_path / "odd.pt")
    with pytest.raises(ModelLoadError, match="blocks.0.mystery.weight"):
        load_upstream_transformer(tmp_path / "odd.pt")
