"""`POST /v1/responses` request schema: the subset of the OpenAI Responses API that
`client.responses.create` uses for one-shot multimodal replies (input messages with
`input_text` / `input_image` / `input_video` parts, instructions, sampling, `text.format`,
streaming), plus the vLLM extensions chat completions take. No tools, no stored state."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worldserve.api.schemas.chat import MediaIO, TemplateValue
from worldserve.media.policy import MAX_PROMPT_CHARS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class InputText(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str = Field(max_length=MAX_PROMPT_CHARS)
    annotations: list[Any] | None = None  # echoed assistant turns carry them


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] = "auto"


class InputVideo(_Strict):
    """A video part (vLLM's responses extension; OpenAI's API has none)."""

    type: Literal["input_video"]
    video_url: str = Field(min_length=1)


InputPart = Annotated[InputText | InputImage | InputVideo, Field(discriminator="type")]


class InputMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | list[InputPart]
    id: str | None = None
    status: str | None = None


class TextFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format.schema is required when type is 'json_schema'")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(_Strict):
    model: str
    input: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | list[InputMessage] = Field(
        min_length=1)
    instructions: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool = False
    # Accepted for compatibility: nothing is stored (no retrieval, no previous_response_id).
    store: bool | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    user: str | None = None
    text: TextConfig | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["disabled"] | None = None
    # vLLM / NIM extensions (the OpenAI SDK sends them through `extra_body`)
    top_k: int | None = Field(default=None, ge=-1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    seed: int | None = None
    media_io_kwargs: MediaIO | None = None
    chat_template_kwargs: dict[str, TemplateValue] | None = Field(default=None, max_length=16)
    include_reasoning: bool = True
    thinking_token_budget: int | None = Field(default=None, ge=1)
