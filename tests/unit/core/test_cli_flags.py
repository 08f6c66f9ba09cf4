"""The config flags of `worldserve serve` (worldserve/config/flags.py): every config key has
one flag or a written reason to be YAML-only, and each kind of flag reaches its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from worldserve import cli
from worldserve.config import ServerConfig
from worldserve.config.flags import (
    CHECK_FLAGS,
    SERVE_FLAGS,
    YAML_ONLY,
    ConfigFlag,
    default_text,
    field_of,
    help_text,
    yaml_only_pattern,
)


def leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the config tree; a section is one key when a flag sets it whole."""
    flagged = {key for flag in SERVE_FLAGS for key in flag.keys}
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = field.annotation
        if key not in flagged and isinstance(section, type) and issubclass(section, BaseModel):
            out += leaf_keys(section, f"{key}.")
        else:
            out.append(key)
    return out


def test_every_config_key_has_one_flag_or_a_reason_to_be_yaml_only() -> None:
    keys = leaf_keys(ServerConfig)
    flags_of = {key: [f.name for f in SERVE_FLAGS if key in f.keys] for key in keys}
    assert not [k for k in keys if len(flags_of[k]) > 1], "a key with two flags"
    neither = [k for k in keys if not flags_of[k] and yaml_only_pattern(k) is None]
    both = [k for k in keys if flags_of[k] and yaml_only_pattern(k) is not None]
    assert not neither, f"no flag and not listed in YAML_ONLY: {neither}"
    assert not both, f"a flag and listed in YAML_ONLY: {both}"


def test_flag_keys_and_yaml_only_patterns_name_real_keys() -> None:
    keys = leaf_keys(ServerConfig)
    for flag in SERVE_FLAGS:
        for key in flag.keys:
            field_of(key)  # KeyError when the key is not a config field
    used = {yaml_only_pattern(key) for key in keys}
    unused = [p for p in YAML_ONLY if p not in used]
    assert not unused, f"YAML_ONLY patterns matching no key: {unused}"
    assert all(len(why) > 10 for why in YAML_ONLY.values())


def test_flag_names_are_unique_and_check_takes_serve_s() -> None:
    names = [name for flag in SERVE_FLAGS for name in flag.name.split("/")]
    assert len(names) == len(set(names))
    assert set(CHECK_FLAGS) <= set(SERVE_FLAGS)


@pytest.mark.parametrize("flag", SERVE_FLAGS, ids=lambda flag: flag.name)
def test_help_comes_from_the_field(flag: ConfigFlag) -> None:
    text = help_text(flag)
    assert text.startswith(field_of(flag.keys[0]).description or "<none>")
    assert f"[default: {default_text(flag)}" in text


def served_value(served: list[ServerConfig], *args: str, key: str) -> Any:
    result = CliRunner().invoke(cli.app, ["serve", *args])
    assert result.exit_code == 0, result.output
    node: Any = served[-1]
    for name in key.split("."):
        node = getattr(node, name)
    return node


ROUND_TRIPS = [  # (arguments, key, value): one non-default value per kind of flag
    (["--compile"], "stages.generation.compile", True),  # bool, on
    (["--no-understanding-kv-reuse"], "stages.generation.understanding_kv_reuse", False),
    (["--no-access-log"], "access_log", False),
    (["--vae-decode-chunk-frames", "3"], "stages.generation.vae_decode_chunk_frames", 3),  # int
    (["--vae-tiling", "--vae-tile-size", "128", "--vae-tile-stride", "96"],
     "stages.generation.vae_tile_stride", 96),
    (["--step-cache-threshold", "0.25"], "stages.generation.step_cache.threshold", 0.25),
    (["--colocation-max-yield-ms", "12.5"], "stages.reasoner.colocation_max_yield_ms", 12.5),
    (["--step-cache-method", "taylorseer", "--step-cache-interval", "4"],  # Literal
     "stages.generation.step_cache.method", "taylorseer"),
    (["--colocation-yield", "steps"], "stages.reasoner.colocation_yield", "steps"),
    (["--dtype", "bfloat16"], "stages.realtime.dtype", "bfloat16"),
    (["--attention-backend", "_native_math"], "stages.generation.attention_backend",
     "_native_math"),
    (["--output-dir", "media/out"], "stages.generation.output_dir", Path("media/out")),  # path
    (["--allowed-media-domain", "A.example", "--allowed-media-domain", "b.example,c.example"],
     "allowed_media_domains", ["a.example", "b.example", "c.example"]),  # list
    (["--generation-parallel", "cfg=2"], "stages.generation.parallel.cfg", 2),  # section text
    (["--device", "cpu"], "stages.reasoner.device", "cpu"),  # one flag, every stage
]


@pytest.mark.parametrize(("args", "key", "value"), ROUND_TRIPS,
                         ids=[" ".join(args) for args, *_ in ROUND_TRIPS])
def test_flag_reaches_its_key(served: list[ServerConfig], args: list[str], key: str,
                              value: Any) -> None:
    default = served_value(served, key=key)
    assert default != value
    assert served_value(served, *args, key=key) == value


@pytest.mark.parametrize("flag", [f for f in SERVE_FLAGS if "/" in f.name],
                         ids=lambda flag: flag.name)
def test_each_bool_flag_turns_its_key_both_ways(served: list[ServerConfig],
                                                flag: ConfigFlag) -> None:
    on, off = flag.name.split("/")
    key = flag.keys[0]
    assert served_value(served, on, key=key) is True
    assert served_value(served, off, key=key) is False


def test_flag_wins_over_yaml_and_a_bad_value_names_the_key(served: list[ServerConfig],
                                                           tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("stages: {reasoner: {colocation_yield: steps}}\n")
    key = "stages.reasoner.colocation_yield"
    assert served_value(served, "--config", str(config), key=key) == "steps"
    assert served_value(served, "--config", str(config), "--colocation-yield", "blocks",
                        key=key) == "blocks"
    result = CliRunner().invoke(cli.app, ["serve", "--colocation-yield", "often"])
    assert result.exit_code == 2
    assert "stages.reasoner.colocation_yield" in result.output
