"""`POST /v1/videos/{id}/remix` (OpenAI's `videos.remix`): a new video job conditioned on a
completed job's video, with a new prompt. On families that condition on a video (Cosmos3
continues it) the source MP4 is the job's conditioning video, exactly as if the client had
uploaded it as `video_reference`; the new job names its source in `remixed_from_video_id`.

The body is OpenAI's (`prompt`) plus any `/v1/videos` field; `size` and `num_frames` default to
the source's. The conditioning comes from the source only: a body that names another one is a
400, as are a source that is not completed and a model without video conditioning (both name
the reason).
"""

from __future__ import annotations

import io
from typing import Any

from starlette.datastructures import Headers, UploadFile

from worldserve.api.jobs.inputs import FormBody, flatten_extras, video_request
from worldserve.api.jobs.params import MediaRequest
from worldserve.api.jobs.records import JobRecord, JobStatus
from worldserve.api.jobs.service import MediaService
from worldserve.errors import InvalidRequest

# Fields that would give the job a second conditioning input.
CONDITIONING_FIELDS = ("input_reference", "reference_url", "video_path", "video_url",
                       "video_reference", "image_reference")


def _check_source(service: MediaService, source: JobRecord) -> None:
    caps = service.capabilities()
    if not caps.video_conditioning:
        raise InvalidRequest(f"remix continues a video, and this model ({caps.pipeline}) does "
                             "not condition on a video: remix is not available here",
                             param="video_id")
    if source.status != JobStatus.COMPLETED:
        raise InvalidRequest(f"video {source.id} is {source.status.value}: only a completed "
                             "video can be remixed", param="video_id")


def _check_body(body: FormBody) -> dict[str, Any]:
    given = set(flatten_extras(body.fields)) | set(body.files)
    named = sorted(set(CONDITIONING_FIELDS) & given)
    if named:
        raise InvalidRequest(f"{named[0]}: a remix is conditioned on its source video only",
                             param=named[0])
    return dict(body.fields)


async def remix_request(service: MediaService, source: JobRecord,
                        body: FormBody) -> MediaRequest:
    """The validated request of the remix job (the source's MP4 as its conditioning video)."""
    _check_source(service, source)
    fields = _check_body(body)
    fields.setdefault("size", source.size)
    if source.num_frames and "seconds" not in fields:
        fields.setdefault("num_frames", source.num_frames)
    path = service.video_file(source.id, None)
    upload = UploadFile(io.BytesIO(path.read_bytes()), filename=path.name,
                        headers=Headers({"content-type": "video/mp4"}))
    request = await video_request(fields, service.request_context(),
                                  {"video_reference": [upload]})
    request.remixed_from_video_id = source.id
    return request
