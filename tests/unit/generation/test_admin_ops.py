"""Operator operations in the generation engine on the tiny Wan pipeline (in-process): per-request
LoRA against fresh diffusers pipelines, interleaving of requests with different adapters, a job
across a pause, a LoRA load and a weight update, shape validation, memory release/resume."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.support.machine import require_module
from tests.unit.generation import admin_fixtures as fx
from worldserve.config import GenerationStageConfig, ServerConfig
from worldserve.engines.generation.engine import GenerationEngine
from worldserve.errors import Conflict, InvalidRequest, StageUnavailable
from worldserve.ipc.messages import (
    AdminResult,
    ErrorReply,
    GenerateActions,
    GenerateMedia,
    GenerationContinue,
    GenerationParams,
    GenerationPause,
    GenerationProgress,
    GenerationResult,
    LoraLoad,
    LoraRef,
    LoraUnload,
    MemoryRelease,
    MemoryResume,
    ModelInfoRequest,
    WeightsUpdate,
)

require_module("peft")


class Log:
    """Every reply in arrival order, and per request id."""

    def __init__(self) -> None:
        self.order: list[tuple[str, object]] = []

    def fn(self, rid: str):
        return lambda msg: self.order.append((rid, msg))

    def of(self, rid: str) -> list:
        return [m for r, m in self.order if r == rid]

    def last(self, rid: str):
        return self.of(rid)[-1]

    def index(self, rid: str, kind: type) -> int:
        return next(i for i, (r, m) in enumerate(self.order) if r == rid and isinstance(m, kind))


@pytest.fixture
def engine(tiny_wan_dir, tmp_path) -> GenerationEngine:
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, output_dir=tmp_path / "out",
                                batch_wait_ms=0)
    eng = GenerationEngine(cfg, ServerConfig())
    drain(eng)  # the background warmup request
    return eng


def drain(engine: GenerationEngine, max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine did not go idle")


def media(rid: str, seed: int = 7, lora: list[LoraRef] = (), steps: int = fx.STEPS,
          frames: int = 1) -> GenerateMedia:
    params = GenerationParams(prompt=fx.PROMPT, width=fx.SIZE, height=fx.SIZE,
                              num_frames=frames, num_inference_steps=steps, guidance_scale=1.0,
                              seeds=[seed], max_sequence_length=32, lora=list(lora))
    fmt = "png" if frames == 1 else "mp4"
    return GenerateMedia(request_id=rid, params=params, output_stem=rid, output_format=fmt)


def pixels(engine: GenerationEngine, result: GenerationResult) -> np.ndarray:
    data = (engine.output_dir / result.file_names[0]).read_bytes()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[None]


def admin(engine: GenerationEngine, msg, log: Log | None = None) -> dict:
    log = log or Log()
    engine.submit(msg, log.fn(msg.request_id))
    reply = log.last(msg.request_id)
    assert isinstance(reply, AdminResult), reply
    return reply.data


def load(engine, name: str, path, scale: float = 1.0) -> dict:
    return admin(engine, LoraLoad(request_id=f"load-{name}", name=name, path=str(path),
                                  scale=scale))


def test_interleaved_adapters_equal_fresh_pipelines(engine, tiny_wan_dir, admin_assets):
    load(engine, "a", admin_assets["lora_a"], scale=0.8)
    load(engine, "b", admin_assets["lora_b"])
    log = Log()
    requests = {"base": [], "a": [LoraRef(name="a")],
                "ab": [LoraRef(name="a", scale=0.5), LoraRef(name="b")]}
    for rid, lora in requests.items():
        engine.submit(media(rid, lora=lora), log.fn(rid))
    most_running = 0
    while engine.has_work():
        engine.step()
        most_running = max(most_running, len(engine.scheduler.running))
    assert most_running == 3  # different selections never share a batch; they interleave
    got = {rid: pixels(engine, log.last(rid)) for rid in requests}
    assert_same = fx.assert_close_uint8
    base = fx.reference(tiny_wan_dir, 7)
    assert_same(got["base"], base)
    assert_same(got["a"], fx.reference(tiny_wan_dir, 7,
                                       loras=[(admin_assets["lora_a"], "a", 0.8)]))
    assert_same(got["ab"], fx.reference(tiny_wan_dir, 7, loras=[
        (admin_assets["lora_a"], "a", 0.5), (admin_assets["lora_b"], "b", 1.0)]))
    assert fx.differ(got["a"], base) > 8 and fx.differ(got["ab"], got["a"]) > 8


def test_unload_restores_the_base_model(engine, tiny_wan_dir, admin_assets):
    load(engine, "a", admin_assets["lora_a"])
    assert admin(engine, LoraUnload(request_id="u", name="a"))["adapters"] == []
    log = Log()
    engine.submit(media("x"), log.fn("x"))
    drain(engine)
    fx.assert_close_uint8(pixels(engine, log.last("x")), fx.reference(tiny_wan_dir, 7))


def test_lora_refusals(engine, admin_assets, tmp_path):
    with pytest.raises(InvalidRequest, match="does not exist"):
        load(engine, "x", tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidRequest, match="no adapter weights"):
        load(engine, "x", tmp_path / "empty")
    with pytest.raises(InvalidRequest, match="cannot load LoRA 'x'"):  # a full checkpoint
        load(engine, "x", admin_assets["updated"] / "transformer")
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(InvalidRequest, match="cannot load LoRA 'x'"):
        load(engine, "x", tmp_path / "junk.safetensors")
    with pytest.raises(InvalidRequest, match="cannot read"):
        engine.runner.update_weights(str(tmp_path))  # the same junk file as weights
    assert engine.runner.list_lora() == []  # nothing half-loaded
    assert "x" not in (getattr(engine.pipe.transformer, "peft_config", None) or {})
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter 'nope'"):
        engine.submit(media("r", lora=[LoraRef(name="nope")]), Log().fn("r"))
    with pytest.raises(InvalidRequest, match="unknown LoRA adapter"):
        engine.submit(LoraUnload(request_id="u", name="nope"), Log().fn("u"))
    load(engine, "a", admin_assets["lora_a"])
    with pytest.raises(Conflict, match="already loaded"):
        load(engine, "a", admin_assets["lora_a"])
    engine.submit(media("q", lora=[LoraRef(name="a")]), Log().fn("q"))
    with pytest.raises(Conflict, match="selected by 1 queued or running"):
        engine.submit(LoraUnload(request_id="u", name="a"), Log().fn("u"))
    with pytest.raises(InvalidRequest, match="action head does not use LoRA"):
        engine.submit(GenerateActions(request_id="act", lora=[LoraRef(name="a")]), Log().fn("a"))
    drain(engine)


def test_job_across_pause_lora_load_and_weight_update(engine, tiny_wan_dir, admin_assets):
    log = Log()
    engine.submit(media("job", steps=4), log.fn("job"))
    while not any(isinstance(m, GenerationProgress) and m.steps_done >= 1 for m in log.of("job")):
        engine.step()
    admin(engine, GenerationPause(request_id="pause"))
    held = len(log.of("job"))
    for _ in range(5):  # paused: no phase runs, new requests queue
        assert not engine.has_work()
        engine.step()
    engine.submit(media("queued", seed=8, steps=4), log.fn("queued"))
    assert len(log.of("job")) == held and len(log.of("queued")) == 1  # accepted only
    load(engine, "b", admin_assets["lora_b"])  # at a step boundary, while the job holds
    admin(engine, GenerationContinue(request_id="continue"))
    update = WeightsUpdate(request_id="update", path=str(admin_assets["updated"]))
    engine.submit(update, log.fn("update"))
    assert log.of("update") == []  # waits for the running requests
    engine.submit(media("after", seed=9, steps=4), log.fn("after"))
    drain(engine)
    reply = log.last("update")
    assert isinstance(reply, AdminResult), reply
    assert reply.data["running_requests"] == "finished on the old weights"
    assert log.index("job", GenerationResult) < log.index("update", AdminResult)
    # The job that ran across it all finishes exactly as it would have, on the old weights,
    # without the adapter it did not select; the later ones run on the new weights.
    fx.assert_close_uint8(pixels(engine, log.last("job")), fx.reference(tiny_wan_dir, 7, steps=4))
    new = admin_assets["updated"] / "transformer"
    for rid, seed in (("queued", 8), ("after", 9)):
        fx.assert_close_uint8(pixels(engine, log.last(rid)),
                              fx.reference(tiny_wan_dir, seed, steps=4, transformer_dir=new))
    assert fx.differ(pixels(engine, log.last("after")),
                     fx.reference(tiny_wan_dir, 9, steps=4)) > 8


def test_weight_update_refuses_a_mismatch_before_touching_the_model(engine, tiny_wan_dir,
                                                                     admin_assets):
    expected = fx.first_mismatch(tiny_wan_dir, admin_assets["wrong"])
    log = Log()
    engine.submit(WeightsUpdate(request_id="w", path=str(admin_assets["wrong"])), log.fn("w"))
    reply = log.last("w")
    assert isinstance(reply, ErrorReply) and reply.code == "invalid_request"
    assert f"tensor '{expected}' has shape" in reply.message
    engine.submit(WeightsUpdate(request_id="m", path="/nonexistent"), log.fn("m"))
    assert "is not a directory" in log.last("m").message
    engine.submit(media("x"), log.fn("x"))  # still serving, on the weights it had
    drain(engine)
    fx.assert_close_uint8(pixels(engine, log.last("x")), fx.reference(tiny_wan_dir, 7))


def test_memory_release_and_resume(engine, tiny_wan_dir):
    log = Log()
    engine.submit(media("running"), log.fn("running"))
    engine.step()  # prepared: running
    engine.scheduler.batch_wait_s = 60  # keep the next one queued behind the release
    engine.submit(media("queued", seed=8), log.fn("queued"))
    engine.submit(MemoryRelease(request_id="rel"), log.fn("rel"))
    drain(engine)
    assert isinstance(log.last("running"), GenerationResult)  # running work finished first
    queued = log.last("queued")
    assert isinstance(queued, ErrorReply) and queued.code == "weights_released"
    assert "model weights released" in queued.message
    assert log.last("rel").data["failed_queued"] == 1
    assert engine.state() == "released"
    assert admin(engine, ModelInfoRequest(request_id="i"))["memory"] == "released"
    with pytest.raises(StageUnavailable, match="model weights released"):
        engine.submit(media("late"), log.fn("late"))
    assert admin(engine, MemoryResume(request_id="res"))["changed"] is True
    assert engine.state() == "ready"
    engine.scheduler.batch_wait_s = 0
    engine.submit(media("back"), log.fn("back"))
    drain(engine)
    fx.assert_close_uint8(pixels(engine, log.last("back")), fx.reference(tiny_wan_dir, 7))


def test_model_info(engine, admin_assets):
    load(engine, "a", admin_assets["lora_a"], scale=0.7)
    info = admin(engine, ModelInfoRequest(request_id="i"))
    assert info["family"] == "wan" and info["pipeline"] == "WanPipeline"
    assert info["tasks"] == ["images", "videos", "actions"]
    assert info["num_params"] == engine.num_params > 0
    assert info["dtype"] == "float32" and info["device"] == "cpu"
    assert info["lora"] == {"supported": True, "adapters": [
        {"name": "a", "path": str(admin_assets["lora_a"]), "scale": 0.7}]}
    assert info["memory"] == "resident" and info["paused"] is False


def test_weight_update_while_paused_with_running_requests_is_refused(engine, admin_assets):
    log = Log()
    engine.submit(media("job"), log.fn("job"))
    engine.step()  # prepared: running
    admin(engine, GenerationPause(request_id="p"))
    with pytest.raises(Conflict, match="continue generation first"):
        engine.submit(WeightsUpdate(request_id="w", path=str(admin_assets["updated"])),
                      log.fn("w"))
    admin(engine, GenerationContinue(request_id="c"))
    drain(engine)
    assert isinstance(log.last("job"), GenerationResult)
    assert log.of("w") == []


def test_transformer_level_loading_equals_the_pipeline_loader(engine, tiny_wan_dir,
                                                               admin_assets, tmp_path):
    """The path of families whose pipeline has no LoRA loader (Cosmos3): the transformer's own
    `load_lora_adapter`, from the diffusers layout and from the PEFT layout."""
    from safetensors.torch import load_file, save_file

    from worldserve.levers.lora import LoraAdapters

    engine.runner.lora = LoraAdapters(engine.pipe, via_pipeline=False)
    state = load_file(str(admin_assets["lora_a"] / "pytorch_lora_weights.safetensors"))
    peft_dir = tmp_path / "peft"
    peft_dir.mkdir()
    save_file({"base_model.model." + k.removeprefix("transformer."): v for k, v in state.items()},
              str(peft_dir / "adapter_model.safetensors"))
    assert load(engine, "a", admin_assets["lora_a"], 0.8)["loaded"]["components"] == [
        "transformer"]
    load(engine, "p", peft_dir, 0.8)
    log = Log()
    for rid, lora in (("a", [LoraRef(name="a")]), ("p", [LoraRef(name="p")]), ("base", [])):
        engine.submit(media(rid, lora=lora), log.fn(rid))
    drain(engine)
    expected = fx.reference(tiny_wan_dir, 7, loras=[(admin_assets["lora_a"], "a", 0.8)])
    fx.assert_close_uint8(pixels(engine, log.last("a")), expected)
    fx.assert_close_uint8(pixels(engine, log.last("p")), expected)
    fx.assert_close_uint8(pixels(engine, log.last("base")), fx.reference(tiny_wan_dir, 7))


def test_wan22_adapter_with_a_file_per_expert(tiny_wan_dir, admin_assets, tmp_path):
    model = fx.build_tiny_wan22(tiny_wan_dir, tmp_path / "wan22")
    cfg = GenerationStageConfig(model_path=model, output_dir=tmp_path / "out", batch_wait_ms=0)
    engine = GenerationEngine(cfg, ServerConfig())
    drain(engine)
    high, low = admin_assets["lora_a"], admin_assets["lora_b"]
    loaded = admin(engine, LoraLoad(request_id="l", name="x", path=str(high), path_2=str(low),
                                    scale=0.9))
    assert loaded["loaded"]["components"] == ["transformer", "transformer_2"]
    load(engine, "high_only", high, scale=0.9)
    log = Log()
    for rid, lora in (("both", [LoraRef(name="x")]), ("high", [LoraRef(name="high_only")]),
                      ("base", [])):
        engine.submit(media(rid, lora=lora, steps=4), log.fn(rid))
    drain(engine)
    both = pixels(engine, log.last("both"))
    fx.assert_close_uint8(both, fx.reference_two_experts(model, 7, "x", high, low, 0.9, 4))
    fx.assert_close_uint8(pixels(engine, log.last("high")),
                          fx.reference_two_experts(model, 7, "x", high, None, 0.9, 4))
    assert fx.differ(both, pixels(engine, log.last("high"))) > 2  # the low-noise file counts
    wan21 = GenerationEngine(GenerationStageConfig(
        model_path=tiny_wan_dir, output_dir=tmp_path / "out21", batch_wait_ms=0), ServerConfig())
    with pytest.raises(InvalidRequest, match="path_2 needs a model with a transformer_2"):
        admin(wan21, LoraLoad(request_id="m", name="y", path=str(high), path_2=str(low)))
