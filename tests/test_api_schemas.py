"""The API's models: importable without a web framework, and the one truth of what the API
answers (the hand-built JSON of the submission routes agrees with them).

The tests of this that need no database are in tests/unit/test_api_schemas.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any
from uuid import UUID

import httpx

from notifyq.api import create_app
from notifyq.api.schemas import BatchOut, EnqueuedOut, JobOut
from notifyq.settings import Settings
from tests.helpers import ROOT, notifyq_env
from tests.unit.test_api_schemas import UTC, WEB_FRAMEWORKS, run_python


def test_notifyq_status_prints_a_job_without_importing_fastapi(db_url: str) -> None:
    env = notifyq_env(db_url)
    enqueued = subprocess.run(
        [sys.executable, "-m", "notifyq", "enqueue", "echo", '{"n": 1}'],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    done = run_python(
        "import sys\n"
        "from notifyq.cli import main\n"
        f"code = main(['status', {job_id!r}])\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {WEB_FRAMEWORKS})\n"
        "assert not loaded, loaded\n"
        "sys.exit(code)\n",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job_id"] == job_id


# -- the hand-built JSON of POST /jobs and /jobs/batch -------------------------------------


async def test_what_the_submission_routes_answer_is_what_the_models_say(
    settings: Settings,
) -> None:
    app = create_app(settings.model_copy(update={"run_worker": False}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:

            async def answered(response: httpx.Response) -> None:
                """The bytes are EnqueuedOut's for the job as stored."""
                body = EnqueuedOut.model_validate_json(response.content)
                stored = await client.get(f"/jobs/{body.job_id}")
                job = JobOut.model_validate_json(stored.content)
                expected = EnqueuedOut(
                    job_id=job.job_id,
                    status=job.status,
                    duplicate=body.duplicate,
                    run_at=job.run_at.astimezone(UTC),
                    created_at=job.created_at.astimezone(UTC),
                )
                assert response.content == expected.model_dump_json().encode()

            whole_second = {"payload": {"n": 1}, "run_at": "2030-01-01T00:00:00Z"}
            first = await client.post("/jobs", json={**whole_second, "dedup_key": "k"})
            assert first.status_code == 201
            await answered(first)
            again = {"payload": {"n": 2}, "dedup_key": "k", "run_at": "2030-01-01T00:00:00.5Z"}
            duplicate = await client.post("/jobs", json=again)
            assert duplicate.status_code == 200
            assert duplicate.json()["duplicate"] is True
            await answered(duplicate)
            await answered(await client.post("/jobs", json={"payload": {}, "delay": 0.25}))

            jobs: list[dict[str, Any]] = [
                {"payload": {"i": 1}},
                whole_second,
                {"payload": {"i": 3}, "dedup_key": "k"},
            ]
            batch = await client.post("/jobs/batch", json={"jobs": jobs})
            assert batch.status_code == 200
            results = BatchOut.model_validate_json(batch.content).results
            assert [r.duplicate for r in results] == [False, False, True]
            assert results[2].job_id == UUID(first.json()["job_id"])
            stored = [
                JobOut.model_validate_json((await client.get(f"/jobs/{r.job_id}")).content)
                for r in results
            ]
            expected = BatchOut(
                results=[
                    EnqueuedOut(
                        job_id=job.job_id,
                        status=job.status,
                        duplicate=r.duplicate,
                        run_at=job.run_at.astimezone(UTC),
                        created_at=job.created_at.astimezone(UTC),
                    )
                    for r, job in zip(results, stored, strict=True)
                ]
            )
            assert batch.content == expected.model_dump_json().encode()
