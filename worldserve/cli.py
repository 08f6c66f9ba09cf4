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
from worldserve.clients.auth import API_KEY_HELP, resolve_api_key
from worldserve.clients.streaming import stream_command
from worldserve.config import ConfigError, ServerConfig, load_config
from worldserve.config.flags import CHECK_FLAGS, SERVE_FLAGS, PanelledCommand, with_config_flags

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
DEV_STAGE_DEFAULTS = {"generation": "world", "reasoner": "world", "realtime": "realtime"}
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


@app.command(cls=PanelledCommand)
@with_config_flags(SERVE_FLAGS)
def serve(
    model_path: Optional[Path] = typer.Option(
        None,
        help="Model directory (HF layout). A folder with generation/ and reasoner/ subfolders "
        "sets both stages. [default: the dev checkpoints]",
    ),
    config: Optional[Path] = typer.Option(None, "--config",
                                          help="YAML configuration file. [default: none]"),
    admin_key_file: Optional[Path] = typer.Option(
        None, help="File holding the admin bearer key. [default: $WORLDSERVE_ADMIN_KEY]"
    ),
    # --- scale-out (issue 15): docs/scale-out.md
    cluster: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="'ray': serve on a Ray Serve cluster (extra worldserve[ray]). [default: one "
        "machine, no Ray]"
    ),
    ray_address: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="With --cluster ray: join this Ray cluster. [default: start a local one]"
    ),
    replicas: Optional[str] = typer.Option(
        None, rich_help_panel=CLUSTER_PANEL,
        help="With --cluster ray: replicas per stage, e.g. generation=2,reasoner=1. [default: "
        "1 each]"
    ),
    api_replicas: int = typer.Option(1, min=1, rich_help_panel=CLUSTER_PANEL,
                                     help="With --cluster ray: api replicas."),
    # --- who may call (issue 34): docs/security.md. A secret, so not a config field: the
    # config is dumped to /admin/server_info and to the stages' config file.
    api_key: Optional[str] = typer.Option(
        None, "--api-key",
        help="Bearer key every inference route needs (else $WORLDSERVE_API_KEY; unset: open). "
        "Health, metrics and version stay open; /admin keeps its own key. [default: open]"),
    config_overrides: Optional[dict[str, Any]] = None,
) -> None:
    """Start the api process and its stage processes. Flags override single config keys
    (flag > environment variable > YAML file > default)."""
    overrides = {**_model_overrides(model_path), **(config_overrides or {})}
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


@app.command(cls=PanelledCommand)
@with_config_flags(CHECK_FLAGS)
def check(
    model_path: Optional[Path] = typer.Option(
        None, help="Model directory, as for `serve`. [default: the dev checkpoints]"),
    config: Optional[Path] = typer.Option(None, "--config",
                                          help="YAML configuration file. [default: none]"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    config_overrides: Optional[dict[str, Any]] = None,
) -> None:
    """Print the placement plan and what each stage would load, without loading anything.
    Exit status 1 when the plan cannot work (a missing device, a stage that does not fit)."""
    import json

    from worldserve.runtime.devices import DeviceProbeError, server_plan
    from worldserve.runtime.placement import format_plan, gib

    overrides = {**_model_overrides(model_path), **(config_overrides or {})}
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
    api_key: Optional[str] = typer.Option(None, "--api-key", help=API_KEY_HELP),
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
        api_key=resolve_api_key(api_key),
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
