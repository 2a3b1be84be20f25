"""The README's recipes, run as the README shows them: each test takes its code block (found by
its first line, a file name) from README.md, so that what is documented is what is tested.

SQLAlchemy (a Session and an AsyncSession writing the job in their transaction), FastAPI (a
dependency giving the app's Queue, the job committed with the rows before the answer, driven
through httpx's ASGI transport with the app's lifespan), and
the Celery section's tasks and canvas run by a real worker."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest

from notifyq import Queue, SyncQueue
from tests.helpers import ROOT, notifyq_env, processes
from tests.readme import readme_block

pytest.importorskip("sqlalchemy")


class Refused(Exception):
    pass


def module_from_readme(first_line: str, tmp_path: Path) -> ModuleType:
    """The README's block, written to a file of its own and imported under a name of its own."""
    name = f"recipe_{first_line.strip('# ').removesuffix('.py')}"
    path = tmp_path / f"{name}.py"
    path.write_text(readme_block(first_line))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(db_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(query, params).fetchall()


# -- SQLAlchemy ------------------------------------------------------------------------------


def test_the_sqlalchemy_recipe_commits_each_order_with_its_job(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "orders.py").write_text(readme_block("# orders.py"))
    run = subprocess.run(
        [sys.executable, "orders.py"],
        cwd=tmp_path,
        env=notifyq_env(db_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    printed = dict(line.split(": ") for line in run.stdout.splitlines())
    assert set(printed) == {"sync", "async"}
    jobs = rows(
        db_url,
        "SELECT j.id::text, o.total FROM notifyq.jobs j "
        "JOIN orders o ON o.id = (j.payload->>'order')::int WHERE j.task = 'send_receipt'",
    )
    assert sorted(jobs) == sorted([(printed["sync"], 42), (printed["async"], 43)])


async def test_a_rolled_back_session_leaves_neither_the_order_nor_its_job(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    monkeypatch.setenv("DATABASE_URL", db_url)
    orders = module_from_readme("# orders.py", tmp_path)
    orders.Base.metadata.create_all(orders.engine)
    try:
        with pytest.raises(Refused), Session(orders.engine) as session, session.begin():
            order = orders.Order(total=1)
            session.add(order)
            session.flush()
            job = orders.queue.enqueue(
                "send_receipt",
                {"order": order.id},
                conn=session.connection().connection.driver_connection,
            )
            raise Refused
        assert orders.queue.get(job.job_id) is None
        async with Queue(db_url) as q:
            with pytest.raises(Refused):
                async with AsyncSession(orders.async_engine) as session, session.begin():
                    order = orders.Order(total=2)
                    session.add(order)
                    await session.flush()
                    raw = await (await session.connection()).get_raw_connection()
                    job = await q.enqueue(
                        "send_receipt", {"order": order.id}, conn=raw.driver_connection
                    )
                    raise Refused
            assert await q.get(job.job_id) is None
            committed = await orders.place_order_async(q, 3)
            assert (await q.get(committed.job_id)) is not None
        assert rows(db_url, "SELECT total FROM orders") == [(3,)]
    finally:
        orders.queue.close()
        orders.engine.dispose()
        await orders.async_engine.dispose()


# -- FastAPI ---------------------------------------------------------------------------------


async def test_the_fastapi_recipe_answers_once_the_order_and_its_job_are_committed(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(readme_block("CREATE TABLE IF NOT EXISTS orders"))
    monkeypatch.setenv("DATABASE_URL", db_url)
    app = module_from_readme("# shop_api.py", tmp_path).app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answer = await client.post("/orders", params={"total": 42})
            assert answer.status_code == 201, answer.text
            created = answer.json()
            # Read on another connection, right after the answer: committed.
            receipt = await client.get(f"/receipts/{created['job_id']}")
            assert receipt.json() == {"status": "queued", "result": None}
            missing = await client.get(f"/receipts/{uuid.uuid4()}")
            assert missing.status_code == 404
    assert rows(db_url, "SELECT id, total FROM orders") == [(created["order"], 42)]
    with SyncQueue(db_url) as q:
        job = q.get(created["job_id"])
    assert job is not None and job.payload == {"order": created["order"]}


# -- Celery ----------------------------------------------------------------------------------


def test_the_celery_sections_canvas_runs_on_a_worker(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "images.py").write_text(readme_block("# images.py"))
    env = notifyq_env(db_url, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    with processes(tmp_path) as start:
        worker = start("worker", "--import", "images", env=env)
        monkeypatch.setenv("DATABASE_URL", db_url)
        exec(compile(readme_block("# enqueue_images.py"), "enqueue_images.py", "exec"), {})
        assert capsys.readouterr().out == "[128, 512]\n"
        worker.signal(signal.SIGTERM)
        assert worker.wait(20) == 0, worker.output()
