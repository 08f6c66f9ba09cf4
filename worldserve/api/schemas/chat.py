"""`POST /v1/chat/completions` request schema (OpenAI shape, with vLLM's guided_* extras)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessageIn(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]
    name: str | None = None


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format.json_schema is required when type is 'json_schema'")
        return self


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1, description="only 1 is supported")
    user: str | None = None  # accepted for OpenAI compatibility; not used
    response_format: ResponseFormat | None = None
    # vLLM extensions
    guided_json: dict[str, Any] | str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_regex: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> "ChatCompletionRequest":
        structured = self.response_format is not None and self.response_format.type != "text"
        guided = [self.guided_json, self.guided_choice, self.guided_regex]
        if sum(g is not None for g in guided) + structured > 1:
            raise ValueError("at most one of response_format (json), guided_json, guided_choice, "
                             "guided_regex may be set")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop holds at most 4 strings")
        return self
