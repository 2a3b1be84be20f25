"""The API's own documentation, /docs (Swagger UI) and /redoc, works without internet access:
each page loads its script, style and icon from the app, which serves them from the files of a
pinned package, and names no other origin. With a token set, the pages and their assets stay
open (they hold no job data), as before."""

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import SecretStr

from notifyq.api import create_app
from notifyq.api.application import DOCS_ASSETS
from notifyq.settings import Settings

#: The token of these tests' apps: the documentation must not need it.
TOKEN = "docs-s3cret"
#: What each page's assets must be served as.
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
}
#: An attribute that makes the browser fetch something, and its value.
FETCHED = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"']*)["']""", re.IGNORECASE)


def docs_client(settings: Settings) -> httpx.AsyncClient:
    """A client of the app with a token set, without its lifespan (the pages need no
    database)."""
    app = create_app(
        settings.model_copy(update={"run_worker": False, "api_token": SecretStr(TOKEN)})
    )
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_a_docs_page_loads_its_assets_from_the_app_and_names_no_other_origin(
    settings: Settings, page: str
) -> None:
    async with docs_client(settings) as client:
        answer = await client.get(page)
        assert answer.status_code == 200, answer.text
        html = answer.text
        fetched = FETCHED.findall(html)
        assets = {url: await client.get(url) for url in fetched}
    # No address with a scheme or a host anywhere in the page, fetched or not.
    assert not re.search(r"(?i)\b(?:https?:)?//[a-z0-9.-]+", html), html
    assert fetched and all(urlsplit(url).netloc == "" for url in fetched), fetched
    # The script that draws the page, and every other asset, come from the app, without the
    # token: the page is useless if its assets are refused.
    scripts = [url for url in fetched if url.endswith(".js")]
    assert scripts and all(url.startswith(f"{DOCS_ASSETS}/") for url in fetched), fetched
    for url, asset in assets.items():
        assert asset.status_code == 200, (url, asset.text[:200])
        kind = CONTENT_TYPES[url[url.rindex(".") :]]
        assert asset.headers["content-type"].startswith(kind), (url, asset.headers)
        assert len(asset.content) > 1000, url


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_a_docs_page_runs_only_the_apps_scripts_and_its_own_inline_one(
    settings: Settings, page: str
) -> None:
    # The token is pasted into /docs: a script of another origin, an injected inline one, a
    # frame around the page or a form sent elsewhere would be a way to it.
    async with docs_client(settings) as client:
        answer = await client.get(page)
    policy = dict(
        directive.strip().split(" ", 1)
        for directive in answer.headers["content-security-policy"].split(";")
    )
    sources = policy["script-src"].split()
    assert sources[0] == "'self'" and "'unsafe-inline'" not in sources, policy
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    inline = re.findall(r"<script>(.*?)</script>", answer.text, re.DOTALL)
    hashes = [
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in inline
    ]
    assert sources[1:] == hashes


async def test_swagger_ui_sends_the_schema_to_no_validator(settings: Settings) -> None:
    """Swagger UI's default validator badge fetches a public validator with the schema's
    address: off."""
    async with docs_client(settings) as client:
        html = (await client.get("/docs")).text
    assert '"validatorUrl": null' in html


async def test_the_docs_assets_are_open_with_a_token_but_the_api_is_not(
    settings: Settings,
) -> None:
    async with docs_client(settings) as client:
        schema = await client.get("/openapi.json")
        api = await client.get("/jobs")
        missing = await client.get(f"{DOCS_ASSETS}/nothing.js")
    assert schema.status_code == 200
    assert api.status_code == 401
    # A file the package does not ship is not an open path either.
    assert missing.status_code == 401


@pytest.mark.slow
def test_docs_render_in_a_browser_that_reaches_nothing_but_the_app(settings: Settings) -> None:
    """The page a new user opens first: Chromium, with every request to another origin
    refused (as on a machine without internet), draws the operations of /docs and the title
    of /redoc, and sent nothing elsewhere. (ReDoc's script asks for its vendor's logo from
    the vendor's CDN: /redoc's CSP stops that in the browser, which says so on its console.)"""
    from tests.test_dashboard import CHROMIUM, CHROMIUM_ARGS, serve  # skips without Chromium

    sync_api = pytest.importorskip("playwright.sync_api", exc_type=ImportError)
    app = create_app(settings.model_copy(update={"run_worker": False}))
    elsewhere: list[str] = []
    problems: list[str] = []
    with serve(app) as base, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()

            def only_the_app(route: Any) -> None:
                url = route.request.url
                if url.startswith((base + "/", "data:", "blob:")):
                    route.continue_()
                else:
                    elsewhere.append(url)
                    route.abort()

            def console(message: Any) -> None:
                blocked = "violates the following Content Security Policy" in message.text
                if message.type == "error" and not blocked:
                    problems.append(message.text)

            page.route("**/*", only_the_app)
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("console", console)
            page.goto(f"{base}/docs")
            sync_api.expect(page.locator(".swagger-ui .info .title")).to_contain_text(
                "notifyq", timeout=15_000
            )
            sync_api.expect(page.locator(".opblock-summary-path").first).to_be_visible()
            page.wait_for_load_state("networkidle")
            page.goto(f"{base}/redoc")
            sync_api.expect(page.locator("h1").first).to_contain_text("notifyq", timeout=15_000)
            page.wait_for_load_state("networkidle")
        finally:
            browser.close()
    assert elsewhere == []
    assert problems == []
