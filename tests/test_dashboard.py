"""The admin dashboard, end to end: the real app with its in-process worker on a real database,
served over HTTP by uvicorn, driven by Playwright in Debian's headless Chromium.

Needs /usr/bin/chromium (apt-get install chromium) and the playwright package (never
`playwright install`: the browser is the system's). NOTIFYQ_SCREENSHOT=1 also rewrites
notifyq/static/dashboard.png, the README's screenshot taken under load.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from psycopg import sql
from pydantic import SecretStr

from notifyq.api import application as api_module
from notifyq.api import create_app
from notifyq.api.routes.ops import DASHBOARD_MODULES
from notifyq.context import JobContext
from notifyq.settings import Settings
from notifyq.tasks import Registry
from tests.helpers import ROOT, registry

# A browser each: in the full run, not in the quick one (-m 'not slow').
pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "the dashboard test needs Debian's chromium at /usr/bin/chromium "
        "(apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api",
    reason="the dashboard test needs the playwright package (pip install playwright)",
    exc_type=ImportError,
)
expect = sync_api.expect

STATIC = ROOT / "notifyq" / "static"
SCREENSHOT = STATIC / "dashboard.png"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: What /dashboard is served with: the page loads its scripts and style from the app only.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
DASHBOARD_PATHS = frozenset(
    {"/dashboard", "/static/dashboard.css", *(f"/static/dashboard/{m}" for m in DASHBOARD_MODULES)}
)
TIMEOUT = 15_000  # ms, for every wait on the page
QUEUES = ("default", "emails", "reports")

expect.set_options(timeout=TIMEOUT)


# -- serving --------------------------------------------------------------------------------


def dashboard_app(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tasks: Registry | None = None
) -> FastAPI:
    """The app, with /dashboard and /static added (as the lead will in api.py) unless it has
    them already; the dashboard's own files are open with a token set, the API is not."""
    app = create_app(settings, registry=tasks)
    if not any(getattr(route, "path", None) == "/dashboard" for route in app.routes):
        monkeypatch.setattr(api_module, "OPEN_PATHS", api_module.OPEN_PATHS | DASHBOARD_PATHS)

        @app.get("/dashboard", include_in_schema=False)
        def dashboard() -> FileResponse:
            headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}
            return FileResponse(STATIC / "dashboard.html", headers=headers)

        app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Runs ``app`` (and so its worker) under uvicorn in a thread; answers its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", ws="none", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped while starting"
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            # The browser's own line for a request that failed (a 401 or 503 answered, or the
            # test's server already stopping while the page still polls): how the page handles
            # those is what the tests check; it is not an error of the page's code.
            and "status of" not in message.text
            and not message.text.startswith("Failed to load resource: net::")
            and problems.append(f"console: {message.text}")
        ),
    )
    yield page
    context.close()
    assert not problems, problems


# -- reading the page -----------------------------------------------------------------------


def queue_cell(page: Any, queue: str, col: str) -> Any:
    return page.locator(f'#queues-body tr[data-queue="{queue}"] [data-col="{col}"]')


def job_rows(page: Any) -> Any:
    return page.locator("#jobs-body tr[data-job-id]")


def flaky_tasks() -> Registry:
    """The built-ins plus ``flaky``, which fails the first attempt of each key and then
    succeeds."""
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def flaky(payload: dict[str, Any]) -> dict[str, Any]:
        with lock:
            calls[payload["key"]] += 1
            attempt = calls[payload["key"]]
        if attempt == 1:
            raise RuntimeError(f"flaky {payload['key']}: the first attempt fails")
        return {"ok": True, "attempt": attempt}

    return registry(flaky=flaky)


#: What the test tells a ``step`` job: report this progress, or (None) return.
Command = tuple[float | None, str | None] | None


def stepper_tasks() -> tuple[Registry, queue.Queue[Command]]:
    """The built-ins plus ``step``, whose job runs until the test says so, reporting the
    progress the test sends meanwhile; and the queue of those commands."""
    commands: queue.Queue[Command] = queue.Queue()

    def step(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        while True:
            # Bounded: a test that fails before releasing the job does not hold the worker.
            command = commands.get(timeout=60)
            if command is None:
                return {"stepped": True}
            ctx.progress(*command)

    return registry(step=step), commands


def listed_job(page: Any, job_id: str) -> Any:
    return page.locator(f'#jobs-body tr[data-job-id="{job_id}"]')


def node(page: Any, job_id: str) -> Any:
    return page.locator(f'#wf-canvas .wf-node[data-job-id="{job_id}"]')


def edges(page: Any) -> set[tuple[str, str]]:
    drawn = page.evaluate(
        """() => [...document.querySelectorAll("#wf-canvas .wf-edge")]
            .map((e) => [e.dataset.from, e.dataset.to])"""
    )
    return {(parent, child) for parent, child in drawn}


# -- the scenarios --------------------------------------------------------------------------


def test_dashboard_end_to_end(settings: Settings, page: Any, monkeypatch: Any) -> None:
    app = dashboard_app(settings.model_copy(update={"concurrency": 4}), monkeypatch, flaky_tasks())
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        page.goto(f"{base}/dashboard")
        expect(page.get_by_role("heading", name="Queues")).to_be_visible()
        expect(page.locator("#queues-empty")).to_be_visible()
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")

        # Enqueue and watch the counts move.
        batch = [{"task": "echo", "payload": {"n": n}} for n in range(20)]
        assert client.post("/jobs/batch", json={"jobs": batch}).status_code == 200
        expect(queue_cell(page, "default", "completed")).to_have_attribute("data-value", "20")
        expect(job_rows(page)).to_have_count(20)

        # Pause: a new job waits; resume: it runs.
        state = queue_cell(page, "default", "state")
        page.get_by_role("button", name="Pause queue default").click()
        expect(state).to_have_attribute("data-value", "paused")
        expect(state).to_contain_text("paused")
        client.post("/jobs", json={"task": "echo", "payload": {"while": "paused"}})
        expect(queue_cell(page, "default", "queued")).to_have_attribute("data-value", "1")
        expect(queue_cell(page, "default", "due")).to_have_attribute("data-value", "1")
        page.get_by_role("button", name="Resume queue default").click()
        expect(state).to_have_attribute("data-value", "active")
        expect(queue_cell(page, "default", "completed")).to_have_attribute("data-value", "21")

        # A failed job, whose error is user data: shown verbatim, never as markup.
        message = '<img src=x onerror="window.pwned=1"> boom & <b>bold</b>'
        failing = {"message": message, "note": "<script>window.pwned=2</script>"}
        client.post("/jobs", json={"task": "fail", "payload": failing, "max_attempts": 1})
        expect(queue_cell(page, "default", "failed")).to_have_attribute("data-value", "1")
        page.get_by_label("Status", exact=True).select_option("failed")
        expect(job_rows(page)).to_have_count(1)
        job_rows(page).first.click()
        detail = page.locator("#detail")
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "failed")
        expect(detail.locator("pre.error")).to_contain_text(f"RuntimeError: {message}")
        expect(detail.locator("pre.payload")).to_contain_text("<script>window.pwned=2</script>")
        expect(detail.get_by_role("heading", name="Errors (1)")).to_be_visible()
        assert detail.locator("img, b, script").count() == 0
        assert page.evaluate("window.pwned") is None
        expect(detail.get_by_role("button", name="Cancel job")).to_be_hidden()
        # Retry: it goes back, fails again, and both attempts' errors are listed.
        detail.get_by_role("button", name="Retry").click()
        expect(detail.get_by_role("heading", name="Errors (2)")).to_be_visible()
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "failed")

        # A job that fails once: retry makes it complete, its first error stays listed.
        client.post("/jobs", json={"task": "flaky", "payload": {"key": "a"}, "max_attempts": 1})
        expect(queue_cell(page, "default", "failed")).to_have_attribute("data-value", "2")
        flaky_row = job_rows(page).filter(has_text="flaky")
        expect(flaky_row).to_have_count(1)
        flaky_row.get_by_role("button").click()
        expect(detail.locator("pre.error")).to_contain_text(
            "RuntimeError: flaky a: the first attempt fails"
        )
        detail.get_by_role("button", name="Retry").click()
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "completed")
        expect(detail.locator("pre.result")).to_contain_text('"attempt": 2')
        expect(detail.get_by_role("heading", name="Errors (1)")).to_be_visible()
        expect(detail.get_by_role("button", name="Retry")).to_be_hidden()
        expect(job_rows(page)).to_have_count(1)  # the list (failed) follows live

        # Cancel a job that waits, then retry it: it runs at once.
        later = {"task": "echo", "payload": {"later": True}, "delay": 600}
        waiting = client.post("/jobs", json=later).json()["job_id"]
        page.get_by_label("Status", exact=True).select_option("queued")
        expect(job_rows(page)).to_have_count(1)
        page.locator(f'#jobs-body tr[data-job-id="{waiting}"]').click()
        detail.get_by_role("button", name="Cancel job").click()
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "cancelled")
        detail.get_by_role("button", name="Retry").click()
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "completed")

        # A job that failed every attempt lists each attempt's error.
        bounce = {"to": "ops@example.com", "message": "SMTP 550: mailbox unavailable"}
        client.post(
            "/jobs", json={"task": "fail", "queue": "emails", "payload": bounce, "max_attempts": 2}
        )
        # Its retry is due at most 0.2 s (the settings' retry cap) after the first attempt, and
        # the page reads the counts every 1.5 s: 5 s is plenty, and far short of the worker's
        # 30 s fallback poll, so a worker that missed the retry's run_at fails here.
        expect(queue_cell(page, "emails", "failed")).to_have_attribute(
            "data-value", "1", timeout=5_000
        )
        page.get_by_role("button", name="Show the failed jobs of queue emails").click()
        expect(page.get_by_label("Queue", exact=True)).to_have_value("emails")
        expect(job_rows(page)).to_have_count(1)
        job_rows(page).first.click()
        expect(detail.get_by_role("heading", name="Errors (2)")).to_be_visible()
        expect(detail.locator("ol.errors > li")).to_have_count(2)
        expect(detail.locator("ol.errors")).to_contain_text("Attempt 2")
        expect(detail).to_contain_text("2 of 2")

        # Under load: hundreds of jobs on three queues; the chart shows them flowing.
        page.get_by_role("button", name="Clear").click()
        expect(job_rows(page).first).to_contain_text("fail")
        load = [
            {"task": "sleep", "queue": QUEUES[n % 3], "payload": {"seconds": 0.05, "n": n}}
            for n in range(500)
        ]
        client.post("/jobs", json={"task": "echo", "queue": "reports", "payload": {}, "delay": 900})
        assert client.post("/jobs/batch", json={"jobs": load}).status_code == 200
        expect(page.locator('#queues-body tr[data-queue="emails"]')).to_be_visible()
        page.wait_for_function(
            """() => {
                const done = [...document.querySelectorAll('#queues-body [data-col="completed"]')]
                    .reduce((sum, td) => sum + Number(td.dataset.value), 0);
                return done >= 350 && Number(document.getElementById("chart").dataset.rate) > 0;
            }""",
            timeout=TIMEOUT,
        )
        expect(page.locator("#chart-summary")).to_contain_text("jobs/s now")
        if os.environ.get("NOTIFYQ_SCREENSHOT") == "1":
            page.mouse.move(1275, 795)  # no hover effect in the picture
            page.screenshot(path=str(SCREENSHOT))
        for queue, count in (("default", 167 + 23), ("emails", 167), ("reports", 166)):
            expect(queue_cell(page, queue, "completed")).to_have_attribute(
                "data-value", str(count), timeout=30_000
            )

        # The list pages through next_cursor.
        expect(job_rows(page)).to_have_count(50)
        page.get_by_role("button", name="Load more").click()
        expect(job_rows(page)).to_have_count(100)
        expect(page.locator("#jobs-count")).to_contain_text("100 jobs shown")


def test_dashboard_asks_for_the_token(settings: Settings, page: Any, monkeypatch: Any) -> None:
    secret = "s3cret-token"
    settings = settings.model_copy(update={"api_token": SecretStr(secret), "run_worker": False})
    app = dashboard_app(settings, monkeypatch)
    headers = {"Authorization": f"Bearer {secret}"}
    with serve(app) as base, httpx.Client(base_url=base, timeout=10, headers=headers) as client:
        assert client.post("/jobs", json={"payload": {}, "queue": "mail"}).status_code == 201
        page.goto(f"{base}/dashboard")
        expect(page.get_by_role("heading", name="API token required")).to_be_visible()
        expect(page.locator("#app")).to_be_hidden()

        page.get_by_role("textbox", name="API token").fill("wrong")
        page.get_by_role("button", name="Connect").click()
        expect(page.locator("#auth-message")).to_contain_text("refused")
        expect(page.locator("#app")).to_be_hidden()

        page.get_by_role("textbox", name="API token").fill(secret)
        page.get_by_role("button", name="Connect").click()
        expect(queue_cell(page, "mail", "queued")).to_have_attribute("data-value", "1")
        expect(page.locator("#auth")).to_be_hidden()
        assert page.evaluate("sessionStorage.getItem('notifyq.apiToken')") == secret

        # The tab keeps it: a reload asks nothing.
        page.reload()
        expect(queue_cell(page, "mail", "queued")).to_have_attribute("data-value", "1")
        expect(page.locator("#auth")).to_be_hidden()
        # The detail follows the (queued) job through its event stream, which needs the token
        # as a header (EventSource could not send one).
        job_rows(page).first.click()
        expect(page.locator("#detail")).to_have_attribute("data-stream", "live")
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "queued")
        # Forgetting it asks again (and closes the stream).
        page.get_by_role("button", name="Forget token").click()
        expect(page.get_by_role("heading", name="API token required")).to_be_visible()
        expect(page.locator("#detail")).not_to_have_attribute("data-stream", "live")


def test_dashboard_shows_a_banner_while_the_database_is_away(
    settings: Settings, db_url: str, server_url: str, page: Any, monkeypatch: Any
) -> None:
    settings = settings.model_copy(update={"run_worker": False, "connect_timeout": 1.0})
    name = urlsplit(db_url).path.lstrip("/")
    refuse, allow = (
        sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(sql.Identifier(name), sql.SQL(b))
        for b in ("false", "true")
    )
    with serve(dashboard_app(settings, monkeypatch)) as base:
        httpx.post(f"{base}/jobs", json={"payload": {}}, timeout=10)
        page.goto(f"{base}/dashboard")
        queued = queue_cell(page, "default", "queued")
        expect(queued).to_have_attribute("data-value", "1")
        banner = page.locator("#banner")
        expect(banner).to_be_hidden()
        with psycopg.connect(server_url, autocommit=True) as admin:
            try:
                admin.execute(refuse)
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    [name],
                )
                expect(banner).to_contain_text("Database unavailable")
                expect(page.locator("#conn")).to_have_attribute("data-state", "down")
                expect(queued).to_have_attribute("data-value", "1")  # the last data stays
            finally:
                admin.execute(allow)
        expect(banner).to_be_hidden()
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")


def test_dashboard_shows_the_first_page_of_queues_and_says_so(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    # GET /queues answers 500 queues a page: the dashboard shows that page, and says it is one.
    settings = settings.model_copy(update={"run_worker": False})
    with psycopg.connect(settings.database_url or "", autocommit=True) as admin:
        admin.execute(
            "INSERT INTO notifyq.queues (name) SELECT format('q%s', lpad(n::text, 4, '0')) "
            "FROM generate_series(1, 501) AS n"
        )
    with serve(dashboard_app(settings, monkeypatch)) as base:
        page.goto(f"{base}/dashboard")
        expect(page.locator("#queues-note")).to_contain_text("the first 500 queues by name")
        expect(page.locator("#queues-body tr[data-queue]")).to_have_count(500)
        expect(page.locator('#queues-body tr[data-queue="q0500"]')).to_have_count(1)


#: The workflow of the next test: b runs until the test ends it; c and e wait for it.
GROUP = "tenant <b>7</b>"  # user data: shown verbatim, never as markup
WORKFLOW = [
    {"ref": "a", "task": "echo", "payload": {"ref": "a"}},
    {"ref": "b", "task": "step", "payload": {"ref": "b"}, "depends_on": ["a"]},
    {"ref": "c", "task": "echo", "payload": {"ref": "c"}, "depends_on": ["b"]},
    {"ref": "d", "task": "echo", "payload": {"ref": "d"}, "depends_on": ["a"], "group_key": GROUP},
    {"ref": "e", "task": "echo", "payload": {"ref": "e"}, "depends_on": ["b", "d"]},
]  # fmt: skip
EDGES = [("a", "b"), ("b", "c"), ("a", "d"), ("b", "e"), ("d", "e")]
LAYERS = {"a": "0", "b": "1", "c": "2", "d": "1", "e": "2"}


def test_dashboard_shows_waiting_groups_progress_and_a_live_workflow(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    tasks, commands = stepper_tasks()
    app = dashboard_app(settings.model_copy(update={"concurrency": 4}), monkeypatch, tasks)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        try:
            created = client.post("/workflows", json={"jobs": WORKFLOW})
            assert created.status_code == 201, created.text
            workflow_id, ids = created.json()["workflow_id"], created.json()["jobs"]
            page.goto(f"{base}/dashboard")
            list_shows_waiting_jobs_and_group_keys(page, ids)
            progress_follows_in_the_list_and_live_in_the_detail(page, ids, commands)
            page.locator("#detail").get_by_role(
                "button", name=f"Show workflow …{workflow_id[-8:]}"
            ).click()
            expect(page).to_have_url(re.compile(f"#workflow={workflow_id}"))
            workflow_view_shows_the_graph_live(page, ids, commands)
            expect(page).to_have_url(re.compile(f"workflow={workflow_id}&job={ids['c']}"))

            # The view is addressable: a reload shows the same workflow and job.
            page.reload()
            expect(node(page, ids["e"])).to_have_attribute("data-status", "completed")
            expect(node(page, ids["c"])).to_have_class(re.compile(r"\bselected\b"))
            expect(page.locator("#detail-status")).to_have_attribute("data-value", "cancelled")
            expect(page.locator("#jobs-card")).to_be_hidden()
            page.get_by_role("button", name="Back to jobs").click()
            expect(page.locator("#workflow")).to_be_hidden()
            expect(job_rows(page)).to_have_count(5)
        finally:
            for _ in range(3):
                commands.put(None)  # whatever the step job waits for, it ends
            page.goto("about:blank")  # no stream left open while the server stops


def list_shows_waiting_jobs_and_group_keys(page: Any, ids: dict[str, str]) -> None:
    """a and d ran, b runs, c and e wait: counted, filtered and listed as waiting; d's group
    key is shown, and lists its group."""
    expect(queue_cell(page, "default", "processing")).to_have_attribute("data-value", "1")
    expect(queue_cell(page, "default", "waiting")).to_have_attribute("data-value", "2")
    expect(page.locator('#tiles [data-tile="waiting"]')).to_have_attribute("data-value", "2")
    page.get_by_label("Status", exact=True).select_option("waiting")
    expect(job_rows(page)).to_have_count(2)
    for ref in "ce":
        status = listed_job(page, ids[ref]).locator('[data-col="status"]')
        expect(status).to_have_attribute("data-value", "waiting")
    page.get_by_role("button", name="Clear").click()

    group_cell = listed_job(page, ids["d"]).locator('[data-col="group"]')
    expect(group_cell).to_have_text(GROUP)
    group_cell.get_by_role("button").click()
    expect(page.get_by_label("Group", exact=True)).to_have_value(GROUP)
    expect(job_rows(page)).to_have_count(1)
    expect(listed_job(page, ids["d"])).to_be_visible()
    page.get_by_role("button", name="Clear").click()


def progress_follows_in_the_list_and_live_in_the_detail(
    page: Any, ids: dict[str, str], commands: queue.Queue[Command]
) -> None:
    commands.put((0.25, "a quarter"))
    expect(listed_job(page, ids["b"]).locator("progress")).to_have_attribute("value", "0.25")
    listed_job(page, ids["b"]).click()
    detail = page.locator("#detail")
    expect(detail).to_have_attribute("data-stream", "live")
    expect(detail.locator("progress")).to_have_attribute("value", "0.25")
    commands.put((0.5, "half way"))
    expect(detail.locator("progress")).to_have_attribute("value", "0.5")
    expect(detail.locator(".progress-text")).to_have_text("50 % · half way")


def workflow_view_shows_the_graph_live(
    page: Any, ids: dict[str, str], commands: queue.Queue[Command]
) -> None:
    """Every job with its status and layer, the edges; the running node's bar; a cancel made
    here and a completion made elsewhere, both shown without a reload."""
    expect(page.locator("#workflow")).to_be_visible()
    expect(page.locator("#wf-status")).to_have_attribute("data-value", "running")
    expect(page.locator("#wf-canvas .wf-node")).to_have_count(5)
    statuses = {"a": "completed", "b": "processing", "c": "waiting", "d": "completed"}
    for ref, layer in LAYERS.items():
        expect(node(page, ids[ref])).to_have_attribute("data-status", statuses.get(ref, "waiting"))
        expect(node(page, ids[ref])).to_have_attribute("data-layer", layer)
    assert edges(page) == {(ids[parent], ids[child]) for parent, child in EDGES}
    into_b = page.locator(f'#wf-canvas .wf-edge[data-to="{ids["b"]}"]')
    expect(into_b).to_have_attribute("data-state", "done")

    # The running node's bar follows ctx.progress; with only a message, it is indeterminate.
    bar = node(page, ids["b"]).locator("progress")
    expect(bar).to_have_attribute("value", "0.5")
    commands.put((0.75, None))
    expect(bar).to_have_attribute("value", "0.75")
    commands.put((None, "thinking"))
    expect(node(page, ids["b"]).locator("progress:indeterminate")).to_have_count(1)
    expect(node(page, ids["b"])).to_have_attribute("aria-label", re.compile("thinking"))

    # A node opens its job; cancelling it (it waits) shows at once, and the workflow is
    # cancelled while its other branch still runs.
    node(page, ids["c"]).click()
    expect(page.locator("#detail-status")).to_have_attribute("data-value", "waiting")
    page.locator("#detail").get_by_role("button", name="Cancel job").click()
    expect(node(page, ids["c"])).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#wf-status")).to_have_attribute("data-value", "cancelled")

    # A change made elsewhere shows up live: b ends, so e runs; then the polling stops.
    commands.put(None)
    expect(node(page, ids["b"])).to_have_attribute("data-status", "completed")
    expect(node(page, ids["b"]).locator("progress")).to_have_count(0)
    expect(node(page, ids["e"])).to_have_attribute("data-status", "completed")
    expect(page.locator("#workflow")).to_have_attribute("data-live", "")
    assert page.locator("#wf-canvas b, #jobs-body b").count() == 0
