"""Browser tests: Debian's Chromium driven by Playwright against live servers.

No browser download: Playwright launches /usr/bin/chromium or $WORLDSERVE_E2E_CHROMIUM
(`make test` finds or installs it with tests/e2e/ensure-chromium.sh, as CI's .ci/run does).
Without it, or without the `playwright` package, a plain `pytest` run skips every test here
with the reason; under `make test` (WORLDSERVE_TEST_STRICT=1) they fail instead.
Screenshots go to test-artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.machine import missing, require_module
from tests.support.server import REPO_ROOT, ServerProcess

CHROMIUM = Path(os.environ.get("WORLDSERVE_E2E_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]
ARTIFACTS = REPO_ROOT / "test-artifacts"
VIEWPORT = {"width": 1280, "height": 860}
# The playground's reasoning server allows one session, so "capacity reached" and "the page
# released its session" are both observable from outside.
MAX_REASONING_SESSIONS = 1
REASONING_DELAY_MS = 40  # the fake reasoner's time per frame, so latencies are visible


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)")
    sync_playwright = require_module("playwright.sync_api").sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def playground_config(workdir: Path) -> dict[str, Any]:
    """Every stage: the dev generation model, and the fake reasoner and realtime backends (fast,
    deterministic). Every surface is then offered (`require_surface` fails otherwise)."""
    reasoner = {"backend": "fake", "model_path": str(workdir), "fake_delay_ms": REASONING_DELAY_MS,
                "streaming": {"max_sessions": MAX_REASONING_SESSIONS}}
    realtime = {"enabled": True, "backend": "fake", "model_path": str(workdir)}
    return {"stages": {"reasoner": reasoner, "realtime": realtime}}


@pytest.fixture(scope="session")
def playground(
    tmp_path_factory: pytest.TempPathFactory, dev_models_dir: Path
) -> Iterator[ServerProcess]:
    if not CHROMIUM.exists():  # stop before paying for a server no browser can visit
        missing(f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium)")
    workdir = tmp_path_factory.mktemp("playground")
    server = ServerProcess(workdir, playground_config(workdir))
    try:
        server.wait_healthy(timeout_s=180)
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


def offered(server: ServerProcess) -> dict[str, bool]:
    return httpx.get(f"{server.base_url}/web/surfaces", timeout=10).json()


def require_surface(server: ServerProcess, surface: str) -> None:
    """The playground offers every surface: one it lacks is a failure, never a skip."""
    surfaces = offered(server)
    assert surfaces.get(surface) is True, f"the playground server offers no {surface}: {surfaces}"


class PageErrors(list):
    """Uncaught exceptions and console errors of a page; a test ends by asserting none."""


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    errors = PageErrors()
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on(
        "console",
        lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    page.errors = errors
    yield page
    context.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"playground-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def open_tab(page: Any, server: ServerProcess, tab: str) -> None:
    page.goto(f"{server.base_url}/#{tab}")
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_selector(f"#tab-{tab}:not([hidden])")
