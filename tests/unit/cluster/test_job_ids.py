"""Job ids minted by an api replica (`<uuid>.<api replica>`) are output stems the generation
engine accepts, and the stem check still refuses every name that could leave the output dir."""

from __future__ import annotations

import uuid

import pytest

from worldserve.cluster.ids import api_owners_in, api_tag
from worldserve.engines.generation.outputs import output_names
from worldserve.errors import InvalidRequest


def test_a_cluster_job_id_names_its_outputs() -> None:
    job_id = f"{uuid.uuid4()}{api_tag('k3j5h2x9')}"
    assert output_names(job_id, "mp4", 1) == [f"{job_id}.mp4"]
    assert output_names(job_id, "png", 2) == [f"{job_id}_0.png", f"{job_id}_1.png"]
    # the api router still finds the api replica in the content route of that id
    assert api_owners_in(f"/v1/videos/{job_id}/content") == ["k3j5h2x9"]


def test_a_single_node_job_id_is_unchanged() -> None:
    job_id = str(uuid.uuid4())
    assert output_names(job_id, "mp4", 1) == [f"{job_id}.mp4"]


@pytest.mark.parametrize("stem", [
    "../etc/passwd", "a/b", "a\\b", ".hidden", "a..b", "a.", ".", "..", "a.b.c", "a\n",
    "", "a b", "a\x00b", "x" * 129, "a.-b",
])
def test_stems_outside_the_id_alphabet_are_refused(stem: str) -> None:
    with pytest.raises(InvalidRequest, match="is not a job id"):
        output_names(stem, "mp4", 1)
