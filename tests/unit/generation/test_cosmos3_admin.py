"""Operator operations on the tiny Cosmos3 generator (its pipeline has no LoRA loader: adapters
go through the transformer's `load_lora_adapter`): per-request LoRA == a fresh pipeline with the
adapter loaded, without == base, interleaved; LoRA on an action run; a weight update; model info."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.support.machine import require_module
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.engines.generation.outputs import to_uint8
from worldserve.ipc.messages import (
    ActionCondition,
    AdminResult,
    GenerateMedia,
    GenerationParams,
    GenerationProgress,
    GenerationResult,
    LoraLoad,
    LoraRef,
    ModelInfoRequest,
    WeightsUpdate,
)
from worldserve.models.cosmos3.loader import load_pipeline

require_module("peft")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPT = "a robot arm picks up the blue cup"
STEPS, GUIDANCE, SIZE = 2, 4.0, 32


def _transformer(model_dir: Path):
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

    return Cosmos3OmniTransformer.from_pretrained(model_dir / "transformer")


def build_lora(model_dir: Path, target: Path) -> Path:
    """A rank-4 adapter on the attention projections, diffusers layout (`transformer.` keys)."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    torch.manual_seed(4)
    transformer = _transformer(model_dir)
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                       target_modules=["to_q", "to_k", "to_v", "to_out"]))
    state = get_peft_model_state_dict(transformer)
    target.mkdir(parents=True)
    save_file({f"transformer.{k}": (v * 10 if "lora_B" in k else v).contiguous()
               for k, v in state.items()}, str(target / "pytorch_lora_weights.safetensors"))
    return target


def build_updated(model_dir: Path, target: Path) -> Path:
    generator = torch.Generator().manual_seed(5)
    transformer = _transformer(model_dir)
    with torch.no_grad():
        for param in transformer.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    transformer.save_pretrained(target / "transformer")
    return target


@pytest.fixture(scope="module")
def assets(cosmos3_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cosmos3-admin")
    return {"lora": build_lora(cosmos3_dir, root / "lora"),
            "updated": build_updated(cosmos3_dir, root / "updated")}


@pytest.fixture
def engine(cosmos3_dir, tmp_path) -> GenerationEngine:
    torch.set_num_threads(1)
    cfg = GenerationStageConfig(model_path=cosmos3_dir, output_dir=tmp_path / "out",
                                batch_wait_ms=0, max_running_requests=3)
    eng = GenerationEngine(cfg, ServerConfig())
    drain(eng)
    return eng


def drain(engine: GenerationEngine) -> None:
    for _ in range(500):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not go idle")


def image(rid: str, lora: list[LoraRef] = (), steps: int = STEPS, **kw) -> GenerateMedia:
    params = GenerationParams(prompt=PROMPT, width=SIZE, height=SIZE, num_frames=1,
                              num_inference_steps=steps, guidance_scale=GUIDANCE, seeds=[3],
                              fps=24.0, lora=list(lora), **kw)
    return GenerateMedia(request_id=rid, params=params, output_stem=rid, output_format="png")


def run(engine: GenerationEngine, msgs: list[GenerateMedia]) -> dict[str, object]:
    replies: dict[str, list] = {m.request_id: [] for m in msgs}
    for msg in msgs:
        engine.submit(msg, replies[msg.request_id].append)
    drain(engine)
    return {rid: items[-1] for rid, items in replies.items()}


def pixels(engine: GenerationEngine, result: GenerationResult) -> np.ndarray:
    data = (engine.output_dir / result.file_names[0]).read_bytes()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[None]


def reference(model_dir: Path, *, lora: tuple[Path, float] | None = None,
              transformer_dir: Path | None = None, steps: int = STEPS) -> np.ndarray:
    pipe = load_pipeline(model_dir, "float32", "cpu")
    if transformer_dir is not None:
        from safetensors.torch import load_file

        files = sorted(transformer_dir.glob("*.safetensors"))
        pipe.transformer.load_state_dict({k: v for f in files for k, v in load_file(f).items()})
    if lora is not None:
        pipe.transformer.load_lora_adapter(str(lora[0]), adapter_name="ref", prefix="transformer",
                                           weight_name="pytorch_lora_weights.safetensors")
        pipe.transformer.set_adapters(["ref"], weights=[lora[1]])
    out = pipe(prompt=PROMPT, negative_prompt="", fps=24.0, num_inference_steps=steps,
               guidance_scale=GUIDANCE, generator=torch.Generator("cpu").manual_seed(3),
               output_type="np", num_frames=1, height=SIZE, width=SIZE)
    return to_uint8(out.video)


def admin(engine: GenerationEngine, msg) -> dict:
    replies: list = []
    engine.submit(msg, replies.append)
    assert isinstance(replies[-1], AdminResult), replies
    return replies[-1].data


def test_per_request_lora_equals_a_fresh_pipeline_with_the_adapter(engine, cosmos3_dir, assets):
    loaded = admin(engine, LoraLoad(request_id="l", name="c", path=str(assets["lora"]),
                                    scale=0.7))
    assert loaded["loaded"]["components"] == ["transformer"]
    out = run(engine, [image("with", [LoraRef(name="c")]), image("base"),
                       image("half", [LoraRef(name="c", scale=0.35)])])
    with_lora = pixels(engine, out["with"])
    assert np.array_equal(with_lora, reference(cosmos3_dir, lora=(assets["lora"], 0.7)))
    assert np.array_equal(pixels(engine, out["half"]),
                          reference(cosmos3_dir, lora=(assets["lora"], 0.35)))
    base = pixels(engine, out["base"])
    assert np.array_equal(base, reference(cosmos3_dir))
    assert np.abs(with_lora.astype(int) - base.astype(int)).max() > 8


def test_an_action_run_uses_the_selected_adapter(engine, assets):
    admin(engine, LoraLoad(request_id="l", name="c", path=str(assets["lora"])))
    buf = io.BytesIO()
    Image.new("RGB", (56, 40), (90, 30, 200)).save(buf, "PNG")

    def action_run(rid: str, lora: list[LoraRef]) -> GenerateMedia:
        params = GenerationParams(
            prompt=PROMPT, width=0, height=0, num_frames=5, num_inference_steps=2,
            guidance_scale=1.0, seeds=[3], fps=24.0, condition_images=[buf.getvalue()],
            action=ActionCondition(mode="policy", chunk_size=4, domain_name="av",
                                   resolution_tier=256), lora=lora)
        return GenerateMedia(request_id=rid, params=params, output_stem=rid, output_format="none")

    out = run(engine, [action_run("base", []), action_run("lora", [LoraRef(name="c")])])
    again = run(engine, [action_run("base2", [])])
    values = {rid: np.frombuffer(r.actions[0].values, "<f4")
              for rid, r in {**out, **again}.items()}
    assert np.array_equal(values["base"], values["base2"])  # the adapter did not leak
    assert not np.allclose(values["base"], values["lora"])


def test_weight_update_and_model_info(engine, cosmos3_dir, assets):
    info = admin(engine, ModelInfoRequest(request_id="i"))
    assert info["family"] == "cosmos3" and info["pipeline"] == "Cosmos3OmniPipeline"
    assert info["sound"] is True and "actions" in info["tasks"] and "av" in info["action_domains"]
    assert info["lora"]["supported"] and info["weights_update"] and info["memory_release"]
    updated = admin(engine, WeightsUpdate(request_id="w", path=str(assets["updated"])))
    assert updated["tensors"]["transformer"] > 0
    out = run(engine, [image("new")])
    assert np.array_equal(pixels(engine, out["new"]), reference(
        cosmos3_dir, transformer_dir=assets["updated"] / "transformer"))


async def test_actions_route_takes_lora(engine, assets):
    from tests.unit.generation.test_cosmos3_api import action_request
    from tests.unit.generation.test_media_api import serve

    async for http in serve(engine):
        loaded = await http.post("/admin/lora/load", json={"name": "c",
                                                           "path": str(assets["lora"])})
        assert loaded.status_code == 200, loaded.text
        plain = await http.post("/v1/actions/generations", json=action_request(seed=1))
        styled = await http.post("/v1/actions/generations",
                                 json={**action_request(seed=1), "lora": {"name": "c"}})
        assert plain.status_code == 200 and styled.status_code == 200, styled.text
        a, b = (r.json()["data"][0]["action"]["values"] for r in (plain, styled))
        assert not np.allclose(np.array(a), np.array(b))
        unknown = await http.post("/v1/actions/generations",
                                  json={**action_request(), "lora": "nope"})
        assert unknown.status_code == 400 and "unknown LoRA adapter 'nope'" in unknown.text


def test_updates_while_a_row_is_mid_denoise_never_mix_models(engine, cosmos3_dir, assets):
    """A row past its first step (its understanding K/V recorded and replayed by the later
    steps) sees the first LoRA load (which PEFT makes active), then a weights update: it
    finishes exactly as the old base model would (the engine selects the row's own adapters
    before each of its phases; the update drains it first); the next request runs on the new
    weights."""
    replies: list = []
    engine.submit(image("job", steps=3), replies.append)
    while not any(isinstance(m, GenerationProgress) and m.steps_done >= 1 for m in replies):
        engine.step()
    admin(engine, LoraLoad(request_id="l", name="c", path=str(assets["lora"])))
    update: list = []
    engine.submit(WeightsUpdate(request_id="w", path=str(assets["updated"])), update.append)
    assert update == []  # it waits for the running row
    out = run(engine, [image("after")])
    assert isinstance(replies[-1], GenerationResult) and isinstance(update[-1], AdminResult)
    assert update[-1].data["running_requests"] == "finished on the old weights"
    assert np.array_equal(pixels(engine, replies[-1]), reference(cosmos3_dir, steps=3))
    assert np.array_equal(pixels(engine, out["after"]), reference(
        cosmos3_dir, transformer_dir=assets["updated"] / "transformer"))
