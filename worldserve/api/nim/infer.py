"""`POST /v1/infer` as a translation into the native media path: a `NimJob` (the NIM's rules
applied, `infer_rules.py`) becomes the fields of an image request or a video job, read by the
very reader `/v1/videos` uses (`video_request`: media policy, references read once, the stage's
declaration) into one `MediaRequest`, and run by the same `MediaService` call; the answer is the
NIM's `{"b64_image"}` or `{"b64_video", "action"}`.

Policy and inverse dynamics are video jobs whose run predicts actions (the observation read as
for image2video / video2video, then the action condition set): their job record keeps the
predicted actions, which become the response's `action`.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from worldserve.api.jobs.idempotency import IdempotencyKey
from worldserve.api.jobs.inputs import RequestContext, parse_body, video_request
from worldserve.api.jobs.params import MediaRequest, resolve_image
from worldserve.api.jobs.service import MediaService
from worldserve.api.jobs.sync import run_video
from worldserve.api.jobs.views import timing_headers
from worldserve.api.nim.infer_rules import NimJob
from worldserve.api.schemas.images import ImageGenerationRequest
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ActionCondition
from worldserve.ipc.rules import check_generation

# Magic bytes -> the MIME type of a raw base64 `input_reference` (the NIM accepts raw base64).
_MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"),
          (b"RIFF", "image/webp"), (b"GIF8", "image/gif"), (b"\x1aE\xdf\xa3", "video/webm"))


@dataclass
class InferAnswer:
    body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # the job's figures (timing_headers)


async def run_infer(service: MediaService, job: NimJob, context: RequestContext,
                    key: IdempotencyKey | None = None) -> InferAnswer:
    """The NIM answer of one `/v1/infer` request, through the native request path (with an
    Idempotency-Key already used for this request: the answer of the job it made)."""
    if job.mode == "text2image":
        request = _image_request(job, context)
        record = await service.generate_images(request, key)
        image = service.paths(record)[0].read_bytes()
        return InferAnswer({"b64_image": base64.b64encode(image).decode()}, request.warnings,
                           timing_headers(record))
    request = await video_request(_video_fields(job), context)
    _retime(request, job)
    if job.mode in ("policy", "inverse_dynamics"):
        _predict_actions(request, job, context)
    record = await run_video(service, request, key)
    video = service.paths(record)[0].read_bytes()
    action = record.action if job.mode in ("policy", "inverse_dynamics") else None
    return InferAnswer({"b64_video": base64.b64encode(video).decode(), "action": action},
                       request.warnings, timing_headers(record))


def _sampling(job: NimJob) -> dict[str, Any]:
    fields = {"prompt": job.prompt, "negative_prompt": job.negative_prompt,
              "seed": job.seed, "num_inference_steps": job.steps,
              "guidance_scale": job.guidance, "flow_shift": job.flow_shift}
    return {k: v for k, v in fields.items() if v is not None}


def _image_request(job: NimJob, context: RequestContext) -> MediaRequest:
    fields = {**_sampling(job), "size": f"{job.width}x{job.height}", "output_format": "jpeg",
              "response_format": "b64_json"}
    body = parse_body(ImageGenerationRequest, fields, context.policy)
    return resolve_image(body, [], context.caps, default_response_format="b64_json")


def _video_fields(job: NimJob) -> dict[str, Any]:
    fields = _sampling(job)
    if job.mode != "forward_dynamics":
        fields["num_frames"] = job.num_frames
    if job.width:
        fields["size"] = f"{job.width}x{job.height}"
    if job.reference is not None:
        reference = reference_url(job.reference)
        video = job.mode in ("video2video", "inverse_dynamics")
        fields["video_url" if video else "input_reference"] = reference
    if job.mode == "video2video":
        fields["condition_frame_indexes_vision"] = job.condition_frame_indexes_vision
        fields["condition_video_keep"] = job.condition_video_keep
    if job.mode == "forward_dynamics" and job.action is not None:
        fields.update(action_mode="forward_dynamics", action=job.action["rows"],
                      domain_name=job.action["domain_name"], resolution_tier=job.action["tier"])
    return {k: v for k, v in fields.items() if v is not None}


def _retime(request: MediaRequest, job: NimJob) -> None:
    """The NIM's fps is a float: the pipeline conditions on it as sent; the MP4 gets it rounded."""
    request.params.fps = job.fps
    request.fps = max(1, round(job.fps))


def _predict_actions(request: MediaRequest, job: NimJob, context: RequestContext) -> None:
    """The observation's request becomes an action run that predicts `chunk` rows."""
    assert job.action is not None  # infer_rules requires action_params for the action modes
    params = request.params
    params.action = ActionCondition(mode=job.mode, chunk_size=job.action["chunk"],
                                    domain_name=job.action["domain_name"],
                                    resolution_tier=job.action["tier"])
    params.num_frames = job.action["chunk"] + 1
    params.width = params.height = 0  # the run's canvas follows the observation and the tier
    check_generation(params, context.caps)


def reference_url(value: str) -> str:
    """`input_reference` as the native reader takes it: a data URL or http(s) URL as sent; raw
    base64 (the NIM's default form) wrapped into a data URL of the type its bytes show."""
    if value[:5].lower() == "data:" or value.startswith(("http://", "https://")):
        return value
    text = "".join(value.split())
    try:
        head = base64.b64decode(text[:64] + "=" * (-len(text[:64]) % 4), validate=True)
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("input_reference must be raw base64, a data URL or an http(s) "
                             "URL", param="input_reference") from None
    return f"data:{_mime(head)};base64,{text}"


def _mime(head: bytes) -> str:
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    return "video/mp4" if head[4:8] == b"ftyp" else "application/octet-stream"
