"""The app around an empty runtime: routing, error mapping, admin access rules."""

from __future__ import annotations

import httpx
import pytest

from worldserve.api.app import create_app
from worldserve.api.routes.ops import overall_status, probe_status
from worldserve.api.runtime import ServerRuntime
from worldserve.config import build_config


def client_for(runtime: ServerRuntime, host: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(runtime), client=(host, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.mark.parametrize(
    "states, expected",
    [
        ({"a": "ready", "b": "ready"}, "ok"),
        ({}, "ok"),
        ({"a": "ready", "b": "warming"}, "warming"),
        ({"a": "loading", "b": "warming"}, "starting"),
        ({"a": "failed", "b": "warming"}, "unhealthy"),
    ],
)
def test_overall_status(states: dict[str, str], expected: str) -> None:
    assert overall_status(states) == expected


@pytest.mark.parametrize(
    "states, expected",
    [
        ({"generation": "warming", "reasoner": "ready", "realtime": "failed"}, "ok"),
        ({"generation": "ready", "reasoner": "loading", "realtime": "ready"}, "starting"),
        ({"generation": "ready", "reasoner": "failed"}, "unhealthy"),
        ({"generation": "warming", "realtime": "ready"}, "warming"),  # no reasoner: all count
        ({"generation": "ready", "realtime": "ready"}, "ok"),
    ],
)
def test_nim_probe_follows_the_reasoner_stage(states: dict[str, str], expected: str) -> None:
    assert probe_status(states) == expected


async def test_admin_without_key_answers_loopback_only() -> None:
    runtime = ServerRuntime(config=build_config({}), clients={})
    async with client_for(runtime, "127.0.0.1") as local:
        assert (await local.get("/admin/server_info")).status_code == 200
    async with client_for(runtime, "192.0.2.10") as remote:
        r = await remote.get("/admin/server_info")
    assert r.status_code == 403
    assert "WORLDSERVE_ADMIN_KEY" in r.json()["error"]["message"]


async def test_admin_with_key_needs_the_bearer_token_from_anywhere() -> None:
    runtime = ServerRuntime(config=build_config({}), clients={}, admin_key="k3y")
    async with client_for(runtime, "192.0.2.10") as remote:
        assert (await remote.get("/admin/stats")).status_code == 401
        assert (
            await remote.get("/admin/stats", headers={"Authorization": "Basic k3y"})
        ).status_code == 401
        assert (
            await remote.get("/admin/stats", headers={"Authorization": "Bearer k3"})
        ).status_code == 403
        ok = await remote.get("/admin/stats", headers={"Authorization": "Bearer k3y"})
    assert ok.status_code == 200 and ok.json() == {"stages": {}}


async def test_stage_not_enabled_is_503_json() -> None:
    runtime = ServerRuntime(config=build_config({}), clients={})
    async with client_for(runtime, "127.0.0.1") as client:
        r = await client.post("/admin/stages/generation/echo", json={})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "stage_unavailable"
