"""The dashboard's search, job page, bulk actions, queue states, workers, scheduled and cron pages
and narrow layout,
end to end: the real app and its in-process worker, driven by Playwright in Debian's headless
Chromium (as tests/test_dashboard.py, whose serving and browser fixtures these share)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from notifyq.builtins import worker_registry
from notifyq.retry import Backoff
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from tests.test_dashboard import (  # the shared fixtures and helpers
    browser,
    dashboard_app,
    expect,
    flaky_tasks,
    job_rows,
    listed_job,
    page,
    queue_cell,
    serve,
    stepper_tasks,
)

# A browser each: in the full run, not in the quick one (-m 'not slow').
pytestmark = pytest.mark.slow

__all__ = ["browser", "page"]  # fixtures: imported to be found here

NARROW = {"width": 420, "height": 860}
STATIC = Path(__file__).resolve().parent.parent / "notifyq" / "static"


def screenshot(page: Any, name: str) -> None:
    """With NOTIFYQ_SCREENSHOT=1, rewrites the README's picture of this page."""
    if os.environ.get("NOTIFYQ_SCREENSHOT") == "1":
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")  # counts shown
        page.screenshot(path=str(STATIC / f"dashboard-{name}.png"))


def post_batch(client: httpx.Client, jobs: list[dict[str, Any]]) -> list[str]:
    answer = client.post("/jobs/batch", json={"jobs": jobs})
    assert answer.status_code == 200, answer.text
    return [result["job_id"] for result in answer.json()["results"]]


def fits_the_width(page: Any) -> None:
    """Nothing on the page is wider than the viewport (tables scroll inside their boxes)."""
    overflow = page.evaluate(
        """() => {
            const width = document.documentElement.clientWidth;
            const wide = [...document.querySelectorAll("body *")].filter((el) => {
                if (el.closest(".table-wrap, .wf-graph, pre, dialog:not([open])")) return false;
                const box = el.getBoundingClientRect();
                return box.width > 0 && (box.right > width + 1 || box.left < -1);
            }).map((el) => `${el.tagName}#${el.id}.${el.className}`);
            return {scroll: document.documentElement.scrollWidth, width, wide: wide.slice(0, 5)};
        }"""
    )
    assert overflow["scroll"] <= overflow["width"], overflow
    assert not overflow["wide"], overflow


def test_filters_and_the_payload_search_stay_in_the_address(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    app = dashboard_app(settings, monkeypatch)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        jobs = [
            {"task": "echo", "queue": "emails", "payload": {"account": n % 3, "n": n}}
            for n in range(9)
        ]
        ids = post_batch(client, jobs)
        page.goto(f"{base}/dashboard")
        expect(job_rows(page)).to_have_count(9)

        page.get_by_label("Queue", exact=True).fill("emails")
        payload = page.locator("#f-payload")
        payload.fill('{"account": 1')
        payload.press("Enter")
        expect(page.locator("#f-payload-error")).to_contain_text("not JSON")
        expect(job_rows(page)).to_have_count(9)  # a bad filter is not sent
        payload.fill('{"account": 1}')
        payload.press("Enter")
        expect(job_rows(page)).to_have_count(3)
        expect(page.locator("#f-payload-error")).to_be_hidden()
        for n in (1, 4, 7):
            expect(listed_job(page, ids[n])).to_be_visible()
        expect(page).to_have_url(re.compile(r"queue=emails"))
        expect(page.locator("#jobs-count")).to_contain_text("found with that payload")

        # Reload, and a shared address: the same view.
        page.reload()
        expect(page.locator("#f-payload")).to_have_value('{"account": 1}')
        expect(page.get_by_label("Queue", exact=True)).to_have_value("emails")
        expect(job_rows(page)).to_have_count(3)
        hash_ = f"#status=completed&payload={quote(json.dumps({'n': 5}))}"
        page.goto(f"{base}/dashboard{hash_}")
        expect(job_rows(page)).to_have_count(1)
        expect(listed_job(page, ids[5])).to_be_visible()
        expect(page.get_by_label("Status", exact=True)).to_have_value("completed")

        # A job id opens that job's page, kept in the address.
        field = page.get_by_label("Job id")
        field.fill("not-an-id")
        field.press("Enter")
        expect(page.locator("#f-id-error")).to_contain_text("a whole job id")
        field.fill(ids[2].upper())
        field.press("Enter")
        expect(page.locator("#detail .job-id")).to_have_text(ids[2])
        expect(page).to_have_url(re.compile(f"job={ids[2]}"))
        page.reload()
        expect(page.locator("#detail .job-id")).to_have_text(ids[2])

        page.get_by_role("button", name="Clear").click()
        expect(job_rows(page)).to_have_count(9)
        expect(page).not_to_have_url(re.compile(r"payload="))


def test_job_page_shows_a_timeline_and_deletes_after_asking(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    app = dashboard_app(settings, monkeypatch)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        failing = {"task": "fail", "payload": {"message": "nope"}, "max_attempts": 2}
        (job_id,) = post_batch(client, [failing])
        page.goto(f"{base}/dashboard#job={job_id}")
        detail = page.locator("#detail")
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "failed")
        timeline = detail.locator("ol.timeline > li")
        expect(timeline.first).to_have_attribute("data-event", "created")
        expect(detail.locator('ol.timeline [data-event="attempt_failed"]')).to_have_count(2)
        expect(timeline.last).to_have_attribute("data-event", "finished")
        expect(timeline.last).to_contain_text("Ended failed")
        expect(detail.locator("ol.errors > li")).to_have_count(2)
        expect(detail.get_by_role("button", name="Cancel job")).to_be_hidden()

        # Delete asks first; keeping it changes nothing.
        detail.get_by_role("button", name="Delete job").click()
        dialog = page.locator("#confirm")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text(f"Delete job …{job_id[-8:]}?")
        dialog.get_by_role("button", name="Keep them").click()
        expect(dialog).to_be_hidden()
        assert client.get(f"/jobs/{job_id}").status_code == 200
        detail.get_by_role("button", name="Delete job").click()
        dialog.get_by_role("button", name="Delete job").click()
        expect(page.locator("#detail-empty")).to_be_visible()
        assert client.get(f"/jobs/{job_id}").status_code == 404


def test_bulk_actions_show_the_count_ask_and_act_on_every_matching_job(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    app = dashboard_app(settings.model_copy(update={"concurrency": 4}), monkeypatch, flaky_tasks())
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        flaky = [
            {"task": "flaky", "queue": "emails", "payload": {"key": f"k{n}"}, "max_attempts": 1}
            for n in range(6)
        ]
        other = {"task": "fail", "payload": {"message": "stays failed"}, "max_attempts": 1}
        flaky_ids = post_batch(client, [*flaky, other])[:6]
        page.goto(f"{base}/dashboard#status=failed")
        expect(job_rows(page)).to_have_count(7)
        page.get_by_label("Queue", exact=True).fill("emails")
        page.get_by_label("Queue", exact=True).press("Enter")
        expect(job_rows(page)).to_have_count(6)

        # The count first, then nothing unless confirmed.
        dialog = page.locator("#confirm")
        expect(page.locator("#bulk-cancel")).to_be_disabled()  # failed jobs: nothing to cancel
        page.get_by_role("button", name="Retry…").click()
        expect(dialog).to_contain_text("Retry 6 jobs?")
        expect(dialog).to_contain_text("Matching status failed, queue emails.")
        dialog.get_by_role("button", name="Keep them").click()
        assert len(client.get("/jobs", params={"status": "failed"}).json()["jobs"]) == 7
        page.get_by_role("button", name="Retry…").click()
        dialog.get_by_role("button", name="Retry 6 jobs").click()
        expect(page.locator("#toast")).to_contain_text("Requeued 6 jobs.")
        expect(job_rows(page)).to_have_count(0)  # they ran again, and completed
        for job_id in flaky_ids:
            expect_status(client, job_id, "completed")

        # Cancel the queued jobs of a task, then delete them.
        later = [{"task": "echo", "payload": {"later": n}, "delay": 600} for n in range(4)]
        later_ids = post_batch(client, later)
        page.goto(f"{base}/dashboard#status=queued&task=echo")
        expect(job_rows(page)).to_have_count(4)
        page.get_by_role("button", name="Cancel…").click()
        expect(dialog).to_contain_text("Cancel 4 jobs?")
        dialog.get_by_role("button", name="Cancel 4 jobs").click()
        expect(page.locator("#toast")).to_contain_text("Cancelled 4 jobs.")
        page.get_by_label("Status", exact=True).select_option("cancelled")
        expect(job_rows(page)).to_have_count(4)
        page.get_by_role("button", name="Delete…").click()
        expect(dialog).to_contain_text("Delete 4 jobs?")
        dialog.get_by_role("button", name="Delete 4 jobs").click()
        expect(page.locator("#toast")).to_contain_text("Deleted 4 jobs.")
        expect(job_rows(page)).to_have_count(0)
        assert all(client.get(f"/jobs/{i}").status_code == 404 for i in later_ids)
        # The job that failed on its own queue was never touched.
        assert len(client.get("/jobs", params={"status": "failed"}).json()["jobs"]) == 1


def expect_status(client: httpx.Client, job_id: str, status: str) -> None:
    deadline = time.monotonic() + 15
    while client.get(f"/jobs/{job_id}").json()["status"] != status:
        assert time.monotonic() < deadline, f"job {job_id} is not {status}"
        time.sleep(0.05)


def test_queue_states_say_why_and_the_workers_page_shows_what_each_runs(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    tasks, commands = stepper_tasks()
    app = dashboard_app(settings.model_copy(update={"concurrency": 2}), monkeypatch, tasks)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        try:
            post_batch(client, [{"task": "nobody_runs_this", "queue": "orphans", "payload": {}}])
            page.goto(f"{base}/dashboard")
            state = queue_cell(page, "orphans", "state")
            expect(state).to_have_attribute("data-why", "unregistered")
            expect(state).to_contain_text("task(s) no worker registered: nobody_runs_this")
            page.get_by_role("button", name="Pause queue orphans").click()
            expect(state).to_have_attribute("data-why", "paused")
            expect(state.locator(".badge")).to_have_text("paused")

            # The workers page: the in-process worker listens; then it runs a step job.
            page.get_by_role("button", name="Workers").click()
            expect(page).to_have_url(re.compile("view=workers"))
            rows = page.locator("#workers-body tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_have_attribute("data-listening", "1")
            expect(rows.first.locator('[data-col="queues"]')).to_contain_text("every queue")
            (step_id,) = post_batch(client, [{"task": "step", "payload": {"n": 1}}])
            expect(rows.first.locator('[data-col="running"]')).to_have_text("1")
            running = rows.first.get_by_role("button", name=re.compile(f"Open job …{step_id[-8:]}"))
            expect(running).to_be_visible()
            page.reload()  # the page is in the address
            expect(page.locator("#workers")).to_be_visible()
            expect(page.locator("#jobs-card")).to_be_hidden()
            running.click()
            expect(page.locator("#detail .job-id")).to_have_text(step_id)
            expect(page.locator("#detail-status")).to_have_attribute("data-value", "processing")
            commands.put(None)
            expect(page.locator("#detail-status")).to_have_attribute("data-value", "completed")
            expect(rows.first.locator('[data-col="running"]')).to_have_text("0")
            page.get_by_role("button", name="Jobs", exact=True).click()
            expect(page.locator("#jobs-card")).to_be_visible()
        finally:
            commands.put(None)


def later_tasks() -> Registry:
    """The built-ins plus ``flaky_later``, which always fails and waits 20 minutes to retry."""

    def flaky_later(payload: dict[str, Any]) -> None:
        raise RuntimeError("the upstream is down")

    backoff = Backoff(base=1200, cap=1200)
    return worker_registry(Registry([make_task(flaky_later, max_attempts=3, backoff=backoff)]))


def cron_tasks() -> Registry:
    """The built-ins plus ``every_minute``, a periodic task."""

    def every_minute(payload: dict[str, Any]) -> None: ...

    return worker_registry(Registry([make_task(every_minute, cron="* * * * *")]))


def scheduled_row(page: Any, job_id: str) -> Any:
    return page.locator(f'#scheduled-body tr[data-job-id="{job_id}"]')


def test_the_scheduled_page_lists_jobs_due_later_and_runs_or_cancels_them(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    app = dashboard_app(settings, monkeypatch, later_tasks())
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        mail, report, retried = post_batch(
            client,
            [
                {"task": "echo", "queue": "mail", "payload": {"to": "a"}, "delay": 600},
                {"task": "echo", "queue": "reports", "payload": {"r": 1}, "delay": 1800},
                {"task": "flaky_later", "payload": {}},
            ],
        )
        expect_queued_later(client, retried)
        page.goto(f"{base}/dashboard")
        page.get_by_role("button", name="Scheduled").click()
        expect(page).to_have_url(re.compile("view=scheduled"))
        rows = page.locator("#scheduled-body tr")
        expect(rows).to_have_count(3)
        expect(rows.first).to_have_attribute("data-job-id", mail)  # soonest first
        first = scheduled_row(page, mail)
        expect(first.locator('[data-col="due"]')).to_contain_text(re.compile(r"in (9|10) min"))
        expect(first.locator('[data-col="why"]')).to_have_text("first run")
        retry = scheduled_row(page, retried)
        expect(retry.locator('[data-col="why"]')).to_have_text("retry after error 1")
        expect(retry.locator('[data-col="attempt"]')).to_have_text("1/3")
        screenshot(page, "scheduled")

        # Filters, kept in the address.
        queue = page.get_by_label("Queue of scheduled jobs")
        queue.fill("reports")
        queue.press("Enter")
        expect(rows).to_have_count(1)
        expect(page).to_have_url(re.compile("squeue=reports"))
        page.reload()
        expect(queue).to_have_value("reports")
        expect(rows).to_have_count(1)
        page.locator("#s-clear").click()
        expect(rows).to_have_count(3)

        # Run now: due at once, and the worker runs it.
        page.get_by_role("button", name=f"Run job …{mail[-8:]} now").click()
        expect(page.locator("#toast")).to_contain_text(f"Job …{mail[-8:]} is due now.")
        expect(first).to_have_count(0)
        expect_status(client, mail, "completed")
        # Cancel asks first.
        page.get_by_role("button", name=f"Cancel job …{report[-8:]}").click()
        dialog = page.locator("#confirm")
        expect(dialog).to_contain_text(f"Cancel job …{report[-8:]}?")
        dialog.get_by_role("button", name="Cancel job").click()
        expect(scheduled_row(page, report)).to_have_count(0)
        assert client.get(f"/jobs/{report}").json()["status"] == "cancelled"
        # A job's page opens from its row.
        retry.get_by_role("button", name=f"Open job …{retried[-8:]}").click()
        expect(page.locator("#detail .job-id")).to_have_text(retried)
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "queued")
        # Its page runs it now too: it fails again, and waits for its third attempt.
        page.locator("#btn-run-now").click()
        expect(retry.locator('[data-col="why"]')).to_have_text("retry after error 2")
        expect(retry.locator('[data-col="attempt"]')).to_have_text("2/3")
        # Closed, so that its event stream does not hold the server's shutdown open.
        page.locator("#btn-close").click()
        expect(page.locator("#detail-empty")).to_be_visible()


def expect_queued_later(client: httpx.Client, job_id: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] == "queued" and job["attempt_count"] == 1:
            return
        assert time.monotonic() < deadline, f"job {job_id} did not go back to wait: {job}"
        time.sleep(0.05)


def test_the_cron_page_shows_each_periodic_task_and_one_no_worker_runs(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        # Registered by a worker three days ago, which has since stopped.
        conn.execute(
            "INSERT INTO notifyq.tasks (name, options, updated_at) VALUES"
            " ('nightly_report', '{\"cron\": \"30 2 * * *\"}', now() - interval '3 days')"
        )
    app = dashboard_app(settings, monkeypatch, cron_tasks())
    with serve(app) as base:
        page.goto(f"{base}/dashboard#view=cron")
        rows = page.locator("#cron-body tr")
        expect(rows).to_have_count(2)
        ticking = page.locator('#cron-body tr[data-task="every_minute"]')
        expect(ticking).to_have_attribute("data-state", "ok")
        expect(ticking.locator('[data-col="schedule"]')).to_contain_text("every minute")
        expect(ticking.locator('[data-col="next"]')).to_contain_text(re.compile(r"in \d"))
        stale = page.locator('#cron-body tr[data-task="nightly_report"]')
        expect(stale).to_have_attribute("data-state", "missed")
        expect(stale.locator('[data-col="state"]')).to_contain_text("no live worker")
        expect(stale.locator('[data-col="schedule"]')).to_contain_text("every day at 02:30 UTC")
        expect(page.locator("#cron-note")).to_contain_text("1 without a live worker")
        screenshot(page, "cron")
        # The last tick's job opens its page.
        link = ticking.get_by_role("button", name=re.compile("Open job .* of every_minute"))
        link.click()
        expect(page.locator("#detail .job-id")).to_have_text(re.compile(r"^[0-9a-f-]{36}$"))
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "completed")
        page.reload()
        expect(page.locator("#cron")).to_be_visible()


@pytest.mark.parametrize("view", ["jobs", "workers", "scheduled", "cron"])
def test_the_layout_fits_420_pixels(
    settings: Settings, page: Any, monkeypatch: Any, view: str
) -> None:
    page.set_viewport_size(NARROW)
    app = dashboard_app(settings, monkeypatch, cron_tasks() if view == "cron" else None)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        long_name = "a-queue-with-a-rather-long-name-for-a-phone"
        jobs = [
            {"task": "fail", "queue": long_name, "payload": {"m": "x" * 300}, "max_attempts": 1},
            {"task": "nobody_runs_this", "queue": "orphans", "payload": {"k": "v" * 200}},
            *({"task": "echo", "payload": {"n": n}} for n in range(5)),
            {"task": "echo", "queue": long_name, "payload": {"later": True}, "delay": 600},
        ]
        ids = post_batch(client, jobs)
        page.goto(f"{base}/dashboard#view={view}")
        expect(page.locator("#conn")).to_have_attribute("data-state", "live")
        expect(queue_cell(page, "orphans", "state")).to_have_attribute("data-why", "unregistered")
        if view == "workers":
            expect(page.locator("#workers-body tr")).to_have_count(1)
        elif view == "scheduled":
            expect(page.locator("#scheduled-body tr")).to_have_count(1)
        elif view == "cron":
            expect(page.locator("#cron-body tr")).to_have_count(1)
        else:
            expect(job_rows(page)).to_have_count(8)
            # One column: opening a job goes down to its page.
            listed_job(page, ids[2]).get_by_role("button").click()
            expect(page.locator("#detail .job-id")).to_have_text(ids[2])
            expect(page.locator("#detail-title")).to_be_in_viewport()
        fits_the_width(page)
        page.goto(f"{base}/dashboard#view={view}&job={ids[0]}")
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "failed")
        expect(page.locator("#detail ol.timeline > li").last).to_contain_text("Ended failed")
        fits_the_width(page)
        page.locator("#btn-delete").click()
        expect(page.locator("#confirm")).to_be_visible()
        fits_the_width(page)


def test_the_last_hour_chart_shows_the_minutes_the_database_counted(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    app = dashboard_app(settings, monkeypatch)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        jobs = [{"task": "echo", "payload": {"n": n}} for n in range(5)]
        ids = post_batch(client, [*jobs, {"task": "fail", "payload": {}, "max_attempts": 1}])
        for job_id in ids[:5]:
            expect_status(client, job_id, "completed")
        expect_status(client, ids[5], "failed")
        # Three of them ended five minutes ago, as far as the database knows.
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE notifyq.jobs SET finished_at = date_trunc('minute', now())"
                " - interval '5 minutes' + interval '10 seconds' WHERE id = ANY(%s)",
                [ids[:3]],
            )
        page.goto(f"{base}/dashboard")
        summary = page.locator("#hour-summary")
        expect(summary).to_have_attribute("data-completed", "5")
        expect(summary).to_have_attribute("data-failed", "1")
        bars = page.locator("#hour-chart g.hour-bar")
        expect(bars).to_have_count(61)
        expect(page.locator('#hour-chart g.hour-bar[data-completed="3"]')).to_have_count(1)
        expect(bars.last).to_have_attribute("data-partial", "1")
        # Another API process on the same database shows the same minutes.
        other = dashboard_app(settings.model_copy(update={"run_worker": False}), monkeypatch)
        with serve(other) as second:
            minutes = httpx.get(f"{second}/stats/minutes", timeout=10).json()["minutes"]
        assert sorted(m["completed"] for m in minutes if m["completed"])[-1:] == [3]
