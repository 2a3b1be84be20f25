"""What an operator reads on the dashboard without clicking around (issue 32): an id of its own
for each job, wherever one is shown; each workflow job's ref; a failed job's error in the list,
at the top of its page and in its timeline; and a last-hour panel that says how much of the
hour it has. End to end in Debian's headless Chromium, as tests/test_dashboard.py."""

from __future__ import annotations

import re
from typing import Any

import httpx
import psycopg
import pytest

from notifyq.settings import Settings
from tests.test_dashboard import (  # the shared fixtures and helpers
    browser,
    dashboard_app,
    expect,
    job_rows,
    listed_job,
    node,
    page,
    queue_cell,
    serve,
)
from tests.test_dashboard_pages import expect_status, post_batch

# A browser each: in the full run, not in the quick one (-m 'not slow').
pytestmark = pytest.mark.slow

__all__ = ["browser", "page"]  # fixtures: imported to be found here

#: The window of the issue's report, where the error of a failed job was below the fold.
WIDE = {"width": 1400, "height": 900}
MESSAGE = "SMTP 550: mailbox unavailable"
WORKFLOW = [
    {"ref": "fetch", "task": "echo", "payload": {}},
    {"ref": "parse", "task": "echo", "payload": {}, "depends_on": ["fetch"]},
    {"ref": "store", "task": "echo", "payload": {}, "depends_on": ["parse"]},
    {"ref": "notify", "task": "echo", "payload": {}, "depends_on": ["parse"]},
]


def shown_ids(locator: Any) -> dict[str, str]:
    """The id each element of ``locator`` shows, by the id it stands for (its data-job-id, or
    its row's)."""
    found: dict[str, str] = locator.evaluate_all(
        """(els) => Object.fromEntries(els.map((el) => [
            el.closest("[data-job-id]").dataset.jobId, el.textContent]))"""
    )
    return found


def tells_apart(shown: dict[str, str]) -> None:
    """Each id shows its own text, the end of the id after an ellipsis (its start is the
    clock, the same for every job made in the same minute)."""
    assert len(set(shown.values())) == len(shown), shown
    for job_id, text in shown.items():
        assert text.startswith("…") and len(text) >= 9, text
        assert job_id.endswith(text[1:]), (job_id, text)


def test_each_job_shows_an_id_of_its_own_its_ref_and_its_error(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    page.set_viewport_size(WIDE)
    app = dashboard_app(settings.model_copy(update={"concurrency": 4}), monkeypatch)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        batch = [{"task": "echo", "payload": {"n": n}} for n in range(5)]
        assert client.post("/jobs/batch", json={"jobs": batch}).status_code == 200
        created = client.post("/workflows", json={"jobs": WORKFLOW})
        assert created.status_code == 201, created.text
        workflow_id, refs = created.json()["workflow_id"], created.json()["jobs"]
        failing = {"task": "fail", "payload": {"message": MESSAGE}, "max_attempts": 2}
        failed = client.post("/jobs", json=failing).json()["job_id"]
        page.goto(f"{base}/dashboard")
        expect(job_rows(page)).to_have_count(10)
        expect(queue_cell(page, "default", "completed")).to_have_attribute("data-value", "9")
        expect(queue_cell(page, "default", "failed")).to_have_attribute("data-value", "1")

        # The list: ten ids made within a second or two, ten different texts.
        in_list = shown_ids(page.locator("#jobs-body tr[data-job-id] td:first-child button"))
        tells_apart(in_list)
        row = listed_job(page, failed)
        expect(row.locator(".row-error")).to_have_text(f"RuntimeError: {MESSAGE}")
        assert listed_job(page, refs["fetch"]).locator(".row-error").count() == 0

        # The failed job's page: its error first, in view without scrolling; each failed
        # attempt's message in the timeline.
        row.click()
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "failed")
        top = page.locator('#detail [data-part="error"]')
        expect(top).to_contain_text(f"RuntimeError: {MESSAGE}")
        expect(top).to_contain_text("attempt 2 of 2")
        expect(top).to_be_in_viewport(ratio=1)
        attempts = page.locator('#detail ol.timeline li[data-event="attempt_failed"]')
        expect(attempts).to_have_count(2)
        for n in (0, 1):
            expect(attempts.nth(n)).to_contain_text(MESSAGE)

        # A toast names the job as the list does.
        page.locator("#btn-retry").click()
        expect(page.locator("#toast")).to_contain_text(f"Job {in_list[failed]} requeued.")

        # The workflow: four ids made in the same millisecond, four texts; each node its ref.
        page.goto(f"{base}/dashboard#workflow={workflow_id}")
        expect(page.locator("#wf-canvas .wf-node")).to_have_count(4)
        for ref, job_id in refs.items():
            expect(node(page, job_id).locator(".wf-ref")).to_have_text(ref)
            expect(node(page, job_id)).to_have_attribute("aria-label", re.compile(f"^Job {ref} "))
        in_graph = shown_ids(page.locator("#wf-canvas .wf-node .wf-id"))
        tells_apart(in_graph)
        assert all(in_graph[job_id] == in_list[job_id] for job_id in in_graph)  # one helper
        # Its page links back to the workflow by the same kind of id.
        node(page, refs["store"]).click()
        detail = page.locator("#detail")
        expect(detail.locator(".job-id")).to_have_text(refs["store"])
        link = detail.locator("[data-workflow-id]")
        expect(link).to_have_text(re.compile(r"^Show workflow …[0-9a-f]{8}"))
        assert workflow_id.endswith(link.inner_text().split("…")[1])
        depends = detail.get_by_role("button", name=re.compile("a dependency"))
        expect(depends).to_have_text(in_list[refs["parse"]])
        page.goto("about:blank")  # no stream left open while the server stops


def test_the_last_hour_says_how_many_minutes_a_fresh_database_has(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    """notifyq was installed two and a half minutes ago: the panel counts those minutes and
    says so, rather than calling the rest of the hour "still being counted"."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("UPDATE notifyq.migrations SET applied_at = now() - interval '150 seconds'")
    app = dashboard_app(settings, monkeypatch)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        batch = [{"task": "echo", "payload": {"n": n}} for n in range(3)]
        for job_id in post_batch(client, batch):
            expect_status(client, job_id, "completed")
        page.goto(f"{base}/dashboard")
        summary = page.locator("#hour-summary")
        expect(summary).to_have_attribute("data-completed", "3")
        # The minute of the install, the ones after it and the one under way: 3 or 4 of them,
        # depending on where in its minute the test runs.
        expect(summary).to_contain_text(re.compile(r"\b[34] minutes of data$"))
        expect(summary).not_to_contain_text("counted")
        bars = page.locator("#hour-chart g.hour-bar")
        expect(bars).to_have_count(61)
        covered = int(summary.get_attribute("data-minutes") or 0)
        expect(page.locator("#hour-chart g.hour-bar[data-before]")).to_have_count(61 - covered)
        before = page.locator("#hour-chart g.hour-bar[data-before] title").first
        expect(before).to_contain_text("before")
