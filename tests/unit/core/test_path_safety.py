"""Ids, variants and names that reach a path never leave their folder, and errors on our side
never show a server path (a hypothesis fuzz over their characters, against the real functions)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldserve.api.jobs.service import variant_index
from worldserve.api.schemas.lora import parse_lora
from worldserve.engines.generation.outputs import output_names
from worldserve.errors import InternalError, InvalidRequest, NotFound, error_body, public_message

# Every character that changes what a path means, among ordinary ones.
TRICKY = "./\\\x00~:%*?[]$ \n\t-_aZ09é²٣"
ids = st.text(alphabet=TRICKY, max_size=40) | st.text(max_size=40)
ROOT = Path("/srv/outputs")


@settings(max_examples=400, deadline=None)
@given(stem=ids, count=st.integers(1, 3))
def test_output_names_stay_in_the_output_folder(stem: str, count: int) -> None:
    try:
        names = output_names(stem, "png", count)
    except InvalidRequest:
        return
    for name in names:
        assert (ROOT / name).resolve().parent == ROOT
        assert not name.startswith(".") and "/" not in name and "\x00" not in name


@pytest.mark.parametrize("stem", [str(uuid.uuid4()), f"{uuid.uuid4()}.replica-1"])
def test_job_ids_are_accepted_stems(stem: str) -> None:
    assert output_names(stem, "mp4", 2) == [f"{stem}_0.mp4", f"{stem}_1.mp4"]


@settings(max_examples=400, deadline=None)
@given(variant=ids | st.text(alphabet="0123456789", min_size=1, max_size=5000))
def test_variants_are_small_ascii_indices_or_not_found(variant: str) -> None:
    try:
        index = variant_index(variant, "not found")
    except NotFound:
        return
    assert 0 <= index < 10**6 and variant.isascii() and variant.isdigit()


@settings(max_examples=400, deadline=None)
@given(name=ids)
def test_lora_names_are_plain_words(name: str) -> None:
    try:
        (ref,) = parse_lora({"name": name})
    except InvalidRequest:
        return
    assert ref.name == name and name.isascii() and "\n" not in name
    assert all(c.isalnum() or c in "_-" for c in name)


def test_a_trailing_newline_is_not_part_of_a_name() -> None:
    with pytest.raises(InvalidRequest):
        parse_lora("style\n")


segment = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(segment, min_size=2, max_size=6), before=st.sampled_from(
    ["", "No such file: '", "OSError: ", "at "]), after=st.sampled_from(["", "'", " failed"]))
def test_errors_on_our_side_never_show_a_server_path(parts: list[str], before: str,
                                                     after: str) -> None:
    path = "/" + "/".join(parts)
    exc = InternalError(f"{before}{path}{after}")
    message = error_body(exc)["error"]["message"]
    assert path not in message and parts[-1] in message
    # a client's own mistake is quoted back whole (it names what the client sent)
    assert public_message(InvalidRequest(f"file {path} is outside the allowed folder")) \
        .endswith(f"{path} is outside the allowed folder")
