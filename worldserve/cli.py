"""The `worldserve` command: serve | check | stream | realtime | dev-models (and the clients
beside)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from worldserve import envs
from worldserve.clients.streaming import stream_command
from worldserve.config import ConfigError, ServerConfig, load_config

app = typer.Typer(
    help="worldserve: serve world foundation models (images, videos, actions, "
    "realtime worlds, live video reasoning).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
dev_models_app = typer.Typer(help="Tiny built-in development checkpoints.", no_args_is_help=True)
app.add_typer(dev_models_app, name="dev-models")

DEV_STAGE_DIRS = ("generation", "reasoner", "realtime")
# Which dev checkpoint a stage without a model path serves: generation and reasoning both come
# from the one Cosmos3 dev directory (as from a published Cosmos3 checkpoint); the Qwen2.5-VL
# dev reasoner (`<dev-models>/reasoner`) is served with `--model-path <dev-models>/reasoner`.
DEV_STAGE_DEFAULTS = {"generation": "generation", "reasoner": "generation", "realtime": "realtime"}
NIM_PANEL = "Live video reasoning (NIM settings; each flag wins over its NIM_* variable)"
CLUSTER_PANEL = "Scale-out on Ray Serve (docs/scale-out.md)"


def _usage_error(message: str) -> typer.Exit:
    typer.echo(f"worldserve: error: {message}", err=True)
    return typer.Exit(code=2)


def _model_overrides(model_path: Path | None) -> dict[str, Any]:
    """`--model-path DIR`: a dev-models folder (per-stage subfolders), or one model directory
    serving every stage a family detects in it (a Cosmos3 directory: generation and reasoner);
    anything else is the generation model."""
    if model_path is None:
        return {}
    subdirs = [name for name in DEV_STAGE_DIRS if (model_path / name).is_dir()]
    if subdirs:
        return {f"stages.{name}.model_path": str(model_path / name) for name in subdirs}
    from worldserve.models.registry import stage_kinds  # JSON reads only, no torch

    kinds = [kind for kind in stage_kinds(model_path) if kind in DEV_STAGE_DIRS]
    return {f"stages.{kind}.model_path": str(model_path) for kind in kinds or ["generation"]}


def _device_overrides(device: str | None, dtype: str | None) -> dict[str, Any]:
    """`--device` / `--dtype`: the same setting for every stage (YAML may still set a stage's
    own when the flag is not given)."""
    out: dict[str, Any] = {}
    for stage in DEV_STAGE_DIRS:
        out[f"stages.{stage}.device"] = device
        out[f"stages.{stage}.dtype"] = dtype
    return out


DEVICE_HELP = ("auto | cpu | cuda | cuda:N for every stage ($WORLDSERVE_DEVICE; default auto: "
               "CUDA when torch sees a GPU, the placement plan picks which; docs/hardware.md).")
DTYPE_HELP = ("auto | bfloat16 | float16 | float32 ($WORLDSERVE_DTYPE; default auto: bfloat16 "
              "on CUDA, float32 on the CPU).")


def _fill_dev_model_paths(config: ServerConfig) -> ServerConfig:
    """Stages without a model path serve the dev checkpoints (built on first use); `fake`
    backends need none."""
    missing = [
        n
        for n, s in config.stages.enabled().items()
        if s.model_path is None and getattr(s, "backend", None) != "fake"
    ]
    if not missing:
        return config
    root = envs.dev_models_dir()
    folders = {name: root / DEV_STAGE_DEFAULTS[name] for name in missing}
    if not all((folder / "worldserve_dev.json").is_file() for folder in folders.values()):
        typer.echo(f"worldserve: building dev checkpoints in {root} (first run only)", err=True)
        # A child process: the api process never imports torch.
        done = subprocess.run(
            [sys.executable, "-m", "worldserve", "dev-models", "build", str(root)]
        )
        if done.returncode != 0:
            typer.echo("worldserve: building the dev checkpoints failed", err=True)
            raise typer.Exit(code=1)
    data = config.model_dump(mode="json")
    for name, folder in folders.items():
        data["stages"][name]["model_path"] = str(folder)
    return ServerConfig.model_validate(data)


def _nim(help_text: str) -> Any:
    """An optional `serve` flag of the NIM settings panel (None: not given on the command line)."""
    return typer.Option(None, help=help_text, rich_help_panel=NIM_PANEL)


@dataclass(frozen=True)
class AccessKeys:
    """The secrets `serve` hands the server; never part of the config (docs/security.md)."""

    admin: str | None  # /admin/... (--admin-key-file, else WORLDSERVE_ADMIN_KEY)
    api: str | None  # every inference route (--api-key, else WORLDSERVE_API_KEY)


def _admin_key(admin_key_file: Path | None) -> str | None:
    if admin_key_file is None:
        return envs.admin_key()
    try:
        key = admin_key_file.read_text().strip()
    except OSError as exc:
        raise _usage_error(f"cannot read --admin-key-file {admin_key_file}: {exc.strerror}")
    if not key:
        raise _usage_error(f"--admin-key-file {admin_key_file} is empty")
    return key


@app.command()
def serve(
    model_path: Optional[Path] = typer.Option(
        None,
        help="Model directory (HF layout). A folder "
        "with generation/ and reasoner/ subfolders sets "
        "both stages. Default: the dev checkpoints.",
    ),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML configuration file."),
    host: Optional[str] = typer.Option(None, help="Bind address [default: 127.0.0.1]."),
    port: Optional[int] = typer.Option(None, help="Port [default: 8000]."),
    output_dir: Optional[Path] = typer.Option(
        None, help="Where generated media go [default: outputs]."
    ),
    allowed_local_media_path: Optional[Path] = typer.Option(
        None, help="Local media paths in requests must resolve inside this directory."
    ),
    allowed_media_domain: Optional[list[str]] = typer.Option(
        None, help="Allowed remote media host (repeatable, comma-separated allowed)."
    ),
    log_level: Optional[str] = typer.Option(None, help="debug | info | warning | error."),
    no_access_log: bool = typer.Option(
        False, "--no-access-log",
        help="No log line per HTTP request and WebSocket handshake (uvicorn's access log)."),
    admin_key_file: Optional[Path] = typer.Option(
        None, help="File holding the admin bearer key (else $WORLDSERVE_ADMIN_KEY)."
    ),
    output_ttl: Optional[float] = typer.Option(
        None,
        help="Delete generated outputs and their records this many seconds after they "
        "finish [default: 0 = never].",
    ),
    max_job_records: Optional[int] = typer.Option(
        None,
        help="Keep at most this many image/video records; the oldest finished ones go "
        "first [default: 0 = unlimited].",
    ),
    max_upload_bytes: Optional[int] = typer.Option(
        None, help="Largest accepted upload per file, in bytes."
    ),
    public_url: Optional[str] = typer.Option(
        None, help="Base of the absolute URLs in responses [default: the request's host]."
    ),
    forwarded_allow_ips: Optional[str] = typer.Option(
        None, help="Proxies trusted for X-Forwarded-Proto/For/Host [default: 127.0.0.1]."
    ),
    generation_parallel: Optional[str] = typer.Option(
        None, help="One request across several ranks, e.g. cfg=2,ulysses=2 (axes cfg, "
        "ulysses, ring, shard; docs/parallel.md)."
    ),
    device: Optional[str] = typer.Option(None, help=DEVICE_HELP),
    dtype: Optional[str] = typer.Option(None, help=DTYPE_HELP),
    # --- Live video reasoning: the NIM settings (spec streaming-reasoning.md section 2). Each
    # flag wins over its NIM_* variable, which wins over the YAML file.
    enable_streaming: Optional[bool] = typer.Option(
        None, "--enable-streaming/--disable-streaming", rich_help_panel=NIM_PANEL,
        help="Streaming routes on/off ($NIM_ENABLE_STREAMING; default on)."),
    streaming_max_sessions: Optional[int] = _nim(
        "Live sessions, WebSocket and REST ($NIM_STREAMING_MAX_SESSIONS; 2)."),
    streaming_max_video_segments: Optional[int] = _nim(
        "Default retained frames ($NIM_STREAMING_MAX_VIDEO_SEGMENTS; 8)."),
    streaming_idle_timeout_s: Optional[float] = _nim(
        "WebSocket session idle timeout ($NIM_STREAMING_IDLE_TIMEOUT_S; 900)."),
    streaming_rest_idle_timeout_s: Optional[float] = _nim(
        "REST session idle timeout ($NIM_STREAMING_REST_IDLE_TIMEOUT_S; 120)."),
    streaming_frame_timeout_s: Optional[float] = _nim("Per-frame ceiling in seconds (120)."),
    streaming_image_budget: Optional[int] = _nim(
        "Per-session image limit, never below 2 x sessions x segments "
        "($NIM_MAX_IMAGES_PER_PROMPT)."),
    streaming_encoder_capacity: Optional[int] = _nim(
        "Shared encoder capacity (default: the image budget)."),
    streaming_spec_method: Optional[str] = _nim(
        "none | ngram | dflash ($NIM_STREAMING_SPEC_METHOD; dflash when a drafter is "
        "given, else none)."),
    streaming_spec_model_path: Optional[Path] = _nim(
        "DFlash drafter directory (needed by --streaming-spec-method dflash)."),
    streaming_spec_num_tokens: Optional[int] = _nim(
        "Draft tokens per step ($NIM_STREAMING_SPEC_NUM_TOKENS; 3)."),
    guided_decoding_backend: Optional[str] = _nim(
        "llguidance ($NIM_GUIDED_DECODING_BACKEND; llguidance)."),
    reasoner_model_name: Optional[str] = _nim(
        "Name reported as `model` (default: the model id or path)."),
    nim_runtime: Optional[str] = _nim(
        "generator | reasoner: the runtime the root /v1/metadata describes ($NIM_MODEL_TYPE; "
        "default: the reasoner when enabled). /nim/generator and /nim/reasoner always serve "
        "their own."),
    # --- scale-out (issue 15): docs/scale-out.md
    cluster: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="'ray': serve on a Ray Serve cluster (extra worldserve[ray])."
    ),
    ray_address: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="With --cluster ray: join this Ray cluster [default: start a local one]."
    ),
    replicas: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="With --cluster ray: replicas per stage, e.g. generation=2,reasoner=1."
    ),
    api_replicas: int = typer.Option(1, min=1, rich_help_panel=CLUSTER_PANEL,
                                     help="With --cluster ray: api replicas."),
    # --- who may call (issue 34): docs/security.md. A secret, so not a config field: the
    # config is dumped to /admin/server_info and to the stages' config file.
    api_key: Optional[str] = typer.Option(
        None, "--api-key",
        help="Bearer key every inference route needs (else $WORLDSERVE_API_KEY; unset: open). "
        "Health, metrics and version stay open; /admin keeps its own key."),
    show_server_paths: bool = typer.Option(
        False, "--show-server-paths",
        help="Show absolute server paths in responses (file_path, /v1/models root, "
        "model_path, NIM modelUrl) [default: hidden]."),
) -> None:
    """Start the api process and its stage processes."""
    streaming = "stages.reasoner.streaming"
    nim_overrides: dict[str, Any] = {
        f"{streaming}.enabled": enable_streaming,
        f"{streaming}.max_sessions": streaming_max_sessions,
        f"{streaming}.max_video_segments": streaming_max_video_segments,
        f"{streaming}.idle_timeout_s": streaming_idle_timeout_s,
        f"{streaming}.rest_idle_timeout_s": streaming_rest_idle_timeout_s,
        f"{streaming}.frame_timeout_s": streaming_frame_timeout_s,
        f"{streaming}.image_budget": streaming_image_budget,
        f"{streaming}.encoder_capacity": streaming_encoder_capacity,
        f"{streaming}.spec_method": streaming_spec_method,
        f"{streaming}.spec_num_tokens": streaming_spec_num_tokens,
        f"{streaming}.spec_model_path": streaming_spec_model_path,
        "stages.reasoner.guided_decoding_backend": guided_decoding_backend,
        "stages.reasoner.served_model_name": reasoner_model_name,
        "nim_runtime": nim_runtime,
    }
    overrides: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "access_log": False if no_access_log else None,
        "stages.generation.output_dir": str(output_dir) if output_dir else None,
        "stages.generation.parallel": generation_parallel,
        "allowed_local_media_path": str(allowed_local_media_path)
        if allowed_local_media_path
        else None,
        "allowed_media_domains": allowed_media_domain or None,
        "output_ttl_s": output_ttl,
        "max_job_records": max_job_records,
        "max_upload_bytes": max_upload_bytes,
        "public_url": public_url,
        "forwarded_allow_ips": forwarded_allow_ips,
        "show_server_paths": True if show_server_paths else None,
        **_model_overrides(model_path),
        **_device_overrides(device, dtype),
        **nim_overrides,
    }
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        raise _usage_error(str(exc))
    if cfg.allowed_local_media_path is not None and not cfg.allowed_local_media_path.is_dir():
        raise _usage_error(
            f"--allowed-local-media-path {cfg.allowed_local_media_path} is not a directory"
        )
    key = _admin_key(admin_key_file)
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = _fill_dev_model_paths(cfg)
    keys = AccessKeys(admin=key, api=api_key or envs.api_key())
    if cluster is not None or ray_address is not None or replicas is not None:
        raise typer.Exit(code=_serve_cluster(cfg, keys, cluster, ray_address, replicas,
                                             api_replicas))
    try:
        code = asyncio.run(_serve(cfg, keys))
    except KeyboardInterrupt:
        code = 130
    raise typer.Exit(code=code)


def _serve_cluster(cfg: ServerConfig, keys: AccessKeys, cluster: str | None,
                   ray_address: str | None, replicas: str | None, api_replicas: int) -> int:
    """`--cluster ray`: the only path that imports Ray (worldserve/cluster)."""
    if cluster != "ray":
        raise _usage_error("--ray-address and --replicas need --cluster ray"
                           if cluster is None else f"--cluster must be 'ray' (got '{cluster}')")
    try:
        from worldserve.cluster.app import ClusterOptions, parse_replicas, run
    except ImportError as exc:
        raise _usage_error(f"--cluster ray needs Ray Serve: pip install 'worldserve[ray]' ({exc})")
    try:
        counts = parse_replicas(replicas)
    except ValueError as exc:
        raise _usage_error(str(exc))
    options = ClusterOptions(ray_address=ray_address, replicas=counts, api_replicas=api_replicas)
    return run(cfg, keys.admin, options, keys.api)


async def _serve(cfg: ServerConfig, keys: AccessKeys) -> int:
    from worldserve.api.server import serve as run_server

    return await run_server(cfg, keys.admin, keys.api)


@app.command()
def check(
    model_path: Optional[Path] = typer.Option(
        None, help="Model directory, as for `serve` [default: the dev checkpoints]."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML configuration file."),
    device: Optional[str] = typer.Option(None, help=DEVICE_HELP),
    dtype: Optional[str] = typer.Option(None, help=DTYPE_HELP),
    generation_parallel: Optional[str] = typer.Option(
        None, help="As for `serve`: the generation stage's rank group (one GPU per rank)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print the placement plan and what each stage would load, without loading anything.
    Exit status 1 when the plan cannot work (a missing device, a stage that does not fit)."""
    import json

    from worldserve.runtime.devices import DeviceProbeError, server_plan
    from worldserve.runtime.placement import format_plan, gib

    overrides = {"stages.generation.parallel": generation_parallel,
                 **_model_overrides(model_path), **_device_overrides(device, dtype)}
    try:
        cfg = _fill_dev_model_paths(load_config(config, overrides))
        plan, facts = server_plan(cfg)
    except (ConfigError, DeviceProbeError) as exc:
        raise _usage_error(str(exc))
    if as_json:
        typer.echo(json.dumps({"plan": plan.to_json(),
                               "stages": {n: f.to_json() for n, f in facts.items()}}, indent=2))
    else:
        for name, info in facts.items():
            typer.echo(f"{name}: {info.family}, {info.layout}; quantisation "
                       f"{info.quantisation or 'none'}; {len(info.files)} weight file(s), "
                       f"{gib(info.file_bytes)} on disk; {info.model_path}")
        for line in format_plan(plan):
            typer.echo(line)
    raise typer.Exit(code=0 if plan.fits else 1)


@app.command()
def realtime(
    url: str = typer.Option("ws://127.0.0.1:8000", help="Server base URL (ws:// or http://)."),
    prompt: str = typer.Option(..., help="Text prompt of the world."),
    first_frame: Optional[Path] = typer.Option(None, help="Image to start from (sent as bytes)."),
    actions: Optional[str] = typer.Option(None, help="Camera script DSL, e.g. 'w-20,d-10,none-5'."),
    max_chunks: int = typer.Option(4, min=1, help="Chunks to generate before the server closes."),
    encoding: str = typer.Option("raw", help="raw | delta-gzip | delta-zstd | jpeg | webp."),
    out: Optional[Path] = typer.Option(None, help="Write the frames to this H.264 MP4."),
    size: Optional[str] = typer.Option(None, help="WxH (default: the model's)."),
    seed: Optional[int] = typer.Option(None, help="Noise seed (default: 42)."),
    fps: Optional[int] = typer.Option(None, min=1, help="Frame rate (default: the model's)."),
) -> None:
    """Explore a world over the realtime WebSocket; decode every chunk, write an MP4."""
    from worldserve.clients.realtime import RealtimeClientOptions
    from worldserve.clients.realtime import main as run_client
    from worldserve.media.framing import OUTPUT_FORMATS

    if encoding not in OUTPUT_FORMATS:
        raise _usage_error(f"--encoding {encoding!r}: expected one of {', '.join(OUTPUT_FORMATS)}")
    if first_frame is not None and not first_frame.is_file():
        raise _usage_error(f"--first-frame {first_frame} is not a file")
    opts = RealtimeClientOptions(
        url=url,
        prompt=prompt,
        first_frame=first_frame,
        actions=actions,
        max_chunks=max_chunks,
        encoding=encoding,
        out=out,
        size=size,
        seed=seed,
        fps=fps,
    )
    raise typer.Exit(code=run_client(opts))


app.command("stream")(stream_command)


@dev_models_app.command("build")
def dev_models_build(
    directory: Optional[Path] = typer.Argument(
        None, help="Target folder [default: ~/.cache/worldserve/dev-models/<version>]."
    ),
    force: bool = typer.Option(False, help="Rebuild even when present."),
) -> None:
    """Build the tiny development checkpoints (deterministic, offline)."""
    from worldserve.models.dev import build_dev_models

    logging.basicConfig(level="INFO", format="%(message)s")
    root = directory or envs.dev_models_dir()
    paths = build_dev_models(root, force=force)
    for name, path in paths.items():
        typer.echo(f"{name}: {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
