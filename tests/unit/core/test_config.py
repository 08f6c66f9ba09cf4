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
NIM_ROWS = [  # spec streaming-reasoning.md section 2: variable, raw value, config attribute, value
    ("NIM_ENABLE_STREAMING", "false", "enabled", False),
    ("NIM_STREAMING_MAX_SESSIONS", "5", "max_sessions", 5),
    ("NIM_STREAMING_MAX_VIDEO_SEGMENTS", "4", "max_video_segments", 4),
    ("NIM_STREAMING_IDLE_TIMEOUT_S", "30.5", "idle_timeout_s", 30.5),
    ("NIM_STREAMING_REST_IDLE_TIMEOUT_S", "7", "rest_idle_timeout_s", 7.0),
    ("NIM_MAX_IMAGES_PER_PROMPT", "64", "image_budget", 64),
    ("NIM_STREAMING_SPEC_METHOD", "ngram", "spec_method", "ngram"),
    ("NIM_STREAMING_SPEC_NUM_TOKENS", "5", "spec_num_tokens", 5),
]


@pytest.mark.parametrize(("variable", "raw", "attr", "value"), NIM_ROWS)
def test_every_nim_variable_sets_its_key(monkeypatch: pytest.MonkeyPatch, variable: str,
                                         raw: str, attr: str, value: object) -> None:
    assert getattr(build_config({}).stages.reasoner.streaming, attr) != value
    monkeypatch.setenv(variable, raw)
    assert getattr(build_config({}).stages.reasoner.streaming, attr) == value


def test_guided_decoding_backend_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIM_GUIDED_DECODING_BACKEND", "LLGuidance")
    assert build_config({}).stages.reasoner.guided_decoding_backend == "llguidance"
    monkeypatch.setenv("NIM_GUIDED_DECODING_BACKEND", "xgrammar")
    with pytest.raises(ConfigError, match=r"guided_decoding_backend: .*'xgrammar' needs the "
                                          r"NIM's vllm backend.*\(from \$NIM_GUIDED_DECODING"):
        build_config({})


def test_precedence_is_flag_then_environment_then_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    yaml_tree = {"stages": {"reasoner": {"streaming": {"max_sessions": 3}}}}
    key = "stages.reasoner.streaming.max_sessions"
    assert build_config(yaml_tree).stages.reasoner.streaming.max_sessions == 3
    monkeypatch.setenv("NIM_STREAMING_MAX_SESSIONS", "4")
    assert build_config(yaml_tree).stages.reasoner.streaming.max_sessions == 4
    assert build_config(yaml_tree, {key: 6}).stages.reasoner.streaming.max_sessions == 6
    assert build_config(yaml_tree, {key: None}).stages.reasoner.streaming.max_sessions == 4


def test_worldserve_variable_wins_over_its_nim_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIM_ENABLE_STREAMING", "false")
    monkeypatch.setenv("WORLDSERVE_ENABLE_STREAMING", "true")
    assert build_config({}).stages.reasoner.streaming.enabled is True


@pytest.mark.parametrize(("variable", "raw", "message"), [
    ("NIM_ENABLE_STREAMING", "maybe", "NIM_ENABLE_STREAMING='maybe': expected true or false"),
    ("NIM_STREAMING_MAX_SESSIONS", "two", "NIM_STREAMING_MAX_SESSIONS='two': expected an int"),
    ("NIM_STREAMING_IDLE_TIMEOUT_S", "soon", "NIM_STREAMING_IDLE_TIMEOUT_S='soon': expected a"),
    ("NIM_STREAMING_MAX_SESSIONS", "0", "max_sessions: .*(from $NIM_STREAMING_MAX_SESSIONS)"),
    ("NIM_STREAMING_SPEC_METHOD", "dflash",
     "spec_method: .*streaming.spec_model_path.*(from $NIM_STREAMING_SPEC_METHOD)"),
    ("NIM_STREAMING_SPEC_METHOD", "eagle", "spec_method: .*(from $NIM_STREAMING_SPEC_METHOD)"),
])
def test_malformed_variable_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                  variable: str, raw: str, message: str) -> None:
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigError) as err:
        build_config({})
    parts = message.split(".*")
    assert all(part in str(err.value) for part in parts), str(err.value)


@pytest.mark.parametrize(("raw", "value"), [("0", 1), ("-4", 1), ("many", 3), ("2", 2)])
def test_spec_num_tokens_follows_the_nim_rule(monkeypatch: pytest.MonkeyPatch, raw: str,
                                              value: int) -> None:
    # spec section 2 [C]: values < 1 become 1; a non-integer falls back to 3
    monkeypatch.setenv("NIM_STREAMING_SPEC_NUM_TOKENS", raw)
    assert build_config({}).stages.reasoner.streaming.spec_num_tokens == value


def test_seed_spelling_of_warmup_equals_the_fields() -> None:
    seed = build_config({"stages": {"generation": {"server_args_overrides": {
        "warmup_mode": "server", "warmup_resolutions": ["64x48"], "host": "127.0.0.1"}}}})
    fields = build_config({"stages": {"generation": {
        "warmup_mode": "server", "warmup_resolutions": ["64x48"],
        "server_args_overrides": {"host": "127.0.0.1"}}}})
    assert seed == fields
    assert seed.stages.generation.warmup_mode == "server"
    assert seed.stages.generation.warmup_resolutions == ["64x48"]
    # the stage processes get the same config back from JSON
    assert ServerConfig.model_validate_json(seed.model_dump_json()) == seed


def test_warmup_overrides_reach_reasoner_and_realtime() -> None:
    config = build_config({"stages": {
        "reasoner": {"server_args_overrides": {"warmup_mode": "server"}},
        "realtime": {"server_args_overrides": {"warmup_mode": "server",
                                               "warmup_resolutions": ["64x64"]}}}})
    assert config.stages.reasoner.warmup_mode == "server"
    assert config.stages.realtime.warmup_mode == "server"
    assert config.stages.realtime.warmup_sizes == ["64x64"]


def test_warmup_override_that_disagrees_with_the_field_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"stages\.generation: server_args_overrides\."
                                          r"warmup_mode='server' disagrees with warmup_mode"):
        build_config({"stages": {"generation": {
            "warmup_mode": "off", "server_args_overrides": {"warmup_mode": "server"}}}})


def test_factory_output_dir_is_the_output_dir(tmp_path: Path) -> None:
    out = str(tmp_path / "media")
    config = build_config({"stages": {"generation": {"factory": {"output_dir": out}}}})
    assert config.stages.generation.output_dir == Path(out)
    # --output-dir (an explicit output_dir) wins over the seed's spelling
    flag = build_config({"stages": {"generation": {"factory": {"output_dir": out}}}},
                        {"stages.generation.output_dir": "/srv/out"})
    assert flag.stages.generation.output_dir == Path("/srv/out")
    with pytest.raises(ConfigError, match=r"factory\.workers: not a setting worldserve acts on"):
        build_config({"stages": {"generation": {"factory": {"workers": 2}}}})


@pytest.mark.parametrize(("stage", "overrides", "message"), [
    ("generation", {"warmup_steps_native": 3},
     "stages.generation: server_args_overrides.warmup_steps_native: not a setting worldserve "
     "acts on (known: attention_backend, enable_torch_compile, host, warmup_mode, "
     "warmup_resolutions)"),
    ("reasoner", {"warmup_resolutions": ["64x64"]},
     "server_args_overrides.warmup_resolutions: not a setting worldserve acts on"),
    ("generation", {"gpu_ids": [0]}, "server_args_overrides.gpu_ids: worldserve sets this"),
    ("realtime", {"fake_forward_ms": 5},
     "server_args_overrides.fake_forward_ms: only the fake backend reads it"),
])
def test_unknown_override_key_is_a_startup_error(stage: str, overrides: dict,
                                                  message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"stages": {stage: {"server_args_overrides": overrides}}})
    assert message in str(err.value)


def test_fake_realtime_knobs_are_accepted_with_the_fake_backend() -> None:
    config = build_config({"stages": {"realtime": {
        "backend": "fake", "server_args_overrides": {"fake_forward_ms": 5}}}})
    assert config.stages.realtime.server_args_overrides == {"fake_forward_ms": 5}


def test_device_and_dtype_default_to_auto_and_take_yaml_per_stage() -> None:
    config = build_config({"stages": {"reasoner": {"device": "cuda:1", "dtype": "float16"}}})
    assert (config.stages.generation.device, config.stages.generation.dtype) == ("auto", "auto")
    assert (config.stages.reasoner.device, config.stages.reasoner.dtype) == ("cuda:1", "float16")
    with pytest.raises(ConfigError, match=r"stages\.realtime\.device: device 'cuda:x' is not "
                                          r"one of auto, cpu, cuda, cuda:N"):
        build_config({"stages": {"realtime": {"device": "cuda:x"}}})
    with pytest.raises(ConfigError, match=r"stages\.generation\.dtype"):
        build_config({"stages": {"generation": {"dtype": "float64"}}})


def test_device_and_dtype_variables_set_every_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLDSERVE_DEVICE", "CPU")
    monkeypatch.setenv("WORLDSERVE_DTYPE", "bfloat16")
    config = build_config({"stages": {"reasoner": {"device": "cuda:1"}}})
    for stage in (config.stages.generation, config.stages.reasoner, config.stages.realtime):
        assert (stage.device, stage.dtype) == ("cpu", "bfloat16")
    flagged = build_config({}, {"stages.generation.device": "cuda:2"})  # a flag wins
    assert (flagged.stages.generation.device, flagged.stages.reasoner.device) == ("cuda:2", "cpu")
    monkeypatch.setenv("WORLDSERVE_DEVICE", "tpu")
    with pytest.raises(ConfigError, match=r"device 'tpu' is not one of .*\(from "
                                          r"\$WORLDSERVE_DEVICE\)"):
        build_config({})
