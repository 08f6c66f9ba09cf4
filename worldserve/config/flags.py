"""The command-line flags made from config fields, in one place.

`SERVE_FLAGS` names each flag and the dotted config key(s) it sets; everything else comes from
the field: the value type (bool -> an on/off pair, Literal -> its choices, Path, list ->
repeatable), the help (the field's description), the environment variable that also sets the
key (envs.py) and the default. A flag left out keeps its value None, so that
`flag_overrides` hands `load_config` only what was typed (flag > environment > YAML >
default). Fields without a flag are listed in `YAML_ONLY` with the reason; a unit test keeps
the two lists covering the whole tree, each key once.

Imported by the CLI only: stage processes read the config without typer.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from typer.core import TyperCommand

from worldserve import envs
from worldserve.config.server import ServerConfig

STAGES = ("generation", "reasoner", "realtime")
DEVICES_PANEL = "Devices and placement (docs/hardware.md, docs/parallel.md)"
GENERATION_PANEL = "Generation speed on one device (docs/generation.md)"
REASONER_PANEL = "Reasoner decode and colocation (docs/reasoner-engine.md)"
NIM_PANEL = "Live video reasoning (NIM settings; each flag wins over its NIM_* variable)"
STREAMING = "stages.reasoner.streaming"
GENERATION = "stages.generation"


@dataclass(frozen=True)
class ConfigFlag:
    """One flag: its name (`--x`, or `--on/--off` for a bool) and the config keys it sets (one,
    or the same field of every stage)."""

    name: str
    keys: tuple[str, ...]
    panel: str | None = None
    # What a None default means, where "none" would not say it.
    default_text: str | None = None

    @property
    def param(self) -> str:
        """The Python parameter name typer hands the value under."""
        return self.name.split("/")[0].removeprefix("--").replace("-", "_")


def _flag(name: str, key: str, panel: str | None = None, default: str | None = None) -> ConfigFlag:
    return ConfigFlag(name, (key,), panel, default)


def _every_stage(name: str, field: str, panel: str) -> ConfigFlag:
    return ConfigFlag(name, tuple(f"stages.{stage}.{field}" for stage in STAGES), panel)


SERVE_FLAGS: tuple[ConfigFlag, ...] = (
    _flag("--host", "host"),
    _flag("--port", "port"),
    _flag("--output-dir", f"{GENERATION}.output_dir"),
    _flag("--allowed-local-media-path", "allowed_local_media_path"),
    _flag("--allowed-media-domain", "allowed_media_domains"),
    _flag("--log-level", "log_level"),
    _flag("--access-log/--no-access-log", "access_log"),
    _flag("--output-ttl", "output_ttl_s"),
    _flag("--max-job-records", "max_job_records"),
    _flag("--max-upload-bytes", "max_upload_bytes"),
    _flag("--public-url", "public_url", default="the request's scheme and host"),
    _flag("--forwarded-allow-ips", "forwarded_allow_ips"),
    _flag("--show-server-paths", "show_server_paths"),
    _flag("--served-model-name", "served_model_names", default="each stage's model"),
    _every_stage("--device", "device", DEVICES_PANEL),
    _every_stage("--dtype", "dtype", DEVICES_PANEL),
    _flag("--generation-parallel", f"{GENERATION}.parallel", DEVICES_PANEL,
          default="cfg=1,ulysses=1,ring=1,shard=1 (one process)"),
    _flag("--attention-backend", f"{GENERATION}.attention_backend", GENERATION_PANEL),
    _flag("--compile/--no-compile", f"{GENERATION}.compile", GENERATION_PANEL),
    _flag("--understanding-kv-reuse/--no-understanding-kv-reuse",
          f"{GENERATION}.understanding_kv_reuse", GENERATION_PANEL),
    _flag("--step-cache/--no-step-cache", f"{GENERATION}.step_cache.enabled", GENERATION_PANEL),
    _flag("--step-cache-method", f"{GENERATION}.step_cache.method", GENERATION_PANEL),
    _flag("--step-cache-threshold", f"{GENERATION}.step_cache.threshold", GENERATION_PANEL,
          default="the method's own"),
    _flag("--step-cache-interval", f"{GENERATION}.step_cache.interval", GENERATION_PANEL,
          default="the method's own"),
    _flag("--step-cache-default/--no-step-cache-default", f"{GENERATION}.step_cache.default",
          GENERATION_PANEL),
    _flag("--vae-tiling/--no-vae-tiling", f"{GENERATION}.vae_tiling", GENERATION_PANEL),
    _flag("--vae-tile-size", f"{GENERATION}.vae_tile_size", GENERATION_PANEL,
          default="the VAE's own (256)"),
    _flag("--vae-tile-stride", f"{GENERATION}.vae_tile_stride", GENERATION_PANEL,
          default="the VAE's own (192)"),
    _flag("--vae-decode-chunk-frames", f"{GENERATION}.vae_decode_chunk_frames",
          GENERATION_PANEL),
    _flag("--reasoner-batch-decode/--no-reasoner-batch-decode", "stages.reasoner.batch_decode",
          REASONER_PANEL),
    _flag("--reasoner-static-decode/--no-reasoner-static-decode",
          "stages.reasoner.static_decode", REASONER_PANEL),
    _flag("--reasoner-compile-decode/--no-reasoner-compile-decode",
          "stages.reasoner.compile_decode", REASONER_PANEL),
    _flag("--reasoner-cuda-graphs/--no-reasoner-cuda-graphs",
          "stages.reasoner.cuda_graphs", REASONER_PANEL),
    _flag("--colocate-with-generation/--no-colocate-with-generation",
          "stages.reasoner.colocate_with_generation", REASONER_PANEL),
    _flag("--colocation-yield", "stages.reasoner.colocation_yield", REASONER_PANEL),
    _flag("--colocation-max-yield-ms", "stages.reasoner.colocation_max_yield_ms",
          REASONER_PANEL),
    _flag("--enable-streaming/--disable-streaming", f"{STREAMING}.enabled", NIM_PANEL),
    _flag("--streaming-max-sessions", f"{STREAMING}.max_sessions", NIM_PANEL),
    _flag("--streaming-max-video-segments", f"{STREAMING}.max_video_segments", NIM_PANEL),
    _flag("--streaming-idle-timeout-s", f"{STREAMING}.idle_timeout_s", NIM_PANEL),
    _flag("--streaming-rest-idle-timeout-s", f"{STREAMING}.rest_idle_timeout_s", NIM_PANEL),
    _flag("--streaming-frame-timeout-s", f"{STREAMING}.frame_timeout_s", NIM_PANEL),
    _flag("--streaming-image-budget", f"{STREAMING}.image_budget", NIM_PANEL,
          default="2 x sessions x segments"),
    _flag("--streaming-encoder-capacity", f"{STREAMING}.encoder_capacity", NIM_PANEL,
          default="the image budget"),
    _flag("--streaming-spec-method", f"{STREAMING}.spec_method", NIM_PANEL,
          default="dflash when a drafter is given, else none"),
    _flag("--streaming-spec-model-path", f"{STREAMING}.spec_model_path", NIM_PANEL),
    _flag("--streaming-spec-num-tokens", f"{STREAMING}.spec_num_tokens", NIM_PANEL),
    _flag("--guided-decoding-backend", "stages.reasoner.guided_decoding_backend", NIM_PANEL),
    _flag("--reasoner-model-name", "stages.reasoner.served_model_name", NIM_PANEL,
          default="the model path"),
    _flag("--nim-runtime", "nim_runtime", NIM_PANEL,
          default="the reasoner when enabled, else the generator"),
)
# List flags that also take several values after one flag, as vLLM and SGLang spell them
# (`--served-model-name A B`): PanelledCommand repeats the flag for each value.
MULTI_VALUE_FLAGS = frozenset({"--served-model-name"})
# `worldserve check`: what decides the placement plan.
CHECK_FLAGS: tuple[ConfigFlag, ...] = tuple(
    flag for flag in SERVE_FLAGS if flag.panel == DEVICES_PANEL)

_PER_STAGE = "differs per stage (one flag would set every stage's); YAML stages.<stage>."
_TUNING = "deployment tuning with a sound default; YAML"
_FAKE = "test knob of the fake backend (protocol tests); YAML"
# Config keys without a flag ("*": every stage), and why.
YAML_ONLY: dict[str, str] = {
    "stages.*.enabled": _PER_STAGE + "enabled",
    "stages.*.model_path": "--model-path sets the paths of the stages a model directory "
                           "serves; YAML for one stage's own",
    "stages.generation.served_model_name": _PER_STAGE + "served_model_name",
    "stages.realtime.served_model_name": _PER_STAGE + "served_model_name",
    "stages.*.warmup_mode": _PER_STAGE + "warmup_mode",
    "stages.*.start_timeout_s": "$WORLDSERVE_STAGE_START_TIMEOUT_S sets every stage's",
    "stages.*.ipc": "stage socket plumbing, derived per server; YAML",
    "stages.*.host": "stage socket plumbing (loopback only); YAML",
    "stages.*.server_args_overrides": "SGLang's server_args spelling, a YAML mapping",
    "stages.*.fp8_compute": "a family without FP8 support refuses it, so one flag for every "
                            "stage would stop mixed servers; YAML per stage",
    "stages.*.backend": "fake backends exist for tests; YAML",
    "stages.generation.max_batch_size": _TUNING,
    "stages.generation.batch_wait_ms": _TUNING,
    "stages.generation.max_running_requests": _TUNING,
    "stages.generation.warmup_steps": _TUNING,
    "stages.generation.warmup_resolutions": "a list of sizes beside warmup_mode; YAML",
    "stages.generation.prompt_enhancer": "an optional model directory of its own; YAML",
    "stages.generation.max_in_flight": _TUNING,
    "stages.generation.request_timeout_s": _TUNING,
    "stages.generation.video_cancel_timeout_s": _TUNING,
    "stages.generation.hide_file_paths": "a response-shape policy; YAML",
    "stages.generation.safety_checker": "needs the cosmos_guardrail package; YAML",
    f"{STREAMING}.max_session_tokens": _TUNING,
    f"{STREAMING}.reaper_interval_s": _TUNING,
    "stages.reasoner.max_model_len": _TUNING,
    "stages.reasoner.max_prefill_tokens": _TUNING,
    "stages.reasoner.fake_delay_ms": _FAKE,
    "stages.reasoner.fake_load_delay_s": _FAKE,
    "stages.reasoner.fake_hang_on_frame": _FAKE,
    "stages.reasoner.fake_fail_on_frame": _FAKE,
    "stages.reasoner.fake_streaming": _FAKE,
    **{f"stages.realtime.{name}": _TUNING for name in (
        "max_sessions", "admission_wait_s", "max_sessions_per_user", "idle_timeout_s",
        "max_lifetime_s", "init_timeout_s", "chunk_timeout_s", "kv_budget_gib",
        "max_inference_steps", "max_width", "max_height", "session_table_margin")},
    **{f"stages.realtime.{name}": "the checkpoint's realtime_config.json gives it; YAML to "
                                  "override" for name in (
        "sink_frames", "window_frames", "frames_per_block", "num_inference_steps",
        "warmup_sizes")},
}


def yaml_only_pattern(key: str) -> str | None:
    """The YAML_ONLY entry that names `key` (`*`: any one stage), None when none does."""
    names = key.split(".")
    for pattern in YAML_ONLY:
        parts = pattern.split(".")
        if len(parts) == len(names) and all(p in ("*", n) for p, n in zip(parts, names)):
            return pattern
    return None


def field_of(dotted: str, model: type[BaseModel] = ServerConfig) -> FieldInfo:
    """The pydantic field a dotted key names (KeyError when there is none)."""
    *parents, leaf = dotted.split(".")
    for name in parents:
        model = _model_of(model.model_fields[name])
    return model.model_fields[leaf]


def _model_of(field: FieldInfo) -> type[BaseModel]:
    annotation = field.annotation
    if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        raise KeyError(f"{annotation} is not a config section")
    return annotation


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def value_type(flag: ConfigFlag) -> Any:
    """The Python type typer parses the flag's text into; a section (`parallel`) is given as
    its text form and Literal choices as text the config validates (errors name the key)."""
    annotation = _without_none(field_of(flag.keys[0]).annotation)
    if typing.get_origin(annotation) is Literal or (
            isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return str
    if typing.get_origin(annotation) is list:
        return list[str]
    return annotation


def default_text(flag: ConfigFlag) -> str:
    """The field's default as the help shows it."""
    if flag.default_text is not None:
        return flag.default_text
    field = field_of(flag.keys[0])
    default = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, float):
        return f"{default:g}"
    if default is None or default == []:
        return "none"
    return str(default)


def env_variables(flag: ConfigFlag) -> list[str]:
    """The environment variables that set the flag's keys (the flag wins over them)."""
    names = [s.variable for s in envs.ENV_SETTINGS if s.path in flag.keys]
    return list(dict.fromkeys(names))


def help_text(flag: ConfigFlag) -> str:
    """The field's description, the variables beside it, and the default."""
    description = field_of(flag.keys[0]).description
    if not description:
        raise ValueError(f"{flag.keys[0]} has no description for the {flag.name} help")
    extra = [f"default: {default_text(flag)}", *(f"${name}" for name in env_variables(flag))]
    return f"{description} [{'; '.join(extra)}]"


def _metavar(flag: ConfigFlag) -> str | None:
    """Literal choices as `a|b|c`; a repeatable flag by its item type."""
    annotation = _without_none(field_of(flag.keys[0]).annotation)
    if typing.get_origin(annotation) is Literal:
        return "|".join(str(arg) for arg in typing.get_args(annotation))
    return "<str>" if typing.get_origin(annotation) is list else None


def typer_option(flag: ConfigFlag) -> Any:
    """The typer option of one flag; None when not given on the command line."""
    return typer.Option(None, flag.name, help=help_text(flag), metavar=_metavar(flag),
                        rich_help_panel=flag.panel, show_default=False)


def flag_overrides(flags: tuple[ConfigFlag, ...], values: dict[str, Any]) -> dict[str, Any]:
    """The dotted-path overrides of the flags given (`values`: parameter name -> value)."""
    out: dict[str, Any] = {}
    for flag in flags:
        value = values.get(flag.param)
        if value is None or value == []:
            continue
        for key in flag.keys:
            out[key] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def with_config_flags(flags: tuple[ConfigFlag, ...]) -> Callable[[Callable[..., Any]],
                                                                   Callable[..., Any]]:
    """Add `flags` to a typer command (after its own options, before its own panels); the
    command receives the dotted overrides of those given as its `config_overrides`."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(command)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(command).parameters.values()
               if p.name != "config_overrides"]
        added = [inspect.Parameter(flag.param, inspect.Parameter.KEYWORD_ONLY,
                                   default=typer_option(flag),
                                   annotation=Optional[value_type(flag)])  # noqa: UP045
                 for flag in flags]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {flag.param: kwargs.pop(flag.param) for flag in flags}
            return command(**kwargs, config_overrides=flag_overrides(flags, values))

        # The command's own panels (e.g. scale-out) follow the config flags in the help.
        plain = [p for p in own if getattr(p.default, "rich_help_panel", None) is None]
        panelled = [p for p in own if p not in plain]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in [*plain, *added, *panelled]]
        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


def repeat_multi_value_flags(args: list[str]) -> list[str]:
    """`--served-model-name A B --port 1` -> `--served-model-name A --served-model-name B
    --port 1`: each value up to the next option gets the flag."""
    out: list[str] = []
    flag: str | None = None
    for arg in args:
        if arg.startswith("-"):
            name = arg.split("=")[0]
            flag = name if name in MULTI_VALUE_FLAGS else None
            out.append(arg)
        elif flag is not None and out[-1] != flag:
            out += [flag, arg]
        else:
            out.append(arg)
    return out


class PanelledCommand(TyperCommand):
    """`--help` as click writes it (wrapped to the terminal, option names never cut, no rich
    markup to swallow `[ray]` or `[default: ...]`), one section per help panel."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, repeat_multi_value_flags(args))

    # typer vendors click (typer._click): reach its classes through typer's own.
    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        super(TyperCommand, self).format_help(ctx, formatter)

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panel = getattr(param, "rich_help_panel", None) or "Options"
                panels.setdefault(panel, []).append(record)
        for panel, records in panels.items():
            with formatter.section(panel):
                formatter.write_dl(records)

