"""The dashboard's script is native ES modules, no build step: each small enough to read in one
sitting, every import naming a module the app serves as JavaScript (a browser refuses a module
of another type, and one that is not served breaks the whole page), to the page without the
token; the imports go one way (no cycle), and every event on the bus has its answer in main.js.
No database: the app is built and asked without its lifespan."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest
from pydantic import SecretStr

from notifyq.api import create_app
from notifyq.api.routes.ops import DASHBOARD_MODULES
from notifyq.settings import Settings

STATIC = Path(__file__).resolve().parent.parent / "notifyq" / "static"
MODULES = STATIC / "dashboard"
MAX_LINES = 500
TOKEN = "modules-s3cret"
BASE = "http://127.0.0.1"
#: How the page loads its script: the entry module, relative to /dashboard.
ENTRY = "static/dashboard/main.js"
#: The only form of import the modules use: named bindings from a relative path.
IMPORT = re.compile(r'^import \{ ([$\w, ]+) \} from "(\./[\w-]+\.js)";$')
EXPORT = re.compile(r"^export (?:async function|function|const|let|class) ([$\w]+)")


def module_paths() -> list[Path]:
    return sorted(MODULES.glob("*.js"))


def imports(text: str) -> list[tuple[list[str], str]]:
    """(the names, the path) of each import; every other form fails the test."""
    found = []
    for line in text.splitlines():
        if re.match(r"\s*(import|export\s.*\sfrom)\b", line):
            match = IMPORT.match(line)
            assert match, f"an import the test does not read: {line}"
            found.append(([name.strip() for name in match[1].split(",")], match[2]))
    assert "import(" not in text, "a dynamic import"
    return found


def exports(text: str) -> set[str]:
    return {match[1] for line in text.splitlines() if (match := EXPORT.match(line))}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The app with a token set (the dashboard's files must not need it), never started."""
    settings = Settings.load(
        database_url="postgresql://127.0.0.1:9/never-connected",
        run_worker=False,
        auto_migrate=False,
        api_token=SecretStr(TOKEN),
    )
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        yield client


@pytest.mark.parametrize("path", module_paths(), ids=lambda path: path.name)
def test_each_dashboard_module_has_at_most_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines"


def test_the_modules_import_each_other_without_a_cycle() -> None:
    # Layered: helpers (dom, format, api, state, bus, messages) at the bottom, the views in the
    # middle, the poll, the router and main on top. A view that needs one above it (a refresh,
    # to open a job) emits an event on the bus, which main.js wires; it never imports upward.
    graph = {
        path.name: sorted({spec.removeprefix("./") for _, spec in imports(path.read_text())})
        for path in module_paths()
    }
    done: set[str] = set()
    on_path: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        if name in on_path:
            cycle = [*on_path[on_path.index(name) :], name]
            pytest.fail(f"an import cycle: {' -> '.join(cycle)}")
        on_path.append(name)
        for imported in graph[name]:
            visit(imported)
        on_path.pop()
        done.add(name)

    for name in graph:
        visit(name)


def test_every_event_a_module_emits_is_answered_once_in_main_and_nowhere_else() -> None:
    # bus.js throws on an event nobody answers; this finds one before a click does.
    emitted = {
        path.name: set(re.findall(r'\bemit\("([\w-]+)"', path.read_text()))
        for path in module_paths()
    }
    answered = re.findall(r'^\s*on\("([\w-]+)", ', (MODULES / "main.js").read_text(), re.M)
    assert len(answered) == len(set(answered)), answered
    assert set().union(*emitted.values()) == set(answered), (emitted, answered)
    for path in module_paths():
        if path.name != "main.js":
            assert not re.search(r'^\s*on\("', path.read_text(), re.M), path.name


def test_the_app_lists_every_module_and_the_page_loads_the_entry_as_a_module() -> None:
    assert sorted(DASHBOARD_MODULES) == [path.name for path in module_paths()]
    html = (STATIC / "dashboard.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == [f'<script type="module" src="{ENTRY}">']


async def test_every_import_names_a_module_the_app_serves_as_javascript_without_the_token(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/dashboard")
    assert page.status_code == 200, page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self';" in csp, csp  # the modules, from the app, and nothing else
    # From the entry, through every import: each served as JavaScript, each name exported.
    entry = urljoin(f"{BASE}/dashboard", ENTRY)
    seen: dict[str, str] = {}
    wanted: list[tuple[str, list[str], str]] = [(entry, [], "the page")]
    while wanted:
        url, names, importer = wanted.pop()
        if url not in seen:
            answer = await client.get(url)
            assert answer.status_code == 200, (url, importer, answer.text[:200])
            assert answer.headers["content-type"] == "text/javascript; charset=utf-8", url
            assert answer.headers["cache-control"] == "no-cache", url
            path = MODULES / url.rsplit("/", 1)[1]
            assert path.is_file() and answer.text == path.read_text(), url
            seen[url] = answer.text
            wanted += [(urljoin(url, spec), got, url) for got, spec in imports(answer.text)]
        missing = set(names) - exports(seen[url])
        assert not missing, f"{importer} imports {sorted(missing)}, which {url} does not export"
    # Every module of the folder is part of the page: none is left behind unused.
    assert sorted(url.rsplit("/", 1)[1] for url in seen) == sorted(DASHBOARD_MODULES)


async def test_the_page_and_its_style_are_served_without_the_token_and_the_api_is_not(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.get("/dashboard")).status_code == 200
    style = await client.get("/static/dashboard.css")
    assert style.status_code == 200
    assert style.headers["content-type"].startswith("text/css")
    assert (await client.get("/queues")).status_code == 401
