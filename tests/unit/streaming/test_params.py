"""Effective retention and sampling (spec sections 4.2-4.3), without a server."""

from __future__ import annotations

import json

import pytest

from worldserve.api.streaming.params import build_retention, build_sampling, sampling_view
from worldserve.errors import InvalidRequest
from worldserve.ipc.messages import ReasonerRetention, ReasonerSampling

POLICY = ReasonerRetention(max_video_segments=8)
DEFAULTS = ReasonerSampling()


def test_omitted_retention_is_the_server_policy() -> None:
    assert build_retention(None, POLICY) == ReasonerRetention(max_video_segments=8)


def test_supplied_retention_is_not_merged_with_the_policy() -> None:
    built = build_retention({"max_session_tokens": 5000}, POLICY)
    assert built == ReasonerRetention(max_video_segments=30, max_session_tokens=5000)


@pytest.mark.parametrize("supplied, message", [
    ({"max_video_segments": True}, "retention.max_video_segments"),
    ({"max_video_segments": "4"}, "retention.max_video_segments"),
    ({"max_text_tokens": 0}, "retention.max_text_tokens"),
    ({"reprefill_threshold": float("nan")}, "retention.reprefill_threshold"),
    ({"reprefill_threshold": float("inf")}, "retention.reprefill_threshold"),
    ({"reprefill_threshold": 0}, "retention.reprefill_threshold"),
    ({"a": 1, "b": 2}, "unknown retention field 'a'; unknown retention field 'b'"),
    ([], "retention must be a JSON object"),
])
def test_retention_rules(supplied: object, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_retention(supplied, POLICY)  # type: ignore[arg-type]
    assert message in caught.value.message


def test_sampling_overrides_field_by_field() -> None:
    built = build_sampling({"max_tokens": 48, "seed": 7}, DEFAULTS)
    assert built == ReasonerSampling(max_tokens=48, seed=7)
    assert sampling_view(built) == {"max_tokens": 48, "temperature": 0.3, "top_p": 0.9,
                                    "repetition_penalty": 1.1, "frequency_penalty": 0.0,
                                    "seed": 7}


def test_guided_json_object_or_string_becomes_schema_text() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for value in (schema, json.dumps(schema)):
        built = build_sampling({"guided_json": value}, DEFAULTS)
        assert json.loads(built.guided_json) == schema


@pytest.mark.parametrize("supplied, message", [
    ({"guided_json": {}, "guided_choice": ["a"]},
     "at most one of guided_json, guided_choice, guided_regex may be set"),
    ({"guided_json": "[1, 2]"}, "guided_json must be a JSON Schema object"),
    ({"guided_choice": ["a", ""]}, "non-empty strings"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "sampling.stop"),
    ({"top_k": -2}, "sampling.top_k"),
    ({"presence_penalty": -2.5}, "sampling.presence_penalty"),
    ({"repetition_penalty": 0}, "sampling.repetition_penalty"),
])
def test_sampling_rules(supplied: dict, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        build_sampling(supplied, DEFAULTS)
    assert message in caught.value.message


def test_explicit_nulls_do_not_count_as_guided() -> None:
    built = build_sampling({"guided_json": None, "guided_choice": ["x"]}, DEFAULTS)
    assert built.guided_choice == ["x"] and built.guided_json is None
