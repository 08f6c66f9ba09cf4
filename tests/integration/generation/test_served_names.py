"""`--served-model-name NAME [NAME ...]` through a real server (tiny Wan generation, fake
reasoner): the first name is the listed id of every stage, the others are accepted as aliases in
requests' `model`, and an unknown name still gets the 404 that names the served models."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.server import ServerProcess

LISTED = "acme/world-1"
ALIAS = "nvidia/Cosmos3-Super"
IMAGE = {"prompt": "x", "size": "64x64", "num_inference_steps": 2, "response_format": "b64_json"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory, gen_model_dir: Path):
    workdir = tmp_path_factory.mktemp("names")
    config = {"stages": {"generation": {"model_path": str(gen_model_dir)},
                         "reasoner": {"backend": "fake", "model_path": str(workdir)}}}
    server = ServerProcess(workdir, config, ["--served-model-name", LISTED, ALIAS])
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            yield client
    finally:
        server.stop()


def test_the_first_name_is_the_one_listed_id_of_every_stage(http):
    models = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == [LISTED]
    assert {"generation", "reasoner"} <= set(models[0]["stages"])


@pytest.mark.parametrize("name", [LISTED, ALIAS])
def test_images_and_chat_serve_the_listed_name_and_its_alias(http, name):
    image = http.post("/v1/images/generations", json={**IMAGE, "model": name})
    assert image.status_code == 200, image.text
    chat = http.post("/v1/chat/completions", json={**CHAT, "model": name})
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == name  # echoed as sent, as vLLM does


def test_an_unknown_name_gets_the_404_naming_the_served_model(http):
    for path, body in (("/v1/images/generations", IMAGE), ("/v1/chat/completions", CHAT)):
        refused = http.post(path, json={**body, "model": "someone/else"})
        assert refused.status_code == 404, refused.text
        message = refused.json()["error"]["message"]
        assert "'someone/else' does not exist" in message and LISTED in message


def test_a_streaming_session_accepts_the_alias(http):
    body = {"system_prompt": "Describe each frame.", "question": "What is happening?"}
    created = http.post("/v1/streaming/sessions", json={**body, "model": ALIAS})
    assert created.status_code == 201, created.text
    refused = http.post("/v1/streaming/sessions", json={**body, "model": "someone/else"})
    assert refused.status_code == 404, refused.text
