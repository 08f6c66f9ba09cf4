"""The hostile realtime suite on each real world-model family (tiny random weights): SANA-WM,
Cosmos3 camera_pose world sessions, the causal DiT with an image-conditioned start and a
LingBot-World-style upstream checkpoint (camera branch, 36-channel image condition). One
server per family (module-scoped, one alive at a time) with the strict media policy; the init
cases of test_realtime.py (first_frame under the media policy, forbidden fields, junk), the
family's own invalid inits, the 10,000-event flood, and the server alive afterwards."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.integration.hostile.conftest import PNG, assert_alive, rss_kb
from tests.integration.hostile.test_realtime import (
    CASES,
    INIT,
    first_reply,
    flood_session,
    init_with,
    pack,
)
from tests.support.server import ServerProcess

FAMILIES = ("sana_wm", "cosmos3", "causal_dit_image", "lingbot_world")
# Inits the family's engine refuses (invalid_init from the stage, not the api's checks).
FAMILY_INVALID: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "sana_wm": [("no-first-frame", {"first_frame": None}, "first_frame is required"),
                ("size-not-32", {"size": "48x48"}, "multiple of 32"),
                ("guidance-below-1", {"guidance_scale": 0.5}, "guidance_scale must be >= 1")],
    "cosmos3": [("no-first-frame", {"first_frame": None}, "first_frame is required"),
                ("size-not-16", {"size": "72x72"}, "multiple of 16"),
                ("guidance-below-1", {"guidance_scale": 0.5}, "guidance_scale must be >= 1")],
    "causal_dit_image": [("size-not-16", {"size": "72x72"}, "multiple of 16"),
                         ("guidance-distilled", {"guidance_scale": 2.0}, "guidance-distilled")],
    "lingbot_world": [("no-first-frame", {"first_frame": None}, "first_frame is required"),
                      ("size-not-16", {"size": "72x72"}, "multiple of 16"),
                      ("guidance-distilled", {"guidance_scale": 2.0}, "guidance-distilled")],
}


def build(family: str, target: Path) -> dict[str, Any]:
    """The family's tiny model directory and its realtime stage settings."""
    target.mkdir()
    if family == "sana_wm":
        from worldserve.models.sana_wm.dev import build_sana_wm

        build_sana_wm(target, 0)
    elif family == "cosmos3":
        from worldserve.models.cosmos3.dev import Cosmos3DevConfig, build_cosmos3

        build_cosmos3(target, 0, Cosmos3DevConfig(sound=False))
    elif family == "lingbot_world":
        from worldserve.models.causal_dit.dev import build_lingbot_realtime

        build_lingbot_realtime(target, 0)
    else:
        from worldserve.models.causal_dit.dev import build_realtime

        build_realtime(target, 0)
        config_path = target / "realtime_config.json"
        config = json.loads(config_path.read_text())
        config_path.write_text(json.dumps({**config, "image_conditioning": True}))
    return {"enabled": True, "backend": "causal", "model_path": str(target),
            "num_inference_steps": 1, "max_width": 256, "max_height": 256}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(family: str, tmp_path_factory: pytest.TempPathFactory,
           media_dir: Path) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp(f"hostile-{family}")
    realtime = build(family, workdir / "model")
    config = {"stages": {"generation": {"enabled": False}, "reasoner": {"enabled": False},
                         "realtime": realtime}}
    server = ServerProcess(workdir, config, ["--allowed-local-media-path", str(media_dir),
                                             "--allowed-media-domain", "127.0.0.1"])
    try:
        server.wait_healthy(timeout_s=180)
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ctx(origin: str, media_dir: Path) -> dict[str, Any]:
    return {"origin": origin, "media": media_dir}


STRICT_CASES = [c for c in CASES if c[1] == "strict"]


@pytest.mark.parametrize("case,_server,build_init,outcome", STRICT_CASES,
                         ids=[c[0] for c in STRICT_CASES])
def test_init(server: ServerProcess, ctx: dict[str, Any], case: str, _server: str,
              build_init: Callable, outcome: str) -> None:
    """The init cases of the fake-backend suite; every init carries a first_frame unless the
    case sets its own (the image-started families need one)."""
    message = build_init(ctx)
    if isinstance(message, bytes) and case.startswith(("forbidden", "intrinsics", "megabyte")):
        message = init_with(first_frame=PNG, **_fields(case))(ctx)
    reply, code = asyncio.run(first_reply(server.ws_url, [message], timeout_s=120))
    assert reply is not None, (case, code, server.log()[-2000:])
    if outcome == "chunk":
        assert reply["type"] in ("frame_batch", "frame_batch_header"), (case, reply)
    else:
        assert reply["type"] == "error" and reply["content"] == "invalid generate request", (
            case, reply)


def _fields(case: str) -> dict[str, Any]:
    """The fields of the CASES inits that carry no first_frame, rebuilt with one."""
    return {
        "forbidden-nested": {"condition_inputs": {"extra": {"deep": [{"lora_path": "/x"}]}}},
        "forbidden-in-json-string": {"extra_params": json.dumps({"output_path": "/tmp/x"})},
        "intrinsics-path": {"condition_inputs": {"intrinsics_path": "/etc/passwd"}},
        "megabyte-prompt": {"prompt": "x" * (1 << 20)},
    }[case]


def test_family_invalid_inits(server: ServerProcess, family: str) -> None:
    for name, fields, detail in FAMILY_INVALID[family]:
        init = {**INIT, "first_frame": PNG, **fields}
        init = {k: v for k, v in init.items() if v is not None}
        reply, code = asyncio.run(first_reply(server.ws_url, [pack(init)], timeout_s=120))
        assert reply is not None, (name, code)
        assert reply["type"] == "error" and reply["code"] == "invalid_init", (name, reply)
        assert detail in reply["detail"], (name, reply)


def test_10000_events_during_a_session(server: ServerProcess) -> None:
    before = rss_kb(server.proc.pid)
    chunks, errors, code, _ = flood_session(server.ws_url, {**INIT, "first_frame": PNG},
                                            num_chunks=4)
    assert code == 1000 and chunks == 4, (code, chunks, errors, server.log()[-2000:])
    assert errors == 4000
    assert rss_kb(server.proc.pid) - before < 64 * 1024


def test_server_survived(server: ServerProcess) -> None:
    assert_alive(server)
    reply, _ = asyncio.run(first_reply(server.ws_url, [pack({**INIT, "first_frame": PNG})],
                                       timeout_s=120))
    assert reply is not None and reply["type"] in ("frame_batch", "frame_batch_header"), reply
