"""Session admission (spec 4.5-4.6) and the server defaults the api shows (spec 3.4).

A1-A3 are configurations that can never fit (400); C1-C2 are capacity that is temporarily
full (503). Pure logic over numbers, testable without a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from worldserve.config import StreamingConfig
from worldserve.errors import CapacityExceeded, InvalidRequest
from worldserve.ipc.messages import ChatCompletion, ReasonerRetention, ReasonerSampling

LIBRARY_MAX_SESSION_TOKENS = 7000
MIN_SESSION_TOKENS = 1024


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int  # M: context length the engine serves
    max_position_embeddings: int  # P: trained position range (M when undeclared)


@dataclass(frozen=True)
class StreamingLimits:
    max_sessions: int
    image_budget: int  # L: per-session image limit
    encoder_capacity: int  # E: shared across live sessions


def streaming_limits(cfg: StreamingConfig) -> StreamingLimits:
    floor = 2 * cfg.max_sessions * cfg.max_video_segments
    budget = max(cfg.image_budget or floor, floor)
    return StreamingLimits(cfg.max_sessions, budget, cfg.encoder_capacity or budget)


def fitted_session_tokens(model: ModelLimits, sampling: ReasonerSampling,
                          threshold: float) -> int:
    """The library default (7000), lowered for small models: a multiple of 256 that passes A1
    with the default sampling and stays at half the re-prefill trigger (A2 with headroom, so
    that after a re-prefill the next one is many frames away). Never below 1024."""
    bound = min(model.max_model_len - sampling.max_tokens - 1,
                math.ceil(threshold * model.max_position_embeddings / 2) - 1)
    if bound >= LIBRARY_MAX_SESSION_TOKENS:
        return LIBRARY_MAX_SESSION_TOKENS
    return max(MIN_SESSION_TOKENS, bound // 256 * 256)


def library_retention(model: ModelLimits) -> ReasonerRetention:
    """Defaults a supplied retention object is built from (spec 4.2), fitted to the model."""
    base = ReasonerRetention()
    tokens = fitted_session_tokens(model, ReasonerSampling(), base.reprefill_threshold)
    return ReasonerRetention(max_session_tokens=tokens)


def server_retention(model: ModelLimits, cfg: StreamingConfig) -> ReasonerRetention:
    """The server policy used when a client omits retention."""
    base = library_retention(model)
    return ReasonerRetention(max_video_segments=cfg.max_video_segments,
                             max_session_tokens=cfg.max_session_tokens or base.max_session_tokens)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def check_retention(retention: ReasonerRetention, sampling: ReasonerSampling,
                    model: ModelLimits, limits: StreamingLimits) -> None:
    """Field rules (spec 4.2) and A1-A3 (spec 4.5); InvalidRequest with the spec's messages."""
    r = retention
    if r.max_video_segments < 1:
        raise InvalidRequest("retention.max_video_segments must be an integer >= 1")
    if r.max_session_tokens < MIN_SESSION_TOKENS:
        raise InvalidRequest(f"retention.max_session_tokens must be >= {MIN_SESSION_TOKENS}")
    if r.max_text_tokens is not None and not 0 < r.max_text_tokens <= r.max_session_tokens:
        raise InvalidRequest("retention.max_text_tokens must be > 0 and <= max_session_tokens")
    if r.eviction_policy != "sliding_window":
        raise InvalidRequest("retention.eviction_policy must be 'sliding_window'")
    if not (math.isfinite(r.reprefill_threshold) and 0 < r.reprefill_threshold < 1):
        raise InvalidRequest("retention.reprefill_threshold must be a number with 0 < x < 1")
    if sampling.max_tokens < 1:
        raise InvalidRequest("sampling.max_tokens must be an integer >= 1")
    total = r.max_session_tokens + sampling.max_tokens
    if not total < model.max_model_len:  # A1
        raise InvalidRequest(f"max_session_tokens + max_tokens ({total}) must be below the model "
                             f"context length ({model.max_model_len})")
    trigger = r.reprefill_threshold * model.max_position_embeddings
    if not r.max_session_tokens < trigger:  # A2
        raise InvalidRequest(f"max_session_tokens ({r.max_session_tokens}) must be below "
                             f"reprefill_threshold × max_position_embeddings ({_fmt(trigger)})")
    if not 2 * r.max_video_segments <= limits.image_budget:  # A3
        raise InvalidRequest(f"retention window needs {2 * r.max_video_segments} image slots; "
                             f"the limit is {limits.image_budget}")


def check_capacity(live_windows: list[int], new_window: int, limits: StreamingLimits) -> None:
    """C1 (session slots) and C2 (shared encoder capacity); `live_windows` holds the
    max_video_segments of every live session."""
    if len(live_windows) >= limits.max_sessions:  # C1
        raise CapacityExceeded(
            f"session slots exhausted ({len(live_windows)}/{limits.max_sessions})")
    used = sum(2 * w for w in live_windows)
    need = 2 * new_window
    if used + need > limits.encoder_capacity:  # C2
        raise CapacityExceeded(
            f"shared encoder capacity exhausted ({used}+{need} > {limits.encoder_capacity})")


def fit_max_tokens(request: ChatCompletion, prompt_tokens: int,
                   max_model_len: int) -> ChatCompletion:
    """vLLM's rule: `max_tokens` beyond the room the prompt leaves is lowered to that room
    (`min_tokens` with it); a prompt that fills the context is a 400."""
    room = max_model_len - prompt_tokens
    if room < 1:
        raise InvalidRequest(f"Input length ({prompt_tokens}) exceeds the model's maximum "
                             f"context length ({max_model_len}).")
    if request.sampling.max_tokens <= room:
        return request
    sampling = msgspec.structs.replace(request.sampling, max_tokens=room,
                                       min_tokens=min(request.sampling.min_tokens, room))
    return msgspec.structs.replace(request, sampling=sampling)
