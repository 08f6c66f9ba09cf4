"""`POST /v1/chat/completions` request schema (OpenAI shape, with vLLM's and the NIM's
extensions: guided_*, video parts, media_io_kwargs, chat_template_kwargs, reasoning controls)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worldserve.media.clips import MAX_CLIP_FRAMES
from worldserve.media.policy import MAX_PROMPT_CHARS

# The NIM's per-prompt media limits (reasoning.md: five images and one video).
MAX_IMAGES_PER_PROMPT = 5
MAX_VIDEOS_PER_PROMPT = 1
MAX_CLIP_FPS = 60.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str = Field(max_length=MAX_PROMPT_CHARS)


class ImageURL(_Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(_Strict):
    url: str = Field(min_length=1)


class VideoPart(_Strict):
    """vLLM's and the NIM's video content part (a data URL, an allowed URL or path)."""

    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class ChatMessageIn(_Strict):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | list[ContentPart]
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


class VideoIO(_Strict):
    """How a `video_url` part is sampled (vLLM's `media_io_kwargs.video`)."""

    fps: float | None = Field(default=None, gt=0, le=MAX_CLIP_FPS)
    num_frames: int | None = Field(default=None, ge=1, le=MAX_CLIP_FRAMES)


class MediaIO(_Strict):
    video: VideoIO | None = None


TemplateValue = str | int | float | bool | None
# Arguments apply_chat_template sets itself: a request may not replace them.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "documents", "chat_template",
                                      "add_generation_prompt", "tokenize", "return_dict",
                                      "continue_final_message"})


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
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    # OpenAI fields that ask for nothing a reply depends on: accepted, not used (nothing is
    # stored; no tiers, caches or predictions to hint at)
    store: bool | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    # OpenAI fields for what this server does not do: accepted only while they ask for nothing
    # (`_nothing_unsupported`), so a client that sends their defaults works
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    web_search_options: dict[str, Any] | None = None
    # vLLM / NIM extensions (the OpenAI SDK sends them through `extra_body`)
    media_io_kwargs: MediaIO | None = None
    chat_template_kwargs: dict[str, TemplateValue] | None = Field(default=None, max_length=16)
    include_reasoning: bool = True
    thinking_token_budget: int | None = Field(default=None, ge=1)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, TemplateValue] | None) -> Any:
        for key in value or {}:
            if not key.isidentifier() or key in RESERVED_TEMPLATE_KWARGS:
                raise ValueError(f"chat_template_kwargs may not set {key!r}")
        return value

    @model_validator(mode="after")
    def _media_limits(self) -> "ChatCompletionRequest":
        parts = [p for m in self.messages if not isinstance(m.content, str) for p in m.content]
        images = sum(p.type == "image_url" for p in parts)
        videos = sum(p.type == "video_url" for p in parts)
        if images > MAX_IMAGES_PER_PROMPT or videos > MAX_VIDEOS_PER_PROMPT:
            raise ValueError(f"at most {MAX_IMAGES_PER_PROMPT} images and "
                             f"{MAX_VIDEOS_PER_PROMPT} video per prompt (got {images} images, "
                             f"{videos} videos)")
        return self

    @model_validator(mode="after")
    def _nothing_unsupported(self) -> "ChatCompletionRequest":
        """A request for log probabilities, tools, audio or a reasoning effort is a 400 that
        says so (not a reply without it)."""
        refusals = {
            "logprobs": (self.logprobs or self.top_logprobs,
                         "log probabilities are not returned (logprobs, top_logprobs)"),
            "logit_bias": (self.logit_bias, "logit_bias is not supported"),
            "tools": (self.tools or self.functions,
                      "tool and function calling are not supported (tools, functions)"),
            "tool_choice": (self.tool_choice not in (None, "none", "auto")
                            or self.function_call not in (None, "none", "auto"),
                            "tool_choice / function_call may only be 'none' or 'auto' "
                            "(no tools are called)"),
            "modalities": (set(self.modalities or ()) - {"text"} or self.audio is not None,
                           "only text replies are supported (modalities ['text'], no audio)"),
            "reasoning_effort": (self.reasoning_effort,
                                 "reasoning_effort is not supported: use chat_template_kwargs "
                                 "{\"enable_thinking\": ...} or thinking_token_budget"),
            "web_search_options": (self.web_search_options is not None,
                                   "web search is not supported"),
        }
        for field, (asked, why) in refusals.items():
            if asked:
                raise ValueError(f"{field}: {why}")
        return self

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
