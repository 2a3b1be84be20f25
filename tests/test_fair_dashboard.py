"""The fair keys on the dashboard and in the metrics (issue 27): GET /stats/fair-keys answers the
busiest keys of each queue with their jobs queued and running and their weight, bounded and
behind the token; ``notifyq_fair_key_jobs`` shows only the busiest MAX_FAIR_KEYS keys, from the
API's /metrics and a worker's own port alike, and a key that leaves them leaves the output; the
dashboard's Fair keys panel shows them, verbatim, in Debian's Chromium (as tests/test_dashboard.py,
whose page this shares)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from notifyq import Queue
from notifyq.metrics import MAX_FAIR_KEYS, Metrics
from notifyq.settings import Settings
from notifyq.worker import _maintenance
from notifyq.worker._maintenance import DepthReport
from tests.helpers import wait_until
from tests.test_dashboard_api import api

FAMILY = "notifyq_fair_key_jobs"
#: A fair key as a client may write it: shown as text, never as markup.
MARKUP_KEY = '<img src="x" onerror="window.pwned = 1">tenant & co'


async def insert(
    conn: Any, key: str | None, n: int, queue: str = "default", task: str = "echo"
) -> None:
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue, fair_key) "
        "SELECT %s, %s, %s FROM generate_series(1, %s)",
        [task, queue, key, n],
    )


async def claim(conn: Any, task: str, limit: int) -> None:
    """Makes ``limit`` queued jobs of ``task`` processing, as a worker's claim does."""
    cursor = await conn.execute(
        "SELECT count(*) FROM notifyq.claim_v4('test', ARRAY[%s], NULL, %s, 30, false)",
        [task, limit],
    )
    row = await cursor.fetchone()
    assert row is not None and row[0] == limit


def fair_series(text: str) -> dict[tuple[str, str, str], float]:
    """The samples of FAMILY in the Prometheus text ``text``, by (queue, fair_key, state)."""
    return {
        (s.labels["queue"], s.labels["fair_key"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == FAMILY
    }


def keys_of(series: dict[tuple[str, str, str], float]) -> set[str]:
    return {key for _, key, _ in series}


async def a_flood_of_keys(conn: Any) -> None:
    """Keys k0 to k24 on queue ``q``, key kN with N + 1 queued jobs: the busiest 20 are k5
    to k24."""
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue, fair_key) "
        "SELECT 'echo', 'q', 'k' || n FROM generate_series(0, 24) AS n, generate_series(0, n)"
    )


async def a_turn_of_the_tide(conn: Any) -> None:
    """k0 to k4 become the busiest, and k24 has no job left: k5 to k8 (their jobs still queued)
    and k24 leave the busiest 20."""
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue, fair_key) "
        "SELECT 'echo', 'q', 'k' || n FROM generate_series(0, 4) AS n, generate_series(1, 100)"
    )
    await conn.execute("DELETE FROM notifyq.jobs WHERE fair_key = 'k24'")


AFTER_THE_TIDE = {f"k{n}" for n in (*range(5), *range(9, 24))}


# -- GET /stats/fair-keys -------------------------------------------------------------------


async def test_the_route_answers_each_queues_busiest_keys_with_their_counts_and_weight(
    settings: Settings, conn: Any
) -> None:
    await insert(conn, "globex", 3, task="busy")
    await claim(conn, "busy", 2)
    await insert(conn, "acme", 3, queue="emails")
    await insert(conn, "acme", 1, queue="reports")
    await insert(conn, None, 5)  # no key: not listed
    await insert(conn, "gone", 2, task="done")
    await conn.execute("DELETE FROM notifyq.jobs WHERE fair_key = 'gone'")  # none left
    await conn.execute("INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES ('globex', 2.5)")
    async with api(settings) as client:
        answer = await client.get("/stats/fair-keys")
        top = await client.get("/stats/fair-keys", params={"limit": 1})
    assert answer.status_code == 200, answer.text
    # Most jobs queued and running first; a tie by queue, then key.
    assert answer.json() == {
        "keys": [
            {"queue": "default", "fair_key": "globex", "queued": 1, "running": 2, "weight": 2.5},
            {"queue": "emails", "fair_key": "acme", "queued": 3, "running": 0, "weight": 1.0},
            {"queue": "reports", "fair_key": "acme", "queued": 1, "running": 0, "weight": 1.0},
        ]
    }
    assert top.status_code == 200, top.text
    assert top.json()["keys"] == answer.json()["keys"][:1]


async def test_the_route_answers_20_keys_by_default_and_100_at_most(
    settings: Settings, conn: Any
) -> None:
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, fair_key) SELECT 'echo', 'k' || n "
        "FROM generate_series(1, 120) AS n"
    )
    async with api(settings) as client:
        default = await client.get("/stats/fair-keys")
        most = await client.get("/stats/fair-keys", params={"limit": 100})
        refused = {
            value: await client.get("/stats/fair-keys", params={"limit": value})
            for value in ("0", "-1", "101", "1000000", "many")
        }
    assert len(default.json()["keys"]) == 20
    assert len(most.json()["keys"]) == 100
    for value, answer in refused.items():
        assert answer.status_code == 422, (value, answer.text)
        (problem,) = answer.json()["detail"]
        assert problem["loc"] == ["query", "limit"], (value, problem)
    assert "less than or equal to 100" in refused["101"].text
    assert "greater than or equal to 1" in refused["0"].text


async def test_the_route_needs_the_token_when_one_is_set(settings: Settings, conn: Any) -> None:
    await insert(conn, "acme", 1)
    async with api(settings, api_token=SecretStr("s3cret")) as client:
        refused = await client.get("/stats/fair-keys")
        wrong = await client.get("/stats/fair-keys", headers={"authorization": "Bearer nope"})
        right = await client.get("/stats/fair-keys", headers={"authorization": "Bearer s3cret"})
    assert refused.status_code == 401 and "detail" in refused.json()
    assert wrong.status_code == 403 and "detail" in wrong.json()
    assert right.status_code == 200 and len(right.json()["keys"]) == 1


# -- notifyq_fair_key_jobs ------------------------------------------------------------------


def test_the_gauges_keep_the_first_20_keys_of_a_reading_and_forget_the_reading_before() -> None:
    metrics = Metrics()
    rows = [
        {"queue": "q", "fair_key": f"k{n}", "queued": n, "running": 1, "weight": 1.0}
        for n in range(MAX_FAIR_KEYS + 10)
    ]
    metrics.set_fair_keys(rows)
    series = fair_series(metrics.render().decode())
    assert len(series) == 2 * MAX_FAIR_KEYS
    assert keys_of(series) == {f"k{n}" for n in range(MAX_FAIR_KEYS)}
    assert series["q", "k7", "queued"] == 7 and series["q", "k7", "running"] == 1
    metrics.set_fair_keys(rows[-1:])
    assert fair_series(metrics.render().decode()) == {
        ("q", rows[-1]["fair_key"], "queued"): rows[-1]["queued"],
        ("q", rows[-1]["fair_key"], "running"): 1,
    }
    metrics.set_fair_keys([])
    assert fair_series(metrics.render().decode()) == {}


async def test_the_api_metrics_show_the_busiest_keys_and_a_key_that_leaves_them_goes(
    settings: Settings, conn: Any
) -> None:
    await a_flood_of_keys(conn)
    async with api(settings) as client:
        series = fair_series((await client.get("/metrics")).text)
        assert len(keys_of(series)) == MAX_FAIR_KEYS and len(series) == 2 * MAX_FAIR_KEYS
        assert keys_of(series) == {f"k{n}" for n in range(5, 25)}
        assert series["q", "k24", "queued"] == 25 and series["q", "k24", "running"] == 0

        await a_turn_of_the_tide(conn)

        async def tide_turned() -> dict[tuple[str, str, str], float] | None:
            # Read again once the last reading is DEPTH_MAX_AGE old.
            now = fair_series((await client.get("/metrics")).text)
            return now if keys_of(now) != keys_of(series) else None

        series = await wait_until(tide_turned, timeout=10, interval=0.1)
    assert keys_of(series) == AFTER_THE_TIDE and len(series) == 2 * MAX_FAIR_KEYS
    assert series["q", "k0", "queued"] == 101 and series["q", "k9", "queued"] == 10


async def test_a_workers_own_metrics_show_the_busiest_keys_and_a_key_that_leaves_them_goes(
    db_url: str, conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_maintenance, "DEPTH_INTERVAL", 0.05)
    await insert(conn, MARKUP_KEY, 30, queue="web", task="busy")
    await claim(conn, "busy", 4)
    await a_flood_of_keys(conn)
    metrics = Metrics()

    def series() -> dict[tuple[str, str, str], float]:
        return fair_series(metrics.render().decode())

    async with Queue(db_url) as q, anyio.create_task_group() as tg:
        await tg.start(DepthReport(q.store, metrics).run)
        first = await wait_until(series)
        assert len(first) == 2 * MAX_FAIR_KEYS
        assert first["web", MARKUP_KEY, "queued"] == 26 and first["web", MARKUP_KEY, "running"] == 4
        assert keys_of(first) == {MARKUP_KEY, *(f"k{n}" for n in range(6, 25))}

        await conn.execute("DELETE FROM notifyq.jobs WHERE queue = 'web'")
        await a_turn_of_the_tide(conn)
        later = await wait_until(lambda: keys_of(series()) == AFTER_THE_TIDE and series())
        tg.cancel_scope.cancel()
    assert len(later) == 2 * MAX_FAIR_KEYS


# -- the dashboard's panel, in a browser ----------------------------------------------------


@pytest.fixture
def dashboard() -> ModuleType:
    """tests/test_dashboard.py, whose app and server this file's browser tests use: imported
    here, not at the top, since it skips itself (and would skip every test of this file)
    without Chromium or Playwright."""
    return importlib.import_module("tests.test_dashboard")


@pytest.fixture
def page(dashboard: ModuleType) -> Iterator[Any]:
    """A page of Debian's Chromium, as tests/test_dashboard.py's: an error of the page's code
    fails the test."""
    with dashboard.sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(dashboard.CHROMIUM), args=dashboard.CHROMIUM_ARGS
        )
        try:
            context = chromium.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on(
                "console",
                lambda message: (
                    message.type == "error"
                    # A request that failed (the server stopping while the page polls).
                    and "status of" not in message.text
                    and not message.text.startswith("Failed to load resource: net::")
                    and problems.append(f"console: {message.text}")
                ),
            )
            yield page
            context.close()
        finally:
            chromium.close()
    assert not problems, problems


def fair_row(page: Any, queue: str, key: str) -> Any:
    rows = page.locator("#fair-body tr")
    return rows.filter(has=page.locator(f'[data-col="queue"][title="{queue}"]')).filter(
        has=page.get_by_text(key, exact=True)
    )


@pytest.mark.slow
def test_the_panel_shows_the_busiest_keys_verbatim_and_stays_hidden_without_any(
    settings: Settings, dashboard: ModuleType, page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect = dashboard.expect
    tasks, commands = dashboard.stepper_tasks()
    app = dashboard.dashboard_app(settings, monkeypatch, tasks)
    with (
        dashboard.serve(app) as base,
        httpx.Client(base_url=base, timeout=10) as client,
        psycopg.connect(settings.database_url or "", autocommit=True) as db,
    ):
        try:
            client.post("/jobs", json={"task": "nobody", "payload": {}}).raise_for_status()
            page.goto(f"{base}/dashboard")
            expect(page.locator('#queues-body tr[data-queue="default"]')).to_have_count(1)
            expect(page.locator("#conn")).to_have_attribute("data-state", "live")
            expect(page.locator("#fair")).to_be_hidden()  # no job has a fair_key

            jobs = [
                *({"task": "nobody", "queue": "emails", "fair_key": "acme"} for _ in range(3)),
                {"task": "nobody", "queue": "emails", "fair_key": MARKUP_KEY},
                {"task": "step", "fair_key": "acme"},
            ]
            answer = client.post("/jobs/batch", json={"jobs": [{**j, "payload": {}} for j in jobs]})
            assert answer.status_code == 200, answer.text
            db.execute("INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES ('acme', 3)")

            panel = page.locator("#fair")
            expect(panel).to_be_visible()
            expect(page.locator("#fair-body tr")).to_have_count(3)
            acme = fair_row(page, "emails", "acme")
            expect(acme.locator('[data-col="queued"]')).to_have_text("3")
            expect(acme.locator('[data-col="running"]')).to_have_text("0")
            expect(acme.locator('[data-col="weight"]')).to_have_text("3")
            running = fair_row(page, "default", "acme")
            expect(running.locator('[data-col="running"]')).to_have_text("1")
            expect(running.locator('[data-col="queued"]')).to_have_text("0")
            marked = fair_row(page, "emails", MARKUP_KEY)
            expect(marked.locator('[data-col="fair_key"]')).to_have_text(MARKUP_KEY)
            expect(marked.locator('[data-col="weight"]')).to_have_text("1")
            assert panel.locator("img").count() == 0
            assert page.evaluate("() => window.pwned") is None
            expect(page.locator("#fair-note")).to_have_text("3 keys: 4 queued, 1 running")
            expect(page.locator("#fair-empty")).to_be_hidden()

            # Once none is left, the panel says so instead of vanishing.
            commands.put(None)
            db.execute("DELETE FROM notifyq.jobs WHERE task = 'nobody'")
            expect(page.locator("#fair-empty")).to_be_visible()
            expect(page.locator("#fair-empty")).to_have_text(
                "No queued or running job has a fair_key."
            )
            expect(page.locator("#fair-body tr")).to_have_count(0)
            expect(panel).to_be_visible()
        finally:
            commands.put(None)
