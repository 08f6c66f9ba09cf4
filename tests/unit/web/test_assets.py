"""The playground page and every asset it references are served, with the right types.

No browser: index.html is parsed for its <script>/<link> references, every JS module for its
static imports, and each file is fetched through the real app (in-process, no stages), so a
missing or misnamed file fails here even where Chromium is not installed.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin

import pytest
from fastapi.testclient import TestClient

from worldserve.api.app import create_app
from worldserve.api.routes.web import WEB_DIR, _walk, offered_surfaces
from worldserve.api.runtime import ServerRuntime
from worldserve.config import ServerConfig

IMPORT_RE = re.compile(
    r"""(?:^|\n)\s*(?:import|export)\s[^;]*?\bfrom\s*["']([^"']+)["']|import\s*["']([^"']+)["']"""
)


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.refs.append(values["src"])
        if tag == "link" and values.get("href"):
            self.refs.append(values["href"])


@pytest.fixture(scope="module")
def client() -> TestClient:
    runtime = ServerRuntime(config=ServerConfig(), clients={})
    return TestClient(create_app(runtime))


def js_imports(source: str) -> list[str]:
    return [a or b for a, b in IMPORT_RE.findall(source)]


def crawl(client: TestClient) -> dict[str, str]:
    """url -> content-type for the page and everything reachable from it."""
    page = client.get("/")
    assert page.status_code == 200
    parser = _Refs()
    parser.feed(page.text)
    seen: dict[str, str] = {"/": page.headers["content-type"]}
    todo = [urljoin("/", ref) for ref in parser.refs]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        response = client.get(url)
        assert response.status_code == 200, f"{url} -> {response.status_code}"
        seen[url] = response.headers["content-type"]
        if url.endswith(".js"):
            todo.extend(urljoin(url, dep) for dep in js_imports(response.text))
    return seen


def test_page_and_every_referenced_asset_is_served(client: TestClient) -> None:
    seen = crawl(client)
    assert seen["/"].startswith("text/html")
    scripts = [url for url in seen if url.endswith(".js")]
    styles = [url for url in seen if url.endswith(".css")]
    # app.js and the four tab modules at least, reached through imports
    for name in ("app", "images", "videos", "reasoning", "realtime", "msgpack", "errors"):
        assert f"/web/{name}.js" in seen, f"{name}.js not reachable from index.html"
    assert styles == ["/web/style.css"]
    for url in scripts:
        assert seen[url].startswith("text/javascript"), (url, seen[url])
    for url in styles:
        assert seen[url].startswith("text/css"), (url, seen[url])


def test_every_js_file_in_the_package_is_reachable(client: TestClient) -> None:
    """A module nobody imports is dead weight or a forgotten import."""
    seen = crawl(client)
    on_disk = {f"/web/{p.relative_to(WEB_DIR).as_posix()}" for p in WEB_DIR.rglob("*.js")}
    assert on_disk - set(seen) == set()


def test_page_has_a_strict_content_security_policy(client: TestClient) -> None:
    for url in ("/", "/web/app.js", "/web/style.css"):
        policy = client.get(url).headers["content-security-policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["default-src"] == "'self'"
        assert directives["script-src"] == "'self'"
        assert directives["connect-src"] == "'self'"
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert "*" not in policy


def test_no_inline_script_or_style_in_the_page(client: TestClient) -> None:
    """The CSP forbids inline code; the page must not depend on it."""
    html = client.get("/").text
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html) is None
    assert "<style" not in html and " style=" not in html and " on" + "click=" not in html


@pytest.mark.parametrize(
    "path",
    [
        "/web/../config.py",
        "/web/%2e%2e/config.py",
        "/web/nope.js",
        "/web/",
        "/web/..%2fapi%2fapp.py",
    ],
)
def test_unknown_or_escaping_paths_are_404(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "error" in response.json()


def test_surfaces_reflect_the_registered_routes(client: TestClient) -> None:
    offered = client.get("/web/surfaces").json()
    assert set(offered) == {"images", "videos", "streaming", "realtime"}
    # the answer is read from the app's own routes (nested included routers too)
    assert offered == offered_surfaces(client.app.routes)
    assert all(isinstance(value, bool) for value in offered.values())
    web_routes = {getattr(r, "path", None) for r in _walk(client.app.routes)}
    assert {"/", "/web/surfaces", "/health"} <= web_routes


def test_surfaces_detects_http_and_websocket_routes() -> None:
    from fastapi import APIRouter, FastAPI, WebSocket

    app = FastAPI()
    router = APIRouter()

    @router.post("/v1/images/generations")
    async def images() -> None: ...

    @router.websocket("/v1/realtime_video/generate")
    async def realtime(ws: WebSocket) -> None: ...

    @router.get("/v1/videos")  # GET only: creating videos is not offered
    async def videos() -> None: ...

    app.include_router(router)
    assert offered_surfaces(app.routes) == {
        "images": True,
        "videos": False,
        "streaming": False,
        "realtime": True,
    }
