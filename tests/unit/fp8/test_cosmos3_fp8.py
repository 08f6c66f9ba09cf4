"""FP8 Cosmos3 checkpoints through the real stage loaders and runners (CPU, W8A16): a tiny
generator + reasoner directory quantised in each ModelOpt layout serves exactly what the same
directory with the dequantised weights written as plain float32 serves (t2i frames, greedy
session replies), several seeds of one request each as their solo run does; missing scales and
unknown formats stop the load; W8A8 wiring on the reasoner, its batched sessions each as alone."""

from __future__ import annotations

import json
import logging
import shutil
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.support.fp8_dirs import LAYOUTS, fp8_pair
from tests.support.machine import require_module
from tests.support.seeds import SEEDS, assert_each_seed_equals_its_solo_run
from tests.unit.reasoner.conftest import GREEDY, Driver
from tests.unit.reasoner.drive import concurrent_replies, seeded_replies, windowed_greedy_replies
from worldserve.config import ReasonerStageConfig, ServerConfig, StreamingConfig
from worldserve.engines.reasoner.engine import ReasonerEngine
from worldserve.ipc.messages import GenerationParams
from worldserve.levers.fp8 import load
from worldserve.levers.fp8.detect import Fp8FormatError
from worldserve.levers.fp8.linear import Fp8Linear, scaled_mm_fits
from worldserve.levers.fp8.weights import read_fp8_tensors
from worldserve.models import registry

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from worldserve.models.cosmos3.dev import build_generation

    target = tmp_path_factory.mktemp("cosmos3-both")
    build_generation(target, 0)
    return target


@pytest.fixture(scope="module", params=LAYOUTS)
def pair(request, base, tmp_path_factory) -> tuple[Path, Path]:
    return fp8_pair(base, tmp_path_factory.mktemp(request.param), request.param)


def t2i(model_dir: Path) -> tuple[np.ndarray, torch.nn.Module]:
    runner = registry.load_runner("generation", model_dir)
    p = GenerationParams(prompt="a red cup", width=32, height=32, num_frames=1,
                         num_inference_steps=2, guidance_scale=4.0, seeds=[3], fps=24.0)
    frames, _ = runner.run_to_end(p, p.seeds[0])
    return np.asarray(frames), runner.pipe.transformer


def test_t2i_frames_equal_the_dequantised_checkpoint(pair, base, caplog):
    quantised, reference = pair
    with caplog.at_level(logging.INFO, logger="worldserve.fp8"):
        ours, transformer = t2i(quantised)
    theirs, reference_transformer = t2i(reference)
    # the same model: every parameter and buffer bit-identical to the reference's
    mine = {**transformer.state_dict(), **dict(transformer.named_buffers())}
    ref = {**reference_transformer.state_dict(), **dict(reference_transformer.named_buffers())}
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in mine)
    # and the same frames, up to float32 rounding: the CPU kernels' last bits depend on where
    # the weights sit in memory (mmapped file vs fresh tensor); merely cloning the reference's
    # parameters moves its frames by ~4e-7, so bit-identical frames cannot be asked of two
    # load paths. FP8 errors (a dropped scale, a wrong scale) are orders of magnitude larger.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
    line = next(r.getMessage() for r in caplog.records if "generator:" in r.getMessage())
    count = sum(v.dtype == torch.float8_e4m3fn for v in load_file(
        next((quantised / "transformer").glob("*.safetensors"))).values())
    assert f"loaded W8A16: {count} quantised linears dequantised once" in line and count > 20
    # quantised, and scaled back: every weight within E4M3 rounding of the unquantised one,
    # not equal to it (a dropped scale would be off by up to 448x)
    plain = load_file(base / "transformer" / "diffusion_pytorch_model.safetensors")
    assert_fp8_rounded(transformer.state_dict(), plain)


def assert_fp8_rounded(loaded: dict[str, torch.Tensor], plain: dict[str, torch.Tensor]) -> None:
    rounded = 0
    for name, weight in loaded.items():
        if name in plain and not torch.equal(weight, plain[name]):
            bound = plain[name].abs().max() / 8  # E4M3: 3 mantissa bits, per-tensor scale
            assert (weight - plain[name]).abs().max() <= bound, name
            rounded += 1
    assert rounded > 20


def greedy(model_dir: Path) -> list[list[int]]:
    stage = ReasonerStageConfig(model_path=model_dir)
    return windowed_greedy_replies(Driver(ReasonerEngine(stage, ServerConfig())), num_frames=2)


def test_greedy_session_replies_equal_the_dequantised_checkpoint(pair, base):
    quantised, reference = pair
    assert load.reasoner_format(quantised) is not None and load.reasoner_format(reference) is None
    from transformers import AutoModelForImageTextToText

    plain = AutoModelForImageTextToText.from_pretrained(base, local_files_only=True)
    assert_fp8_rounded(load.load_reasoner_model(quantised, "float32", "cpu").state_dict(),
                       plain.state_dict())
    assert greedy(quantised) == greedy(reference)


def test_several_seeds_of_one_request_equal_each_seeds_solo_run(pair):
    quantised, _ = pair
    runner = registry.load_runner("generation", quantised)
    p = GenerationParams(prompt="a red cup", width=32, height=32, num_frames=1,
                         num_inference_steps=2, guidance_scale=4.0, seeds=SEEDS, fps=24.0)
    assert_each_seed_equals_its_solo_run(runner, p)


def drop_one_scale(folder: Path, suffix: str) -> str:
    shard = next(folder.glob("*.safetensors"))
    tensors = load_file(shard)
    name = sorted(k for k in tensors if k.endswith(suffix))[0]
    del tensors[name]
    save_file(tensors, shard)
    return name.removesuffix(suffix)


def test_a_missing_scale_fails_both_loads_naming_the_linear(pair, tmp_path):
    quantised, _ = pair
    broken = tmp_path / "broken"
    shutil.copytree(quantised, broken)
    native = load.generator_format(broken).layout == "modelopt_native"
    suffix = "weight_quantizer._scale" if native else "weight_scale"
    prefix = drop_one_scale(broken / "transformer", suffix)
    with pytest.raises(Fp8FormatError, match=f"{prefix}weight is FP8 E4M3 but its scale"):
        registry.load_runner("generation", broken)
    prefix = drop_one_scale(broken, suffix)
    with pytest.raises(Fp8FormatError, match=f"{prefix}weight is FP8 E4M3 but its scale"):
        registry.load_runner("reasoner", broken)


def test_an_unknown_quant_method_fails_both_loads(pair, tmp_path):
    quantised, _ = pair
    broken = tmp_path / "awq"
    shutil.copytree(quantised, broken)
    for config_file in (broken / "transformer" / "config.json", broken / "config.json"):
        config = json.loads(config_file.read_text())
        config["quantization_config"] = {"quant_method": "awq", "bits": 4}
        config_file.write_text(json.dumps(config))
    with pytest.raises(Fp8FormatError, match="quant_method 'awq' is not one worldserve loads"):
        registry.load_runner("generation", broken)
    with pytest.raises(Fp8FormatError, match="quant_method 'awq' is not one worldserve loads"):
        registry.load_runner("reasoner", broken)


def test_reasoner_w8a8_swaps_every_quantised_linear(pair, monkeypatch):
    """W8A8 forced on the CPU (the capability check patched away): every quantised linear of a
    shape `_scaled_mm` takes is an `Fp8Linear` running it, and the logits stay near W8A16's
    (the activations' FP8 rounding is the only difference)."""
    quantised, _ = pair
    w8a16 = load.load_reasoner_model(quantised, "float32", "cpu")
    monkeypatch.setattr(load, "_w8a8_missing", lambda *args: None)
    w8a8 = load.load_reasoner_model(quantised, "float32", "cpu")
    swapped = [m for m in w8a8.modules() if isinstance(m, Fp8Linear)]
    linears = read_fp8_tensors(load.reasoner_format(quantised)).linears.values()
    assert len(swapped) == sum(scaled_mm_fits(linear) for linear in linears) > 20
    ids = torch.arange(3, 19).unsqueeze(0)
    with torch.no_grad():
        ours, theirs = w8a8(input_ids=ids).logits, w8a16(input_ids=ids).logits
    assert not torch.equal(ours, theirs)
    assert (ours - theirs).abs().max() < 0.1 * theirs.abs().max()


def test_the_fp8_benchmark_decodes_w8a8_on_both_paths(pair, monkeypatch):
    """benchmarks/fp8.py's W8A8 part (GPU only there) decodes through the runner's decode
    steps, not only one `model(input_ids=...)`: run here with W8A8 forced on the CPU."""
    from benchmarks.fp8 import decode_paths

    quantised, _ = pair
    monkeypatch.setattr(load, "_w8a8_missing", lambda *args: None)
    assert decode_paths(quantised, "cpu", "float32", num_tokens=4) == {
        "decode_paths": ["eager", "static"], "decoded_tokens": 4, "static_equals_eager": True}


def test_reasoner_w8a8_matches_linears_by_name(pair, tmp_path, monkeypatch):
    """Two quantised linears holding the same FP8 tensors (k and v of a layer) are still each
    swapped in at its own module: linears are matched by transformers' renaming of the name,
    not by comparing weights (which found two candidates, and copied every same-shape weight
    to the host)."""
    quantised, _ = pair
    twin = tmp_path / "twin"
    shutil.copytree(quantised, twin)
    shard = next(twin.glob("*.safetensors"))
    tensors = load_file(shard)
    source, target = "layers.0.self_attn.to_k.", "layers.0.self_attn.to_v."
    copied = {target + k.removeprefix(source): v.clone() for k, v in tensors.items()
              if k.startswith(source)}
    assert target + "weight" in copied and copied.keys() <= tensors.keys()
    save_file({**tensors, **copied}, shard)
    monkeypatch.setattr(load, "_w8a8_missing", lambda *args: None)
    model = load.load_reasoner_model(twin, "float32", "cpu")
    attn = model.model.language_model.layers[0].self_attn
    assert isinstance(attn.k_proj, Fp8Linear) and isinstance(attn.v_proj, Fp8Linear)
    assert torch.equal(attn.k_proj.weight.float(), attn.v_proj.weight.float())


def test_reasoner_w8a8_decodes_through_the_engine_static_and_batched(pair, monkeypatch):
    """W8A8 forced on the CPU, decoded the way a server decodes: the static step (on by default)
    calls each `Fp8Linear` rather than reading its float8 weight, alone and in a batch of two
    sessions, and gives the eager path's tokens (a bf16 x fp8 `F.linear` raised at the first
    decoded token)."""
    quantised, _ = pair
    monkeypatch.setattr(load, "_w8a8_missing", lambda *args: None)

    def engine(**stage) -> Driver:
        config = ReasonerStageConfig(model_path=quantised,
                                     streaming=StreamingConfig(max_sessions=2), **stage)
        return Driver(ReasonerEngine(config, ServerConfig()))

    static, eager = engine(), engine(static_decode=False)
    assert any(isinstance(m, Fp8Linear) for m in static.engine.steps.runner.model.modules())
    assert static.engine.decode_path == "static" and eager.engine.decode_path == "eager"
    sampling = {"max_tokens": 6, **GREEDY}
    ours = concurrent_replies(static, sampling, num_sessions=2, num_frames=2)
    assert ours == concurrent_replies(eager, sampling, num_sessions=2, num_frames=2)
    assert all(len(reply) == 6 for replies in ours.values() for reply in replies)
    # the compiled step takes plain linears only: it stands aside rather than recompile per layer
    assert static.engine.steps.runner.configure_decode(True, compile_step=True) == "eager"


def test_reasoner_w8a8_sessions_differing_by_seed_batched_each_equal_their_solo_session(
        pair, monkeypatch):
    """The reasoner's several seeds (a chat answers n = 1 only): W8A8 forced on the CPU, sessions
    alike but for their seed decoded in one batch each give their solo session's replies (an
    input scale taken from the whole batch would tie each reply to the others)."""
    quantised, _ = pair
    monkeypatch.setattr(load, "_w8a8_missing", lambda *args: None)

    def engine() -> Driver:
        config = ReasonerStageConfig(model_path=quantised,
                                     streaming=StreamingConfig(max_sessions=len(SEEDS)))
        return Driver(ReasonerEngine(config, ServerConfig()))

    # long, unfiltered sampling: an input scale taken from the whole batch (the plant
    # w8a8-input-scale-taken-from-the-batch) moves the logits slightly, which 6 tokens at
    # temperature 0.8 did not show
    sampling = {"max_tokens": 24, "temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0}
    batched = engine()
    assert any(isinstance(m, Fp8Linear) for m in batched.engine.steps.runner.model.modules())
    together = seeded_replies(batched, sampling, SEEDS)
    alone = engine()
    for seed in SEEDS:
        assert seeded_replies(alone, sampling, [seed]) == {seed: together[seed]}, seed
    for a, b in combinations(SEEDS, 2):
        assert together[a] != together[b], (a, b)


@pytest.fixture
def modelopt_restore_enabled():
    """ModelOpt's `enable_huggingface_checkpointing` (what a W8A8 generator calls), undone after
    the test: it patches transformers' and diffusers' classes process-wide."""
    require_module("modelopt", "pip install -e '.[fp8]'")
    import modelopt.torch.opt as mto
    from modelopt.torch.opt.plugins import huggingface as hf

    saved = {(cls, name): vars(cls).get(name) for classes, methods in
             hf._LIBRARY_CLASSES_FOR_PATCHING.values() for cls, patches in zip(classes, methods)
             for name in [*(n for n, _ in patches), "_modelopt_cache"]}
    mto.enable_huggingface_checkpointing()
    yield
    for (cls, name), value in saved.items():
        if value is None:
            if name in vars(cls):
                delattr(cls, name)
        else:
            setattr(cls, name, value)
        hf._PATCHED_CLASSES.discard(cls)


def test_reasoner_loads_beside_modelopts_restore_patch(pair, modelopt_restore_enabled):
    """A W8A8 generator enables ModelOpt's process-wide `from_pretrained` patch; the FP8
    reasoner's load from a state dict still works (the patch called os.path.isdir(None))."""
    quantised, reference = pair
    model = load.load_reasoner_model(quantised, "float32", "cpu")
    plain = load_file(next(reference.glob("*.safetensors")))
    q_proj = model.model.language_model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q_proj, plain["layers.0.self_attn.to_q.weight"])


def test_fp8_compute_setting_reaches_the_loaders(pair):
    """`stages.<stage>.fp8_compute` is handed to the loaders: w8a8 on the CPU stops startup
    with the reason, from the engine's own construction."""
    quantised, _ = pair
    assert ReasonerStageConfig().quant_options() == {}
    stage = ReasonerStageConfig(model_path=quantised, fp8_compute="w8a8")
    assert stage.quant_options() == {"fp8_compute": "w8a8"}
    with pytest.raises(Fp8FormatError, match="fp8_compute is w8a8 but device 'cpu' is not a"):
        ReasonerEngine(stage, ServerConfig())
    with pytest.raises(ValueError, match="fp8_compute"):
        ReasonerStageConfig(fp8_compute="fp4")


def test_the_published_fp8_layout_loads_sharded(pair, tmp_path):
    """The `fp8` revision's shape: transformer weights in two shards + index, root
    modelopt_state.pth, processor files and modular index beside the components: the same
    weights as the one-file FP8 directory."""
    quantised, _ = pair
    published = tmp_path / "published"
    shutil.copytree(quantised, published)
    (published / "modelopt_state.pth").write_bytes(b"root state")
    (published / "modular_model_index.json").write_text(json.dumps({"_class_name": "x"}))
    folder = published / "transformer"
    weights = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights)
    weights.unlink()
    names = sorted(tensors)
    half = len(names) // 2  # a linear's scale may land in the other shard
    weight_map = {}
    for i, keys in enumerate((names[:half], names[half:]), 1):
        shard = f"diffusion_pytorch_model-0000{i}-of-00002.safetensors"
        save_file({k: tensors[k] for k in keys}, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "stale.safetensors").write_bytes(b"not in the index: never read")
    ours = registry.load_runner("generation", published).pipe.transformer.state_dict()
    theirs = registry.load_runner("generation", quantised).pipe.transformer.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("stage", ["generation", "reasoner"])
def test_bfloat16_w8a16_equals_the_reference_in_bfloat16(pair, stage):
    """In a 16-bit stage dtype too (modules diffusers keeps in float32 stay float32)."""
    quantised, reference = pair

    def state(path: Path) -> dict[str, torch.Tensor]:
        runner = registry.load_runner(stage, path, dtype="bfloat16")
        model = runner.pipe.transformer if stage == "generation" else runner.model
        return {**model.state_dict(), **dict(model.named_buffers())}

    ours, theirs = state(quantised), state(reference)
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == theirs[k].dtype and torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(v.dtype == torch.bfloat16 for v in ours.values())
