"""`worldserve serve` flags for the NIM settings: each flag reaches its config key and wins
over the NIM variable; a malformed variable stops startup with a message naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from worldserve import cli
from worldserve.config import ServerConfig

FLAGS = [  # flag, value, attribute of stages.reasoner.streaming (or the reasoner stage)
    ("--streaming-max-sessions", "5", "max_sessions", 5),
    ("--streaming-max-video-segments", "4", "max_video_segments", 4),
    ("--streaming-idle-timeout-s", "30", "idle_timeout_s", 30.0),
    ("--streaming-rest-idle-timeout-s", "7", "rest_idle_timeout_s", 7.0),
    ("--streaming-frame-timeout-s", "9", "frame_timeout_s", 9.0),
    ("--streaming-image-budget", "99", "image_budget", 99),
    ("--streaming-encoder-capacity", "40", "encoder_capacity", 40),
    ("--streaming-spec-method", "ngram", "spec_method", "ngram"),
    ("--streaming-spec-num-tokens", "6", "spec_num_tokens", 6),
    ("--streaming-spec-model-path", "/drafters/d1", "spec_model_path", Path("/drafters/d1")),
]


def _serve(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli.app, ["serve", *args], env=env)


@pytest.mark.parametrize(("flag", "raw", "attr", "value"), FLAGS)
def test_flag_sets_its_key(served: list[ServerConfig], flag: str, raw: str, attr: str,
                           value: object) -> None:
    result = _serve(flag, raw)
    assert result.exit_code == 0, result.output
    assert getattr(served[0].stages.reasoner.streaming, attr) == value


def test_enable_streaming_flag_wins_over_nim_variable(served: list[ServerConfig]) -> None:
    assert _serve("--enable-streaming", env={"NIM_ENABLE_STREAMING": "false"}).exit_code == 0
    assert _serve(env={"NIM_ENABLE_STREAMING": "false"}).exit_code == 0
    assert _serve("--disable-streaming").exit_code == 0
    assert [c.stages.reasoner.streaming.enabled for c in served] == [True, False, False]


def test_max_sessions_flag_wins_over_nim_variable(served: list[ServerConfig]) -> None:
    env = {"NIM_STREAMING_MAX_SESSIONS": "4"}
    assert _serve("--streaming-max-sessions", "6", env=env).exit_code == 0
    assert _serve(env=env).exit_code == 0
    assert [c.stages.reasoner.streaming.max_sessions for c in served] == [6, 4]


def test_reasoner_flags(served: list[ServerConfig]) -> None:
    result = _serve("--guided-decoding-backend", "llguidance", "--reasoner-model-name", "cosmos")
    assert result.exit_code == 0, result.output
    assert served[0].stages.reasoner.served_model_name == "cosmos"


@pytest.mark.parametrize("args", [
    ("--served-model-name", "a/one", "b/two", "c", "--port", "0"),
    ("--served-model-name=a/one", "b/two", "--served-model-name", "c"),
])
def test_served_model_name_takes_several_names_after_one_flag(
        served: list[ServerConfig], args: tuple[str, ...]) -> None:
    result = _serve(*args, "--reasoner-model-name", "own")
    assert result.exit_code == 0, result.output
    config = served[0]
    assert config.served_model_names == ["a/one", "b/two", "c"]
    # The first is every stage's listed id; a stage's own name wins.
    assert config.stages.generation.served_model_name == "a/one"
    assert config.stages.realtime.served_model_name == "a/one"
    assert config.stages.reasoner.served_model_name == "own"


def test_malformed_variable_is_a_startup_error(served: list[ServerConfig]) -> None:
    result = _serve(env={"NIM_STREAMING_MAX_VIDEO_SEGMENTS": "eight"})
    assert result.exit_code == 2 and not served
    assert "NIM_STREAMING_MAX_VIDEO_SEGMENTS='eight': expected an integer" in result.output


def test_help_lists_the_nim_flags_in_their_own_panel() -> None:
    result = CliRunner().invoke(cli.app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "Live video reasoning (NIM settings" in result.output
    for flag, *_ in FLAGS:
        assert flag in result.output
    for name in ("--enable-streaming", "--disable-streaming", "--guided-decoding-backend",
                 "NIM_STREAMING_REST_IDLE_TIMEOUT_S", "--reasoner-model-name"):
        assert name in result.output


def test_dflash_flag_without_a_drafter_stops_startup_naming_the_setting(
        served: list[ServerConfig]) -> None:
    result = _serve("--streaming-spec-method", "dflash")
    assert result.exit_code != 0 and not served
    assert "spec_model_path" in result.output
    ok = _serve("--streaming-spec-method", "dflash", "--streaming-spec-model-path", "/d")
    assert ok.exit_code == 0, ok.output
    assert served[0].stages.reasoner.streaming.spec_method == "dflash"


def test_no_access_log_flag_wins_over_the_config_file(served: list[ServerConfig],
                                                      tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("access_log: true\n")
    assert _serve("--config", str(config)).exit_code == 0
    assert _serve("--config", str(config), "--no-access-log").exit_code == 0
    assert _serve().exit_code == 0
    assert [c.access_log for c in served] == [True, False, True]


def test_api_key_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    api_keys: list[str | None] = []

    async def fake_serve(cfg: ServerConfig, keys: cli.AccessKeys) -> int:
        api_keys.append(keys.api)
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    monkeypatch.setattr(cli, "_fill_dev_model_paths", lambda cfg: cfg)
    assert _serve("--api-key", "k1", env={"WORLDSERVE_API_KEY": "k2"}).exit_code == 0
    assert _serve(env={"WORLDSERVE_API_KEY": "k2"}).exit_code == 0
    assert _serve(env={"WORLDSERVE_API_KEY": ""}).exit_code == 0
    assert api_keys == ["k1", "k2", None]


def test_server_paths_are_hidden_unless_asked(served: list[ServerConfig]) -> None:
    assert _serve().exit_code == 0
    assert _serve("--show-server-paths").exit_code == 0
    assert [c.show_server_paths for c in served] == [False, True]
