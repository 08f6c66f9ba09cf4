from pathlib import Path

import pytest

from worldserve.config import ConfigError, ServerConfig, build_config, load_config


def test_defaults_enable_generation_reasoner_and_realtime() -> None:
    config = build_config({})
    assert list(config.stages.enabled()) == ["generation", "reasoner", "realtime"]
    assert config.host == "127.0.0.1" and config.port == 8000


def test_unknown_key_is_named_by_its_dotted_path() -> None:
    with pytest.raises(ConfigError, match=r"stages\.generation\.bogus: Extra inputs"):
        build_config({"stages": {"generation": {"bogus": 1}}})


def test_non_loopback_stage_host_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"stages\.generation\.server_args_overrides.*0\.0\.0\.0"):
        build_config({"stages": {"generation": {"server_args_overrides": {"host": "0.0.0.0"}}}})
    with pytest.raises(ConfigError, match=r"stages\.reasoner\.host"):
        build_config({"stages": {"reasoner": {"host": "10.1.2.3"}}})


@pytest.mark.parametrize("host", ["localhost", "::", "::1", "10.0.0.1"])
def test_override_host_must_be_exactly_127_0_0_1(host: str) -> None:
    with pytest.raises(ConfigError, match=f"server_args_overrides: host: .*{host!r}"):
        build_config({"stages": {"generation": {"server_args_overrides": {"host": host}}}})
    ok = build_config({"stages": {"generation": {"server_args_overrides": {"host": "127.0.0.1"}}}})
    assert ok.stages.generation.server_args_overrides["host"] == "127.0.0.1"


def test_loopback_hosts_are_accepted() -> None:
    config = build_config({"stages": {"generation": {"ipc": "tcp", "host": "::1"}}})
    assert config.stages.generation.host == "::1"


def test_overrides_apply_on_top_of_file_values(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("port: 9000\nstages:\n  generation:\n    max_batch_size: 2\n")
    config = load_config(path, {"port": 9100, "stages.generation.output_dir": "/tmp/out",
                                "host": None})
    assert config.port == 9100
    assert config.stages.generation.max_batch_size == 2
    assert config.stages.generation.output_dir == Path("/tmp/out")


def test_config_is_frozen() -> None:
    config = build_config({})
    with pytest.raises(Exception):
        config.port = 1  # type: ignore[misc]


@pytest.mark.parametrize("text, message", [
    ("port: [1, 2", "not valid YAML"),
    ("- a\n- b\n", "mapping at the top level"),
    ("port: banana\n", "port: Input should be a valid integer"),
])
def test_bad_files_give_one_clear_message(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_media_domains_are_split_and_lowercased() -> None:
    config = build_config({"allowed_media_domains": ["Example.COM,cdn.example.com", " x.org "]})
    assert config.allowed_media_domains == ["example.com", "cdn.example.com", "x.org"]


def test_streaming_environment_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSERVE_ENABLE_STREAMING", "false")
    assert build_config({}).stages.reasoner.streaming.enabled is False
    monkeypatch.setenv("WORLDSERVE_ENABLE_STREAMING", "1")
    assert build_config({}).stages.reasoner.streaming.enabled is True


def test_round_trips_through_json_for_stage_processes() -> None:
    config = build_config({"stages": {"generation": {"model_path": "/m"}}})
    assert ServerConfig.model_validate_json(config.model_dump_json()) == config


def test_colocating_the_reasoner_needs_the_generation_stage_on_the_same_device() -> None:
    stages = {"reasoner": {"colocate_with_generation": True}}
    assert build_config({"stages": stages}).stages.reasoner.colocate_with_generation
    with pytest.raises(ConfigError, match="colocate_with_generation needs the generation"):
        build_config({"stages": {**stages, "generation": {"enabled": False}}})
    with pytest.raises(ConfigError, match="needs one device"):
        build_config({"stages": {"reasoner": {"colocate_with_generation": True,
                                              "device": "cuda:0"}}})
