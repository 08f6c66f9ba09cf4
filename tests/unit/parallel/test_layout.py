"""Where each rank sits in a rank group, and how `stages.generation.parallel` is spelled and
refused."""

from __future__ import annotations

import pytest

from worldserve.config import ConfigError, load_config
from worldserve.levers.parallel.mesh import ParallelLayout, RankMesh

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def test_ranks_are_laid_out_cfg_ring_ulysses_with_ulysses_fastest():
    layout = ParallelLayout(cfg=2, ulysses=2, ring=2)
    assert layout.world_size == 8
    assert [layout.coords(r) for r in (0, 1, 2, 5, 7)] == [
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 1), (0, 1, 1, 1)]
    assert all(layout.rank_of(*layout.coords(r)) == r for r in range(8))
    # the sequence-parallel group of a cfg half, in chunk order (ring-major)
    assert layout.groups("sp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.groups("ulysses") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("ring") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.groups("cfg") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_shard_beyond_the_compute_ranks_adds_replicas():
    layout = ParallelLayout(cfg=2, shard=4)
    assert (layout.compute_ranks, layout.world_size, layout.replicas) == (2, 4, 2)
    assert layout.groups("cfg") == [[0, 1], [2, 3]]  # each replica splits cond / uncond
    assert layout.groups("shard") == [[0, 1, 2, 3]]
    mesh = RankMesh(layout, 3)
    assert (mesh.cfg.ranks, mesh.cfg.index, mesh.shard.index, mesh.sp.size) == ([2, 3], 1, 3, 1)


def test_the_flag_spelling_and_the_mapping_validate_alike():
    text = load_config(None, {"stages.generation.parallel": "cfg=2, ulysses=2"})
    mapping = load_config(None, {"stages.generation.parallel": {"cfg": 2, "ulysses": 2}})
    assert text.stages.generation.parallel == mapping.stages.generation.parallel
    assert text.stages.generation.parallel.world_size == 4
    assert load_config(None, {}).stages.generation.parallel.world_size == 1


@pytest.mark.parametrize("value, message", [
    ("cfg=3", "stages.generation.parallel.cfg"),
    ("heads=2", "'heads=2' is not AXIS=N"),
    ("cfg=2,shard=3", "one must be a multiple of the other"),
    ("ulysses=two", "stages.generation.parallel.ulysses"),
])
def test_bad_layouts_are_refused_naming_the_setting(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"stages.generation.parallel": value})


def test_ulysses_must_divide_the_attention_heads(cosmos3_dir):
    from worldserve.models.cosmos3.parallel import load_rank_runner

    with pytest.raises(ValueError, match="ulysses=4 must divide the transformer's 2 attention"):
        load_rank_runner(cosmos3_dir, rank=0, layout=ParallelLayout(ulysses=4))


def test_a_family_without_rank_groups_is_refused_before_anything_starts(tmp_path):
    from worldserve.config import GenerationStageConfig
    from worldserve.ranks.runner import start_rank_runner

    (tmp_path / "model_index.json").write_text('{"_class_name": "WanPipeline"}')
    config = GenerationStageConfig(model_path=tmp_path, parallel="cfg=2")
    with pytest.raises(ValueError, match="is a wan model; rank groups run cosmos3 models"):
        start_rank_runner(config, tmp_path)


def test_the_serve_flag_reaches_the_stage_config_and_refuses_bad_layouts(monkeypatch):
    from typing import Any

    from typer.testing import CliRunner

    from worldserve import cli

    seen: list[Any] = []

    async def fake_serve(cfg: Any, key: Any) -> int:  # stop at the boundary: no server
        seen.append(cfg)
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli, "_fill_dev_model_paths", lambda cfg: cfg)
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["serve", "--generation-parallel", "cfg=2,ring=2,shard=4"])
    assert ok.exit_code == 0, ok.output
    parallel = seen[0].stages.generation.parallel
    assert (parallel.cfg, parallel.ring, parallel.shard, parallel.world_size) == (2, 2, 4, 4)
    bad = runner.invoke(cli.app, ["serve", "--generation-parallel", "cfg=2,shard=3"])
    assert bad.exit_code == 2 and "one must be a multiple of the other" in bad.output
