"""The supervisor applies the plan: each stage process starts with its GPUs in
CUDA_VISIBLE_DEVICES (counted within the server's own) and a config naming cuda:0 and the
planned dtype. The GPUs are synthetic (this machine has none); the spawn is intercepted."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from worldserve.config import ServerConfig
from worldserve.runtime import supervisor as supervisor_module
from worldserve.runtime.placement import GpuInfo, StageDemand, plan_placement
from worldserve.runtime.supervisor import StageStartError, Supervisor

GPUS = [GpuInfo(i, "H200", 140 << 30, (9, 0)) for i in range(2)]
CONFIG = {"stages": {"realtime": {"enabled": False},
                     "generation": {"model_path": "/m"}, "reasoner": {"model_path": "/m"}}}


class FakeProcess:
    pid = 4242
    returncode = None

    def __init__(self) -> None:
        self.stderr = asyncio.StreamReader()
        self.stderr.feed_eof()


def fake_plan(config: ServerConfig) -> tuple[Any, dict]:
    demands = [StageDemand("generation", "auto", "auto", {"BF16": 10}),
               StageDemand("reasoner", "auto", "auto", {"BF16": 10})]
    return plan_placement(GPUS, demands), {}


async def test_each_stage_process_gets_its_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "server_plan", fake_plan)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    envs: dict[str, dict[str, str]] = {}

    async def exec_stage(*args: str, **kwargs: Any) -> FakeProcess:
        envs[args[args.index("--stage") + 1]] = kwargs["env"]
        return FakeProcess()

    monkeypatch.setattr(asyncio, "create_subprocess_exec", exec_stage)
    supervisor = Supervisor(ServerConfig.model_validate(CONFIG))
    config_file = supervisor.run_dir / "config.json"
    config_file.write_text(await supervisor._place())
    try:
        for name, stage_config in supervisor.config.stages.enabled().items():
            stage = supervisor_module.StageProcess(name, stage_config, "ipc://x",
                                                   client=None)  # type: ignore[arg-type]
            await supervisor._spawn(stage, config_file)
            for task in stage.tasks:
                task.cancel()
    finally:
        shutil.rmtree(supervisor.run_dir)
    assert envs["generation"]["CUDA_VISIBLE_DEVICES"] == "4"
    assert envs["reasoner"]["CUDA_VISIBLE_DEVICES"] == "6"


async def test_the_stage_config_names_the_planned_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "server_plan", fake_plan)
    supervisor = Supervisor(ServerConfig.model_validate(CONFIG))
    try:
        stages = json.loads(await supervisor._place())["stages"]
    finally:
        shutil.rmtree(supervisor.run_dir)
    for name in ("generation", "reasoner"):
        assert (stages[name]["device"], stages[name]["dtype"]) == ("cuda:0", "bfloat16")
    assert supervisor.plan is not None and supervisor.plan.stages["reasoner"].gpus == (1,)


async def test_a_plan_with_a_problem_stops_before_any_spawn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_room(config: ServerConfig) -> tuple[Any, dict]:
        demand = [StageDemand("generation", "cuda:5", "auto", {"BF16": 10})]
        return plan_placement(GPUS, demand), {}

    monkeypatch.setattr(supervisor_module, "server_plan", no_room)
    supervisor = Supervisor(ServerConfig.model_validate(CONFIG))
    run_dir = supervisor.run_dir
    with pytest.raises(StageStartError, match=r"stages\.generation\.device is 'cuda:5'"):
        await supervisor.start()
    assert not supervisor.stages and not Path(run_dir).exists()
