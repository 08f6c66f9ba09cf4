"""The `worldserve` command: serve | stream | realtime | dev-models (and the clients beside)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
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


def _usage_error(message: str) -> typer.Exit:
    typer.echo(f"worldserve: error: {message}", err=True)
    return typer.Exit(code=2)


def _model_overrides(model_path: Path | None) -> dict[str, Any]:
    """`--model-path DIR`: a dev-models folder (per-stage subfolders) or a generation model."""
    if model_path is None:
        return {}
    subdirs = [name for name in DEV_STAGE_DIRS if (model_path / name).is_dir()]
    if subdirs:
        return {f"stages.{name}.model_path": str(model_path / name) for name in subdirs}
    return {"stages.generation.model_path": str(model_path)}


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
    if not all((root / name / "worldserve_dev.json").is_file() for name in missing):
        typer.echo(f"worldserve: building dev checkpoints in {root} (first run only)", err=True)
        # A child process: the api process never imports torch.
        done = subprocess.run(
            [sys.executable, "-m", "worldserve", "dev-models", "build", str(root)]
        )
        if done.returncode != 0:
            typer.echo("worldserve: building the dev checkpoints failed", err=True)
            raise typer.Exit(code=1)
    data = config.model_dump(mode="json")
    for name in missing:
        data["stages"][name]["model_path"] = str(root / name)
    return ServerConfig.model_validate(data)


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
    # --- scale-out (issue 15): docs/scale-out.md
    cluster: Optional[str] = typer.Option(
        None, help="'ray': serve on a Ray Serve cluster (extra worldserve[ray])."
    ),
    ray_address: Optional[str] = typer.Option(
        None, help="With --cluster ray: join this Ray cluster [default: start a local one]."
    ),
    replicas: Optional[str] = typer.Option(
        None, help="With --cluster ray: replicas per stage, e.g. generation=2,reasoner=1."
    ),
    api_replicas: int = typer.Option(1, min=1, help="With --cluster ray: api replicas."),
) -> None:
    """Start the api process and its stage processes."""
    overrides: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "stages.generation.output_dir": str(output_dir) if output_dir else None,
        "allowed_local_media_path": str(allowed_local_media_path)
        if allowed_local_media_path
        else None,
        "allowed_media_domains": allowed_media_domain or None,
        "output_ttl_s": output_ttl,
        "max_job_records": max_job_records,
        "max_upload_bytes": max_upload_bytes,
        "public_url": public_url,
        "forwarded_allow_ips": forwarded_allow_ips,
        **_model_overrides(model_path),
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
    if cluster is not None or ray_address is not None or replicas is not None:
        raise typer.Exit(code=_serve_cluster(cfg, key, cluster, ray_address, replicas,
                                             api_replicas))
    try:
        code = asyncio.run(_serve(cfg, key))
    except KeyboardInterrupt:
        code = 130
    raise typer.Exit(code=code)


def _serve_cluster(cfg: ServerConfig, key: str | None, cluster: str | None,
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
    return run(cfg, key, options)


async def _serve(cfg: ServerConfig, key: str | None) -> int:
    from worldserve.api.server import serve as run_server

    return await run_server(cfg, key)


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
