"""GET /queues and GET /queues/states answer pages (issue 29: 519 KB at 2,000 queues, polled by
the dashboard): at most ``limit`` queues by name (500 by default, 1,000 at most), after
``after``, and a Link header to the next page while there is one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from notifyq.api import create_app
from notifyq.settings import Settings


@asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client,
    ):
        yield client


async def test_every_queue_list_is_paged_and_links_its_next_page(
    settings: Settings, conn: Any
) -> None:
    await conn.execute(
        "INSERT INTO notifyq.queues (name) SELECT format('q%s', lpad(n::text, 4, '0')) "
        "FROM generate_series(1, 601) AS n"
    )
    async with api(settings) as client:
        for route in ("/queues", "/queues/states"):
            first = await client.get(route)
            assert first.status_code == 200
            assert len(first.json()) == 500 and 'rel="next"' in first.headers["link"]
            names: list[str] = []
            url: str | None = f"{route}?limit=250"
            while url is not None:
                page = await client.get(url)
                assert page.status_code == 200 and len(page.json()) <= 250
                names += [row["queue"] for row in page.json()]
                link = page.headers.get("link")
                url = link[1 : link.index(">")] if link else None
            assert names == sorted(names) and len(set(names)) == len(names) == 601, route
            for bad in ("limit=0", "limit=1001", "after=" + "x" * 201):
                assert (await client.get(f"{route}?{bad}")).status_code == 422, bad
