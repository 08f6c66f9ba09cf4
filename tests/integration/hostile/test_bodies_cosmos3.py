"""The family-neutral hostile catalogue on Cosmos3, the family the soak serves (benchmarks/
soak.py --faults sends it): test_bodies.CASES and the soak's own bombs (soak_hostile.BOMBS)
whose answer is known, each with its status. Cosmos3 has no /v1/images/edits (a 400 before the
body is read), so the image uploads of these catalogues go to /v1/videos as `input_reference`
files, read and checked there on every family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from benchmarks.soak_hostile import BOMBS
from tests.integration.hostile.conftest import _start, assert_alive, model_name, server_config
from tests.integration.hostile.test_bodies import CASES, Send
from tests.support.server import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # the tiny model's build

# answered by status alone: a job (json-wide-array's 200) would load the CPU meanwhile, and
# the chat bombs' answer (None) depends on the reasoner
KNOWN = [c for c in CASES + BOMBS if c[2] is not None and c[2] < 500 and c[2] != 200]


@pytest.fixture(scope="module")
def cosmos3(tmp_path_factory: pytest.TempPathFactory,
            cosmos3_dir: Path) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("hostile-cosmos3")
    server = _start(workdir, server_config(workdir, cosmos3_dir), [])
    yield server
    server.stop()


def test_the_server_is_cosmos3_without_edits(cosmos3: ServerProcess) -> None:
    response = httpx.post(cosmos3.base_url + "/v1/images/edits", data={"prompt": "x"},
                          timeout=60)
    assert response.status_code == 400 and "no image-edit mode" in response.text, response.text


@pytest.mark.parametrize("case,send,status", KNOWN, ids=[c[0] for c in KNOWN])
def test_hostile_body_on_cosmos3(cosmos3: ServerProcess, case: str, send: Send,
                                 status: int) -> None:
    with httpx.Client(base_url=cosmos3.base_url, timeout=60) as http:
        response = send(http, model_name(cosmos3, "reasoner"))
    assert response.status_code == status, (case, response.text[:500])
    assert "Traceback" not in response.text
    assert "no image-edit mode" not in response.text  # the case reached its reading


def test_server_survived(cosmos3: ServerProcess) -> None:
    assert_alive(cosmos3)
