"""Public response objects built from job records (spec native-media.md §3.1, §4.2).

`url`/`urls` are absolute: `base_url` is `--public-url` when set, else the request's own
scheme and host (X-Forwarded-Proto/Host count only from a proxy that `--forwarded-allow-ips`
trusts; see api/middleware.py), so clients that GET `url` verbatim work behind a proxy too.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import HTTPConnection
from starlette.responses import Response

from worldserve.api.jobs.records import JobRecord, JobStatus
from worldserve.config import ServerConfig

WARNING_HEADER = "X-Worldserve-Warning"


def warn(response: Response, warnings: list[str]) -> None:
    """One `X-Worldserve-Warning` header per thing the server ignored or changed (values are
    ASCII: field names are quoted with `ascii()`)."""
    for warning in warnings:
        response.headers.append(WARNING_HEADER, warning)


def public_base_url(connection: HTTPConnection, config: ServerConfig) -> str:
    """`scheme://host[:port][/root]` without a trailing slash."""
    if config.public_url:
        return config.public_url
    return str(connection.base_url).rstrip("/")


def _error(record: JobRecord) -> dict[str, Any] | None:
    return msgspec.to_builtins(record.error) if record.error is not None else None


def job_object(record: JobRecord, paths: list[Path], *, base_url: str,
               hide_paths: bool) -> dict[str, Any]:
    """The public video job object (spec §4.2)."""
    completed = record.status == JobStatus.COMPLETED
    url = f"{base_url}/v1/videos/{record.id}/content"
    return {
        "id": record.id, "object": "video", "model": record.model or "sora-2",
        "status": record.status.value, "progress": record.progress,
        "created_at": record.created_at, "size": record.size,
        "seconds": record.seconds, "quality": "standard",
        "url": url if completed else None,
        "urls": [f"{url}?variant={i}" for i in range(len(paths))]
        if completed and len(paths) > 1 else None,
        "remixed_from_video_id": record.remixed_from_video_id,
        "completed_at": record.completed_at, "prompt": record.revised_prompt,
        "expires_at": record.expires_at, "error": _error(record),
        "file_path": str(paths[0]) if completed and paths and not hide_paths else None,
        "file_paths": [str(p) for p in paths] if completed and not hide_paths else None,
        "num_outputs": record.num_outputs,
        # always numbers (vLLM-Omni's benchmark client compares them): 0 until the job ends
        "peak_memory_mb": record.peak_memory_mb or 0.0,
        "inference_time_s": record.inference_time_s,
        "stage_durations": dict(record.stage_durations),
        "step_cache": record.step_cache,
        "revised_prompt": record.revised_prompt, "action": record.action,
        **_action_data(record, url if completed else None),
        **progress_fields(record),
    }


def _action_data(record: JobRecord, url: str | None) -> dict[str, Any]:
    """vLLM-Omni reads an action job's result at `data[0].action` (SGLang at the top level,
    `action`): both carry it."""
    if record.action is None:
        return {}
    return {"data": [{"url": url, "action": record.action}]}


def progress_fields(record: JobRecord) -> dict[str, Any]:
    """Where a job is, beyond OpenAI's `status` and `progress`: `queue_position` (requests
    ahead of it in the engine) while queued; `phase` (encode, denoise, decode, mux) and the
    denoising `step` of `total_steps` once the engine admitted it; `queue_wait_s`, acceptance to
    admission, once known."""
    queued = record.status == JobStatus.QUEUED
    return {"queue_position": record.queue_position if queued else None,
            "phase": record.phase if record.status == JobStatus.IN_PROGRESS else None,
            "step": record.step, "total_steps": record.total_steps,
            "queue_wait_s": record.queue_wait_s}


def job_list(records: list[JobRecord], paths_of: Any, has_more: bool, *, base_url: str,
             hide_paths: bool) -> dict[str, Any]:
    data = [job_object(r, paths_of(r), base_url=base_url, hide_paths=hide_paths) for r in records]
    return list_object(data, has_more)


def list_object(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """The list object (spec §4.3) around rendered job objects."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def image_response(record: JobRecord, paths: list[Path], *, base_url: str,
                   hide_paths: bool) -> dict[str, Any]:
    """The OpenAI images response (spec §3.1): `b64_json` or an absolute `url` per output."""
    data = []
    for i, path in enumerate(paths):
        item = {"b64_json": None, "url": None, "revised_prompt": record.revised_prompt,
                "file_path": None if hide_paths else str(path)}
        if record.response_format == "b64_json":
            item["b64_json"] = base64.b64encode(path.read_bytes()).decode()
        else:
            variant = f"?variant={i}" if len(paths) > 1 else ""
            item["url"] = f"{base_url}/v1/images/{record.id}/content{variant}"
        data.append(item)
    return {"id": record.id, "created": record.created_at or int(time.time()), "data": data,
            "peak_memory_mb": record.peak_memory_mb or 0.0,
            "inference_time_s": record.inference_time_s,
            "stage_durations": dict(record.stage_durations),
            "step_cache": record.step_cache,
            "usage": {"image_count": len(paths)}}


def server_timing(record: JobRecord) -> dict[str, str]:
    """`Server-Timing` (W3C: milliseconds) of the job's wait before the engine admitted it
    (queue) and the phases the engine reported (encode, denoise, decode, mux, as far as it ran
    them), and `total`, its inference time (the queue not included); none before the job has
    figures."""
    waited = {"queue": record.queue_wait_s} if record.queue_wait_s is not None else {}
    phases = [f"{name};dur={seconds * 1000:.1f}" for name, seconds in
              {**waited, **record.stage_durations}.items()]
    if record.inference_time_s is not None:
        phases.append(f"total;dur={record.inference_time_s * 1000:.1f}")
    return {"Server-Timing": ", ".join(phases)} if phases else {}


def timing_headers(record: JobRecord) -> dict[str, str]:
    """The figures of a synchronous answer: vLLM-Omni's header names for time and memory, and
    `Server-Timing`."""
    return {"X-Inference-Time-S": f"{record.inference_time_s or 0:.3f}",
            "X-Peak-Memory-MB": f"{record.peak_memory_mb or 0:.1f}", **server_timing(record)}


def sync_headers(record: JobRecord) -> dict[str, str]:
    """What a synchronous video answer says besides its bytes."""
    durations = ",".join(f"{k}={v:.3f}" for k, v in record.stage_durations.items())
    return {"X-Video-Id": record.id, **timing_headers(record), "X-Stage-Durations": durations}
