"""Prompt enhancer against a local OpenAI-compatible endpoint: rewrite, 502, 504, config errors."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from worldserve.api.jobs.enhancer import EnhancerConfig, PromptEnhancer, load_enhancer_config
from worldserve.errors import RequestTimeout, UpstreamError


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        prompt = body["messages"][-1]["content"]
        if prompt == "slow":
            time.sleep(1.0)
        if prompt == "fail":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"secret upstream stack trace")
            return
        content = "" if prompt == "empty" else f"A vivid scene: {prompt}"
        data = json.dumps({"choices": [{"message": {"content": content}}],
                           "auth": self.headers.get("authorization")}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


async def test_rewrites_and_maps_failures(endpoint):
    enhancer = PromptEnhancer(EnhancerConfig(base_url=endpoint, model="m", timeout=0.5))
    assert await enhancer.enhance("a red car") == "A vivid scene: a red car"
    with pytest.raises(UpstreamError) as failed:
        await enhancer.enhance("fail")
    assert "secret" not in failed.value.message and "HTTP 500" in failed.value.message
    with pytest.raises(UpstreamError, match="empty"):
        await enhancer.enhance("empty")
    with pytest.raises(RequestTimeout):
        await enhancer.enhance("slow")


def test_config_file_errors_name_the_problem(tmp_path: Path):
    good = tmp_path / "ok.yaml"
    good.write_text("base_url: reasoner\ntimeout: 5\n")
    assert load_enhancer_config(good).timeout == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_url: ftp://x\n")
    with pytest.raises(ValueError, match="base_url"):
        load_enhancer_config(bad)
    extra = tmp_path / "extra.yaml"
    extra.write_text("base_url: reasoner\nbogus: 1\n")
    with pytest.raises(ValueError, match="bogus"):
        load_enhancer_config(extra)
    with pytest.raises(ValueError, match="cannot read"):
        load_enhancer_config(tmp_path / "missing.yaml")


def test_engine_refuses_to_start_with_a_broken_enhancer(tiny_wan_dir, tmp_path):
    from worldserve.config import GenerationStageConfig, ServerConfig
    from worldserve.engines.generation.engine import GenerationEngine

    bad = tmp_path / "enhancer.yaml"
    bad.write_text("model: [unclosed\n")
    cfg = GenerationStageConfig(model_path=tiny_wan_dir, output_dir=tmp_path, prompt_enhancer=bad)
    with pytest.raises(ValueError, match="not valid YAML"):
        GenerationEngine(cfg, ServerConfig())
