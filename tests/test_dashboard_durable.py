"""The dashboard and durable jobs, end to end in a browser (as tests/test_dashboard_pages.py):
a suspended job is listed with what it waits for, and its page draws its steps on the timeline
and says what it waits for."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from notifyq import JobContext
from notifyq.builtins import worker_registry
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from tests.test_dashboard import browser, dashboard_app, expect, page, serve

pytestmark = pytest.mark.slow

__all__ = ["browser", "page"]  # fixtures: imported to be found here


async def checkout(payload: dict[str, Any], ctx: JobContext) -> str:
    await ctx.step("charge", lambda: "ch_1")
    await ctx.step("email", lambda: "sent")
    webhook = await ctx.wait_for_signal("payment_webhook")
    return str(webhook["status"])


def test_a_suspended_job_is_listed_with_its_wait_and_its_steps_on_its_timeline(
    settings: Settings, page: Any, monkeypatch: Any
) -> None:
    tasks = worker_registry(Registry([make_task(checkout, "checkout")]))
    app = dashboard_app(settings, monkeypatch, tasks)
    with serve(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        job_id = client.post("/jobs", json={"task": "checkout", "payload": {}}).json()["job_id"]
        page.goto(f"{base}/dashboard#status=suspended")
        row = page.locator(f'#jobs-body tr[data-job-id="{job_id}"]')
        expect(row.locator('[data-col="status"]')).to_have_attribute("data-value", "suspended")
        expect(row.locator(".row-waits")).to_have_text("waits for signal payment_webhook")

        row.click()
        detail = page.locator("#detail")
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "suspended")
        expect(detail.locator("dl.fields")).to_contain_text("signal payment_webhook")
        steps = detail.locator('ol.timeline [data-event="step"]')
        expect(steps).to_have_count(2)
        expect(steps.first).to_contain_text("Step charge done")
        expect(steps.last).to_contain_text("Step email done")
        expect(detail.locator('ol.timeline [data-event="suspended"]')).to_have_count(1)

        sent = client.post(
            f"/jobs/{job_id}/signals/payment_webhook", json={"payload": {"status": "paid"}}
        )
        assert sent.status_code == 202, sent.text
        expect(page.locator("#detail-status")).to_have_attribute("data-value", "completed")
        expect(detail.locator('ol.timeline [data-event="step"]')).to_have_count(2)
