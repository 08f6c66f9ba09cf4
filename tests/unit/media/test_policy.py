"""The unified media policy: forbidden fields, upload names, references, domains, prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worldserve.errors import InvalidRequest
from worldserve.media import fetch
from worldserve.media.policy import (
    MAX_PROMPT_CHARS,
    MediaPolicy,
    check_forbidden_fields,
    check_prompt_lengths,
    check_request_id,
    check_upload_name,
    decoded_json,
    domain_allowed,
)


def test_one_policy_type() -> None:
    assert fetch.MediaPolicy is MediaPolicy


def test_ip_literals_match_exactly() -> None:
    assert domain_allowed("127.0.0.1", ("127.0.0.1",))
    assert not domain_allowed("127.0.0.1", ("0.0.1",))
    assert not domain_allowed("10.127.0.0.1", ("127.0.0.1",))
    assert domain_allowed("a.b.example.org", ("example.org",))


@pytest.mark.parametrize("name", ["a/b.png", "..", ".", "a..png", "a\\b.png", "a\x00.png"])
def test_bad_upload_names(name: str) -> None:
    with pytest.raises(InvalidRequest, match="upload file name"):
        check_upload_name(name)


def test_good_upload_names_and_ids() -> None:
    check_upload_name("photo.v2.png")
    check_request_id("req-1", "request_id")
    with pytest.raises(InvalidRequest):
        check_request_id("../x", "request_id")


def test_forbidden_fields_anywhere() -> None:
    check_forbidden_fields({"prompt": "x", "a": [{"b": "c"}]})
    for payload in (
        {"a": [{"b": {"output_path": "x"}}]},
        {"a": json.dumps({"vae_path": 1})},
        {"a": json.dumps([json.dumps({"foo_model_path": 1})])},
    ):
        with pytest.raises(InvalidRequest, match="cannot be set"):
            check_forbidden_fields(payload)
    deep: object = "x"
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        check_forbidden_fields(deep)


def test_decoded_json_never_raises() -> None:
    assert decoded_json("[" * 100_000) is None
    assert decoded_json("{not json") is None
    assert decoded_json('{"a": 1}') == {"a": 1}


def test_scan_without_local_dir_refuses_paths(tmp_path: Path) -> None:
    policy = MediaPolicy()
    policy.scan({"prompt": "/etc/passwd", "input_reference": "data:image/png;base64,AAAA"})
    for payload in (
        {"image_path": "/etc/passwd"},
        {"x": "file:///etc/passwd"},
        {"extra": json.dumps({"video_url": "rel/path.mp4"})},
    ):
        with pytest.raises(InvalidRequest, match="--allowed-local-media-path"):
            policy.scan(payload)


def test_scan_rewrites_nothing_but_checks_hosts(tmp_path: Path) -> None:
    policy = MediaPolicy(allowed_local_dir=tmp_path.resolve(), allowed_domains=("example.com",))
    (tmp_path / "a.png").write_bytes(b"x")
    assert policy.check_reference(f"file://{tmp_path}/a.png", "url") == str(
        (tmp_path / "a.png").resolve()
    )
    policy.scan({"url": "https://cdn.example.com/a.png"})
    for bad in ("https://example.org/a.png", "http://[::1/a.png", "http://example.com:0x1/"):
        with pytest.raises(InvalidRequest):
            policy.scan({"url": bad})


def test_prompt_limit() -> None:
    check_prompt_lengths({"prompt": "x" * MAX_PROMPT_CHARS})
    for payload in (
        {"prompt": "x" * (MAX_PROMPT_CHARS + 1)},
        {"input": {"task": "x" * (MAX_PROMPT_CHARS + 1)}},
    ):
        with pytest.raises(InvalidRequest, match="limit is 65536"):
            check_prompt_lengths(payload)
