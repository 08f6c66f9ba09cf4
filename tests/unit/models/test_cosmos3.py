"""Cosmos3: the stepped runner equals `Cosmos3OmniPipeline.__call__` for every task, interleaved
requests equal their solo runs, and the loader's layout / quantisation / safety checks."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ActionCondition, GenerationParams
from worldserve.models import registry
from worldserve.models.cosmos3 import loader
from worldserve.models.cosmos3.dev import build_cosmos3
from worldserve.models.cosmos3.inputs import decode_image, decode_video
from worldserve.models.cosmos3.runner import Cosmos3Runner
from worldserve.models.types import ModelLoadError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def model_dir(cosmos3_dir):
    return cosmos3_dir


@pytest.fixture(scope="module")
def runner(model_dir):
    torch.set_num_threads(1)
    return registry.load_runner("generation", model_dir)


def png(width: int, height: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def mp4(frames: int, width: int, height: int) -> bytes:
    from worldserve.media.video import encode_mp4

    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    encode_mp4(rng.integers(0, 255, (frames, height, width, 3), dtype=np.uint8), 8, buf, 90)
    return buf.getvalue()


def params(**overrides) -> GenerationParams:
    base = dict(prompt="a robot arm picks up the blue cup", width=48, height=32, num_frames=5,
                num_inference_steps=2, guidance_scale=4.0, seeds=[3], fps=24.0)
    base.update(overrides)
    return GenerationParams(**base)


def stepped(runner, p: GenerationParams):
    frames, extras = runner.run_to_end(p, p.seeds[0])
    return frames, extras


def reference(runner, p: GenerationParams, **call):
    kwargs = dict(prompt=p.prompt, negative_prompt=p.negative_prompt, fps=p.fps,
                  num_inference_steps=p.num_inference_steps, guidance_scale=p.guidance_scale,
                  generator=torch.Generator("cpu").manual_seed(p.seeds[0]), output_type="np")
    if p.action is None:
        kwargs.update(num_frames=p.num_frames, height=p.height, width=p.width)
    kwargs.update(call)
    return runner.pipe(**kwargs)


def as_uint8(frames: np.ndarray) -> np.ndarray:
    return (frames * 255).round().astype(np.uint8)


def assert_same_frames(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    assert np.array_equal(as_uint8(ours), as_uint8(theirs))


def test_detects_and_loads_the_dev_directory(model_dir, runner):
    assert registry.resolve("generation", model_dir).name == "cosmos3"
    assert isinstance(runner, Cosmos3Runner)
    assert runner.max_batch_size == 1 and runner.supports_sound and runner.supports_actions
    assert runner.padded_action_dim == 64 and runner.sample_rate == 400
    assert runner.pipe.safety_checker is None


def test_text_to_image_equals_pipeline(runner):
    p = params(num_frames=1, width=32, height=32)
    frames, extras = stepped(runner, p)
    assert frames.shape == (1, 32, 32, 3) and extras is None
    assert_same_frames(frames, reference(runner, p).video)


def test_text_to_video_with_sound_equals_pipeline(runner):
    p = params(generate_sound=True, negative_prompt="blurry")
    frames, extras = stepped(runner, p)
    out = reference(runner, p, enable_sound=True)
    assert_same_frames(frames, out.video)
    assert extras is not None and extras.sample_rate == 400
    assert torch.equal(torch.from_numpy(extras.audio), out.sound.float())


def test_image_to_video_equals_pipeline(runner):
    image = png(56, 40)
    p = params(condition_images=[image])
    frames, _ = stepped(runner, p)
    assert_same_frames(frames, reference(runner, p, image=decode_image(image)).video)


def test_video_to_video_equals_pipeline(runner):
    video = mp4(9, 48, 32)
    p = params(num_frames=9, condition_video=video, condition_frame_indexes_vision=[0],
               condition_video_keep="last")
    frames, _ = stepped(runner, p)
    out = reference(runner, p, video=decode_video(video), condition_frame_indexes_vision=[0],
                    condition_video_keep="last")
    assert_same_frames(frames, out.video)


def action_call(p: GenerationParams, image=None, video=None):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    a = p.action
    raw = torch.tensor(a.raw_actions, dtype=torch.float32) if a.raw_actions else None
    return CosmosActionCondition(mode=a.mode, chunk_size=a.chunk_size, domain_name=a.domain_name,
                                 resolution_tier=a.resolution_tier, raw_actions=raw,
                                 image=image, video=video)


@pytest.mark.parametrize("mode, domain, width", [
    ("policy", "agibotworld", 29), ("forward_dynamics", "av", 9),
    ("inverse_dynamics", "droid_lerobot", 10)])
def test_action_modes_equal_pipeline(runner, mode, domain, width):
    raw = np.linspace(-1, 1, 4 * width).reshape(4, width).tolist()
    action = ActionCondition(mode=mode, chunk_size=4, domain_name=domain, resolution_tier=256,
                             raw_actions=raw if mode == "forward_dynamics" else None)
    if mode == "inverse_dynamics":
        video = mp4(5, 56, 40)
        p = params(action=action, condition_video=video, guidance_scale=1.0)
        call = action_call(p, video=decode_video(video))
    else:
        image = png(56, 40)
        p = params(action=action, condition_images=[image], guidance_scale=1.0)
        call = action_call(p, image=decode_image(image))
    frames, extras = stepped(runner, p)
    out = reference(runner, p, action=call)
    assert_same_frames(frames, out.video)
    assert frames.shape[1:3] == (32, 48)  # follows the 40x56 content, floored to 16
    if mode == "forward_dynamics":
        assert out.action is None and extras is None
    else:
        assert extras.action.shape == (4, width) and extras.action_mode == mode
        assert torch.equal(torch.from_numpy(extras.action), out.action[0])


def test_interleaved_requests_equal_their_solo_runs(runner):
    a = params(num_inference_steps=3, generate_sound=True)
    b = params(num_frames=1, width=32, height=32, seeds=[9], num_inference_steps=2)
    solo_a, solo_b = stepped(runner, a)[0], stepped(runner, b)[0]
    state_a = runner.prepare(["a"], [a], a.seeds)
    state_b = runner.prepare(["b"], [b], b.seeds)
    while not (state_a.done_denoising and state_b.done_denoising):
        for state in (state_a, state_b):
            if not state.done_denoising:
                runner.denoise_step(state)
    assert np.array_equal(runner.decode(state_a, 0), solo_a)
    assert np.array_equal(runner.decode(state_b, 0), solo_b)


def test_a_schedule_with_equal_first_timesteps_runs_every_step_once(runner):
    """From 201 steps the tiny model's flow-shifted timesteps start 999, 999: step i must still
    be index i (looked up by timestep, the scheduler took the second 999 and every row failed
    its last step with a bare AssertionError)."""
    p = params(num_frames=1, width=32, height=32, num_inference_steps=201, guidance_scale=1.0)
    state = runner.prepare(["a"], [p], p.seeds)
    row = state.rows[0]
    assert row.timesteps[0] == row.timesteps[1]
    while not state.done_denoising:
        runner.denoise_step(state)
    assert row.scheduler.step_index == 201
    assert np.isfinite(runner.decode(state, 0)).all()


def test_check_refuses_sound_and_actions_the_checkpoint_lacks(model_dir, tmp_path):
    from worldserve.models.cosmos3.dev import Cosmos3DevConfig

    edge = tmp_path / "edge"
    edge.mkdir()
    build_cosmos3(edge, 0, Cosmos3DevConfig(sound=False, actions=False, hidden_act="relu2"))
    edge_runner = registry.load_runner("generation", edge)
    with pytest.raises(InvalidRequest, match="does not generate sound"):
        edge_runner.check(params(generate_sound=True))
    with pytest.raises(InvalidRequest, match="does not generate actions"):
        edge_runner.check(params(action=ActionCondition(mode="policy", chunk_size=4,
                                                        domain_name="av")))
    frames, _ = stepped(edge_runner, params(num_frames=1, width=32, height=32))
    assert frames.shape == (1, 32, 32, 3)


def test_published_layout_loads(model_dir, tmp_path):
    """The one-directory layout: root reasoner config, processor and modular index beside the
    diffusers components; the transformer weights sharded with an index."""
    from safetensors.torch import load_file, save_file

    published = tmp_path / "published"
    shutil.copytree(model_dir, published)
    (published / "config.json").write_text(json.dumps({"model_type": "cosmos3_omni"}))
    (published / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16}))
    (published / "modular_model_index.json").write_text(json.dumps({"_class_name": "x"}))
    weights = published / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    weights.unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"diffusion_pytorch_model-00001-of-00002.safetensors": names[:half],
              "diffusion_pytorch_model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, published / "transformer" / shard)
        weight_map.update({k: shard for k in keys})
    (published / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    runner = registry.load_runner("generation", published)
    original = registry.load_runner("generation", model_dir)
    ours, theirs = runner.pipe.transformer.state_dict(), original.pipe.transformer.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    p = params(num_frames=1, width=32, height=32)
    assert_same_frames(stepped(runner, p)[0], stepped(original, p)[0])


def test_quantisation_config_over_plain_weights_is_refused_a_bare_state_file_is_not(model_dir,
                                                                                    tmp_path):
    """FP8 checkpoints load W8A16 on the CPU (tests/unit/fp8); a config that says quantised
    over plain weights is refused, and a modelopt_state.pth beside plain weights is plain."""
    quantised = tmp_path / "fp8"
    shutil.copytree(model_dir, quantised)
    (quantised / "modelopt_state.pth").write_bytes(b"")
    assert registry.load_runner("generation", quantised).pipe.transformer is not None
    (quantised / "modelopt_state.pth").unlink()
    config_path = quantised / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_type": "FP8"}
    config_path.write_text(json.dumps(config))
    assert loader.detect_quantisation(quantised).method == "modelopt"
    with pytest.raises(ModelLoadError, match="quantization_config says the weights are quant"):
        registry.load_runner("generation", quantised)


def test_fp8_tensors_are_detected_from_the_safetensors_header(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "transformer").mkdir()
    save_file({"w": torch.zeros(2, 2).to(torch.float8_e4m3fn)},
              tmp_path / "transformer" / "diffusion_pytorch_model.safetensors")
    found = loader.detect_quantisation(tmp_path)
    assert found is not None and found.method == "fp8" and "F8_E4M3" in found.evidence


def test_missing_component_and_safety_checker_messages(model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    shutil.rmtree(broken / "vae")
    with pytest.raises(ModelLoadError, match="the vae/ folder"):
        registry.load_runner("generation", broken)
    with pytest.raises(ModelLoadError, match="pip install cosmos-guardrail"):
        registry.load_runner("generation", model_dir, safety_checker=True)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_frames=6), r"num_frames must be 4k\+1"),
    (dict(width=40), "width must be a positive multiple of 16"),
    (dict(condition_images=[b"x"], condition_video=b"y"), "not both"),
    (dict(num_frames=9, condition_video=b"y", condition_frame_indexes_vision=[3]),
     "outside the latent timeline"),
    (dict(action=ActionCondition(mode="inverse_dynamics", chunk_size=4, domain_name="av"),
          condition_images=[b"x"]), "'inverse_dynamics' requires a video"),
    (dict(action=ActionCondition(mode="policy", chunk_size=4, domain_name="mars_rover"),
          condition_images=[b"x"]), "Unknown action domain_name='mars_rover'"),
    (dict(action=ActionCondition(mode="policy", chunk_size=4, domain_name="libero"),
          condition_images=[b"x"]), "Unknown action domain_name='libero'"),
    (dict(action=ActionCondition(mode="policy", chunk_size=6, domain_name="av"),
          condition_images=[b"x"]), "action_horizon must be a positive multiple of 4"),
    (dict(action=ActionCondition(mode="forward_dynamics", chunk_size=4, domain_name="av",
                                 raw_actions=[[0.0] * 8]), condition_images=[b"x"]),
     r"width \(8\) does not match the expected action width \(9\)"),
    (dict(action=ActionCondition(mode="policy", chunk_size=4, domain_name="av",
                                 resolution_tier=300), condition_images=[b"x"]),
     "resolution_tier=300"),
])
def test_check_refuses_bad_requests_with_a_clear_message(runner, overrides, message):
    with pytest.raises(InvalidRequest, match=message):
        runner.check(params(**overrides))


def test_policy_returns_raw_width_actions_for_every_supported_domain(runner):
    """Every domain the checkpoint publishes: [action_horizon, raw_action_dim] actions."""
    domains = runner.features.action_domains
    assert len(domains) == 15 and domains["hand_pose"] == 57 and "libero" not in domains
    image = png(32, 32)
    for name, width in sorted(domains.items()):
        action = ActionCondition(mode="policy", chunk_size=4, domain_name=name,
                                 resolution_tier=256)
        p = params(action=action, condition_images=[image], guidance_scale=1.0,
                   num_inference_steps=1)
        runner.check(p)
        _, extras = stepped(runner, p)
        assert extras.action.shape == (4, width), name
        assert extras.domain_id == runner.features.action_domain_ids[name]


def test_describe_for_the_admin_model_info(runner):
    facts = runner.describe()
    assert facts["family"] == "cosmos3" and facts["pipeline"] == "Cosmos3OmniPipeline"
    assert facts["dtype"] == "float32" and facts["device"] == "cpu"
    assert facts["sound"] and facts["action_generation"]
    assert facts["lora_supported"] and facts["lora"] == []  # adapters: test_cosmos3_admin.py
