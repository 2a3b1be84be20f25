"""The floor of the API: a bare FastAPI app whose one endpoint does one INSERT.

``POST /jobs`` validates ``{"task": ..., "payload": {...}}`` with a small pydantic model and
inserts it into ``bench.jobs`` (the queue-shaped table of :mod:`notifyq_bench.bare`, with the
same kind of notify trigger) through a psycopg pool of the size notifyq's API uses. Served by
one uvicorn process::

    NOTIFYQ_BENCH_CONNINFO=... python -m uvicorn notifyq_bench.bare_api:create_app --factory
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, status
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

CONNINFO_ENV = "NOTIFYQ_BENCH_CONNINFO"
POOL_SIZE_ENV = "NOTIFYQ_BENCH_POOL_SIZE"

INSERT = "INSERT INTO bench.jobs (task, payload) VALUES (%s, %s) RETURNING id"


class JobIn(BaseModel):
    task: str
    payload: dict[str, Any]


class JobOut(BaseModel):
    job_id: str


def create_app() -> FastAPI:
    """Builds the app from ``NOTIFYQ_BENCH_CONNINFO``."""
    conninfo = os.environ[CONNINFO_ENV]
    size = int(os.environ.get(POOL_SIZE_ENV, "10"))
    pool = AsyncConnectionPool(
        conninfo, min_size=size, max_size=size, open=False, kwargs={"autocommit": True}
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=True)
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/jobs", status_code=status.HTTP_201_CREATED)
    async def post_job(job: JobIn) -> JobOut:
        async with pool.connection() as conn:
            cursor = await conn.execute(INSERT, (job.task, Jsonb(job.payload)))
            row = await cursor.fetchone()
        assert row is not None
        return JobOut(job_id=str(row[0]))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    return app
