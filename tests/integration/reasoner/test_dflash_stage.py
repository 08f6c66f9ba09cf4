"""DFlash speculation in a real reasoner stage process: sessions answer as without speculation,
and a drafter directory that is no drafter stops the stage at startup, saying what was found."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from tests.unit.reasoner import tiny_vlm
from worldserve.config import ServerConfig
from worldserve.ipc.messages import CreateSession, ReasonerSampling, SessionFrame
from worldserve.models.dflash.dev import write_drafter_for
from worldserve.runtime.supervisor import StageStartError, Supervisor

SAMPLING = {"max_tokens": 8, "temperature": 0.9, "seed": 5}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vlm.build(tmp_path_factory.mktemp("dflash-stage"))


def _config(model_dir: Path, **streaming) -> ServerConfig:
    return ServerConfig.model_validate({"stages": {
        "generation": {"enabled": False}, "realtime": {"enabled": False},
        "reasoner": {"model_path": str(model_dir), "streaming": streaming}}})


async def _replies(config: ServerConfig) -> tuple[list[str], str | None]:
    supervisor = Supervisor(config)
    await supervisor.start()
    try:
        client = supervisor.clients["reasoner"]
        retention = msgspec.structs.replace(client.info.capabilities.retention,
                                            max_video_segments=2)
        await client.call(CreateSession(
            request_id="c", session_id="s", system_prompt="Watch.", question="What happens?",
            retention=retention,
            sampling=ReasonerSampling(**SAMPLING)), timeout_s=30)
        texts = []
        for i in range(3):
            result = await client.call(SessionFrame(
                request_id=f"f{i}", session_id="s", image=tiny_vlm.frame_bytes(i),
                received_at=time.time()), timeout_s=30)
            texts.append(result.text)
        return texts, client.info.capabilities.spec_method
    finally:
        await supervisor.stop()


def _plain_replies(model_dir: Path) -> list[str]:
    """The same frames on an in-process engine without speculation."""
    from tests.unit.reasoner.conftest import Driver
    from worldserve.config import ReasonerStageConfig
    from worldserve.engines.reasoner.engine import ReasonerEngine

    drv = Driver(ReasonerEngine(ReasonerStageConfig(model_path=model_dir), ServerConfig()))
    drv.create("s", retention={"max_video_segments": 2}, system_prompt="Watch.",
               question="What happens?",
               sampling=dict(SAMPLING))
    return [drv.frame("s", tiny_vlm.frame_bytes(i)).text for i in range(3)]


async def test_dflash_stage_replies_equal_plain_decoding(model_dir: Path, tmp_path: Path,
                                                         monkeypatch) -> None:
    monkeypatch.setenv("WORLDSERVE_TORCH_THREADS", "1")
    write_drafter_for(tmp_path, 0, model_dir)
    spec, method = await _replies(_config(model_dir, spec_method="dflash",
                                          spec_model_path=str(tmp_path)))
    assert method == "dflash"
    assert spec == _plain_replies(model_dir)


async def test_a_directory_that_is_no_drafter_stops_the_stage(model_dir: Path) -> None:
    supervisor = Supervisor(_config(model_dir, spec_method="dflash",
                                    spec_model_path=str(model_dir)))
    with pytest.raises(StageStartError, match="not a DFlash drafter directory: found "
                                              "config.json model_type='qwen2_5_vl'"):
        await supervisor.start()
    await supervisor.stop()
