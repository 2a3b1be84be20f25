"""Roles and search_path (the hardening issue's finding 13).

A role that may create objects in a schema of the worker's search_path (``public``, on PostgreSQL
13 and 14) must not be able to make the worker, running as a superuser, call its own function in
place of a built-in; and each kind of client needs only the privileges ``notifyq grant`` gives.
Roles are global to the server: each test makes its own and drops it.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
import psycopg
import pytest
from psycopg import sql

from notifyq.api import create_app
from notifyq.builtins import worker_registry
from notifyq.client import Queue
from notifyq.migrations import _apply_missing
from notifyq.queries import load_migrations
from notifyq.settings import Settings
from notifyq.tasks import Registry, make_task
from notifyq.workflows import chain, step
from tests.helpers import ROOT, notifyq_env, processes, running_worker, wait_for_status

#: Exact-typed overloads of built-ins that notifyq's statements call: each one shadows the
#: polymorphic, variadic or defaulted built-in for a caller whose search_path reaches public.
PLANTS = [
    ("jsonb_build_object(text, integer)", "jsonb"),
    (
        "jsonb_build_object(text, integer, text, text, text, timestamptz, text, text)",
        "jsonb",
    ),
    ("format(text, text)", "text"),
    ("format(text, uuid)", "text"),
    ("format(text, text, integer, integer, text)", "text"),
    ("unnest(uuid[])", "SETOF uuid"),
    ("unnest(text[])", "SETOF text"),
    ("make_interval(secs double precision)", "interval"),
]


@contextlib.contextmanager
def role(db_url: str, *, login: bool = True) -> Iterator[str]:
    """A new role of this test's own, dropped afterwards."""
    name = f"nq_test_role_{secrets.token_hex(4)}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} {}").format(
                sql.Identifier(name), sql.SQL("LOGIN" if login else "NOLOGIN")
            )
        )
        try:
            yield name
        finally:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


async def run_notifyq(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Runs ``notifyq ARGS``; answers its exit code, stdout and stderr."""
    done = await anyio.run_process(
        [sys.executable, "-m", "notifyq", *args], env=env, cwd=ROOT, check=False
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def as_role(db_url: str, name: str) -> str:
    parts = urlsplit(db_url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{name}@{host}"))


def test_every_function_pins_its_search_path(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            """SELECT p.oid::regprocedure::text, p.proconfig
               FROM pg_proc AS p
               WHERE p.pronamespace = 'notifyq'::regnamespace
                 AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY(p.proconfig), false)"""
        ).fetchall()
    # Four exceptions. The lease fence, an IMMUTABLE SQL expression of its arguments that the
    # planner inlines into its (pinned) callers, which a SET clause would prevent; the id of a
    # new job, an expression inlined into the column default for the same reason. The defaults
    # trigger of a plain INSERT, which runs at every row, as the inserting role, and the
    # statement trigger that goes with it. The last three name everything by its schema instead
    # (the tests below plant overloads of what they call).
    assert sorted(row[0] for row in rows) == [
        "notifyq.fill_defaults_v3()",
        "notifyq.forget_defaults_v1()",
        "notifyq.holds_v1(text,text,integer,text,integer)",
        "notifyq.uuid_v7()",
    ], rows


#: Exact matches of what the defaults trigger calls, better than the built-ins for its arguments
#: where the built-in is variadic.
TRIGGER_PLANTS = [
    ("current_setting(text, boolean)", "text"),
    ("current_setting(text)", "text"),
    ("concat_ws(text, bigint, timestamptz, text)", "text"),
    ("txid_current()", "bigint"),
    ("statement_timestamp()", "timestamptz"),
]


def test_the_unpinned_defaults_trigger_never_calls_a_planted_overload(db_url: str) -> None:
    # The worst case for a function without a SET clause: a caller whose own search_path puts
    # public before pg_catalog, where another role planted functions and an operator.
    with role(db_url) as attacker, psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.planted_calls (name text)")
        conn.execute(
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(attacker))
        )
        conn.execute(
            sql.SQL("GRANT INSERT ON public.planted_calls TO {}").format(sql.Identifier(attacker))
        )
        conn.execute(
            "INSERT INTO notifyq.tasks (name, max_attempts, options) "
            """VALUES ('mail', 4, '{"queue": "mail", "priority": 2}')"""
        )
        with psycopg.connect(as_role(db_url, attacker), autocommit=True) as evil:
            for signature, returns in [*TRIGGER_PLANTS, ("planted_eq(text, text)", "boolean")]:
                name = signature.partition("(")[0]
                evil.execute(
                    f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql "
                    f"AS $$ INSERT INTO public.planted_calls VALUES ('{name}') "
                    f"RETURNING NULL::{returns} $$"
                )
            evil.execute(
                "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, "
                "FUNCTION = public.planted_eq)"
            )
        conn.execute("SET search_path = public, pg_catalog")
        rows = conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) "
            "SELECT t, '{}' FROM unnest(ARRAY['mail', 'echo', 'mail']) AS t "
            "RETURNING task, queue, priority, max_attempts"
        ).fetchall()
        assert rows == [("mail", "mail", 2, 4), ("echo", "default", 0, 3), ("mail", "mail", 2, 4)]
        assert conn.execute("SELECT name FROM public.planted_calls").fetchall() == []
        conn.execute("DROP TABLE public.planted_calls")


#: Exact matches of what the id of a new job is made with (sql/019), and an operator.
ID_PLANTS = [
    ("gen_random_uuid()", "uuid"),
    ("uuid_send(uuid)", "bytea"),
    ("int8send(bigint)", "bytea"),
    ("date_part(text, timestamptz)", "double precision"),
    ("clock_timestamp()", "timestamptz"),
    ("floor(double precision)", "double precision"),
    ("substr(bytea, integer)", "bytea"),
    ("overlay(bytea, bytea, integer, integer)", "bytea"),
    ("set_bit(bytea, bigint, integer)", "bytea"),
    ("encode(bytea, text)", "text"),
]


def test_a_new_jobs_time_ordered_id_never_calls_a_planted_overload(db_url: str) -> None:
    # The id's expression runs as the inserting role, with that role's search_path.
    with role(db_url) as attacker, psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.planted_calls (name text)")
        conn.execute(
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(attacker))
        )
        conn.execute(
            sql.SQL("GRANT INSERT ON public.planted_calls TO {}").format(sql.Identifier(attacker))
        )
        with psycopg.connect(as_role(db_url, attacker), autocommit=True) as evil:
            plants = [*ID_PLANTS, ("planted_times(double precision, integer)", "double precision")]
            for signature, returns in plants:
                name = signature.partition("(")[0]
                evil.execute(
                    f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql "
                    f"AS $$ INSERT INTO public.planted_calls VALUES ('{name}') "
                    f"RETURNING NULL::{returns} $$"
                )
            evil.execute(
                "CREATE OPERATOR public.* (LEFTARG = double precision, RIGHTARG = integer, "
                "FUNCTION = public.planted_times)"
            )
        conn.execute("SET search_path = public, pg_catalog")
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO notifyq.jobs (task, payload) "
                "SELECT 'echo', '{}' FROM generate_series(1, 3) RETURNING id"
            ).fetchall()
        ]
        assert conn.execute("SELECT name FROM public.planted_calls").fetchall() == []
        conn.execute("DROP TABLE public.planted_calls")
    assert [job_id.version for job_id in ids] == [7, 7, 7]


async def test_a_planted_overload_of_a_built_in_never_runs_as_the_worker(
    settings: Settings, db_url: str, conn: Any
) -> None:
    async def limited(payload: dict[str, Any]) -> None:
        raise RuntimeError("fails, is retried, counts towards its breaker")

    with role(db_url) as attacker:
        await conn.execute("CREATE TABLE public.planted_calls (name text)")
        await conn.execute(
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(attacker))
        )
        await conn.execute(
            sql.SQL("GRANT INSERT ON public.planted_calls TO {}").format(sql.Identifier(attacker))
        )
        async with await psycopg.AsyncConnection.connect(
            as_role(db_url, attacker), autocommit=True
        ) as evil:
            for signature, returns in PLANTS:
                name = signature.partition("(")[0]
                await evil.execute(
                    f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql "
                    f"AS $$ INSERT INTO public.planted_calls VALUES ('{name}') "
                    f"RETURNING NULL::{returns.removeprefix('SETOF ')} $$"
                )
        # The worker's whole life: claims (with limits and breakers), failures and retries,
        # dedup, rescue, release on stop; the API's reads and writes.
        tasks = worker_registry(Registry([make_task(limited, "limited", rate_limit=100)]))
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, dedup_key, max_attempts) VALUES ('limited', 'k', 2)"
        )
        cursor = await conn.execute(
            "INSERT INTO notifyq.jobs (task) VALUES ('echo'), ('fail') RETURNING id"
        )
        ids = [row[0] for row in await cursor.fetchall()]
        fast = settings.model_copy(update={"lease_seconds": 3, "breaker_threshold": 1})
        async with running_worker(fast, tasks):
            for job_id in ids:
                await wait_for_status(conn, job_id, "completed", "failed", "queued", timeout=10)
        app = create_app(settings.model_copy(update={"run_worker": False}))
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
            ) as client,
        ):
            posted = await client.post("/jobs/batch", json={"jobs": [{"payload": {}}] * 3})
            assert posted.status_code == 200
            assert (await client.get("/jobs")).status_code == 200
            assert (await client.post("/jobs/retry")).status_code == 200
        async with Queue(settings=settings) as q:
            await q.enqueue_many([{"task": "echo", "delay": 1}] * 300)
        cursor = await conn.execute("SELECT name, count(*) FROM public.planted_calls GROUP BY 1")
        assert await cursor.fetchall() == []


#: Overloads that match the migration's own calls exactly (its lock key is sent as an integer),
#: where the built-ins take a bigint.
MIGRATION_PLANTS = [
    ("pg_advisory_lock(integer)", "void"),
    ("pg_advisory_unlock(integer)", "boolean"),
]


def test_migrate_and_grant_never_call_a_planted_overload(empty_db_url: str) -> None:
    # The schema's owner migrates and grants: its connections must resolve names in pg_catalog
    # only, as the worker's do, or a planted function runs with the owner's rights.
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.planted_calls (name text)")
        for signature, returns in [*PLANTS, *MIGRATION_PLANTS]:
            name = signature.partition("(")[0]
            conn.execute(
                f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE sql "
                f"AS $$ INSERT INTO public.planted_calls VALUES ('{name}') "
                f"RETURNING NULL::{returns.removeprefix('SETOF ')} $$"
            )
    env = notifyq_env(empty_db_url)
    for args in (["migrate"], ["grant", "postgres", "--as", "worker"]):
        done = subprocess.run(
            [sys.executable, "-m", "notifyq", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT name FROM public.planted_calls").fetchall() == []


def test_grant_prints_and_runs_the_least_privileges(db_url: str) -> None:
    env = notifyq_env(db_url)
    printed = subprocess.run(
        [sys.executable, "-m", "notifyq", "grant", "someone", "--as", "producer", "--print"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert printed.returncode == 0, printed.stderr
    assert 'GRANT INSERT ("id", "task", "payload"' in printed.stdout
    assert "UPDATE" not in printed.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "notifyq", "grant", "nobody_at_all", "--as", "worker"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and "nobody_at_all" in missing.stderr


async def test_a_producer_enqueues_and_reads_but_cannot_change_or_claim_jobs(
    settings: Settings, db_url: str
) -> None:
    with role(db_url) as producer:
        code, _, err = await run_notifyq(
            "grant", producer, "--as", "producer", env=notifyq_env(db_url)
        )
        assert code == 0, err
        url = as_role(db_url, producer)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '{}')")
            await conn.execute("SELECT notifyq.enqueue('echo', '{}', dedup_key => 'k')")
            await conn.execute("SELECT notifyq.enqueue('echo', '{}', dedup_key => 'k')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute("UPDATE notifyq.jobs SET status = 'completed'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(
                    "SELECT * FROM notifyq.claim_v4('me', ARRAY['echo'], NULL, 10, 30, false)"
                )
            # A producer sends signals (sql/023), through notifyq.signal only.
            cursor = await conn.execute("SELECT notifyq.enqueue('echo', '{}', dedup_key => 's')")
            signalled = (await cursor.fetchone())[0]  # type: ignore[index]
            cursor = await conn.execute(
                "SELECT notifyq.signal(%s, 'approved', '{\"k\": 1}'::jsonb)", [signalled]
            )
            assert await cursor.fetchall() == [(True,)]
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(
                    "INSERT INTO notifyq.job_signals (job_id, name) VALUES (%s, 'x')", [signalled]
                )
        async with Queue(settings=settings.model_copy(update={"database_url": url})) as q:
            one = await q.enqueue("echo", {"n": 1})
            many = await q.enqueue_many(
                [{"task": "echo"}] * 300 + [{"task": "echo", "dedup_key": "d"}]
            )
            assert len(many) == 301
            assert (await q.get(one.job_id)) is not None
            # Dependencies, groups and workflows are a producer's too, and so are waits.
            await q.enqueue("echo", {}, depends_on=[one.job_id], group_key="g")
            await q.enqueue_workflow(chain(step("echo"), step("echo")))
            with pytest.raises(TimeoutError):
                await q.wait(one.job_id, timeout=0.5)
            assert await q.signal(one.job_id, "approved") is True
    with psycopg.connect(db_url) as admin:
        row = admin.execute("SELECT count(*) FROM notifyq.jobs").fetchone()
    assert row is not None and row[0] == 1 + 1 + 1 + 1 + 301 + 1 + 2


async def test_a_worker_role_runs_the_worker_and_the_api_without_migrating(
    db_url: str, conn: Any, tmp_path: Path
) -> None:
    with role(db_url) as worker:
        code, _, err = await run_notifyq("grant", worker, "--as", "worker", env=notifyq_env(db_url))
        assert code == 0, err
        url = as_role(db_url, worker)
        # Migrating writes NOTIFYQ_DEFAULT_TASK into notifyq.settings: refused to this role.
        migrating = notifyq_env(url, NOTIFYQ_DEFAULT_TASK="hello_world")
        code, _, err = await run_notifyq("serve", "--port", "0", env=migrating)
        assert code == 1 and "permission denied" in err, err
        dml_only = notifyq_env(
            url, NOTIFYQ_AUTO_MIGRATE="false", NOTIFYQ_DEFAULT_TASK="hello_world"
        )
        with processes(tmp_path) as start:
            serve = start("serve", "--port", "0", env=dml_only, name="serve")
            serve.wait_for_output("Uvicorn running on")
            standalone = start("worker", "--concurrency", "2", env=dml_only, name="worker")
            standalone.wait_for_output("ready")
            cursor = await conn.execute(
                "INSERT INTO notifyq.jobs (task) VALUES ('echo') RETURNING id"
            )
            job_id = (await cursor.fetchone())[0]
            await wait_for_status(conn, job_id, "completed", timeout=15)


def test_a_stale_schema_without_auto_migrate_is_one_line_naming_the_fix(
    empty_db_url: str,
) -> None:
    for command in (["worker"], ["serve", "--port", "0"]):
        done = subprocess.run(
            [sys.executable, "-m", "notifyq", *command],
            env=notifyq_env(empty_db_url, NOTIFYQ_AUTO_MIGRATE="false"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "notifyq migrate" in done.stderr


async def test_roles_granted_before_version_23_keep_working_after_it(empty_db_url: str) -> None:
    # Migrated to version 21 and granted then (as `notifyq grant` of that version did); then
    # version 23 (durable jobs) gives each its share of the new tables and functions.
    older = [m for m in load_migrations() if m.version < 23]
    upto = [m for m in load_migrations() if m.version <= 23]
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await _apply_missing(conn, older, lambda _: None)
        with role(empty_db_url) as worker, role(empty_db_url) as producer:
            w, p = sql.Identifier(worker), sql.Identifier(producer)
            await conn.execute(sql.SQL("GRANT USAGE ON SCHEMA notifyq TO {}, {}").format(w, p))
            await conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.jobs TO {}").format(w)
            )
            await conn.execute(
                sql.SQL("GRANT INSERT (task, payload) ON notifyq.jobs TO {}").format(p)
            )
            await conn.execute(sql.SQL("GRANT SELECT ON notifyq.jobs TO {}").format(p))
            assert [m.version for m in await _apply_missing(conn, upto, str)] == [23]
            cursor = await conn.execute(
                """SELECT has_table_privilege(%(w)s, 'notifyq.job_steps', 'INSERT'),
                          has_table_privilege(%(w)s, 'notifyq.job_signals', 'SELECT'),
                          has_function_privilege(%(w)s, 'notifyq.suspend_v1(text, uuid[],
                              integer[], float8[], text[], text[], text[])', 'EXECUTE'),
                          has_function_privilege(%(w)s, 'notifyq.record_step_v1(text, uuid,
                              integer, text, jsonb)', 'EXECUTE'),
                          has_function_privilege(%(p)s, 'notifyq.job_v2(uuid)', 'EXECUTE'),
                          has_table_privilege(%(p)s, 'notifyq.job_steps', 'SELECT'),
                          has_function_privilege(%(p)s, 'notifyq.suspend_v1(text, uuid[],
                              integer[], float8[], text[], text[], text[])', 'EXECUTE'),
                          has_function_privilege(%(p)s, 'notifyq.signal(uuid, text, jsonb)',
                                                 'EXECUTE')""",
                {"w": worker, "p": producer},
            )
            assert await cursor.fetchone() == (True, True, True, True, True, False, False, True)
            await conn.execute(sql.SQL("DROP OWNED BY {}, {}").format(w, p))


async def test_roles_granted_before_version_24_keep_working_after_it(empty_db_url: str) -> None:
    # Granted at version 23; version 24 (fair claims) gives a worker role the lanes, weights and
    # fair claim, and a producer role the enqueues with a fair_key, its column and the read.
    older = [m for m in load_migrations() if m.version < 24]
    upto = [m for m in load_migrations() if m.version <= 24]
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await _apply_missing(conn, older, lambda _: None)
        with role(empty_db_url) as worker, role(empty_db_url) as producer:
            w, p = sql.Identifier(worker), sql.Identifier(producer)
            await conn.execute(sql.SQL("GRANT USAGE ON SCHEMA notifyq TO {}, {}").format(w, p))
            await conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.jobs TO {}").format(w)
            )
            await conn.execute(
                sql.SQL("GRANT INSERT (task, payload) ON notifyq.jobs TO {}").format(p)
            )
            assert [m.version for m in await _apply_missing(conn, upto, str)] == [24]
            cursor = await conn.execute(
                """SELECT has_table_privilege(%(w)s, 'notifyq.fair_lanes', 'UPDATE'),
                          has_table_privilege(%(w)s, 'notifyq.fair_weights', 'INSERT'),
                          has_function_privilege(%(w)s, 'notifyq.claim_fair_v1(text, integer,
                              timestamptz, uuid, text[], text[], integer)', 'EXECUTE'),
                          has_column_privilege(%(p)s, 'notifyq.jobs', 'fair_key', 'INSERT'),
                          has_function_privilege(%(p)s, 'notifyq.job_v3(uuid)', 'EXECUTE'),
                          has_table_privilege(%(p)s, 'notifyq.fair_lanes', 'SELECT'),
                          has_function_privilege(%(p)s, 'notifyq.claim_fair_v1(text, integer,
                              timestamptz, uuid, text[], text[], integer)', 'EXECUTE')""",
                {"w": worker, "p": producer},
            )
            assert await cursor.fetchone() == (True, True, True, True, True, False, False)
            await conn.execute(sql.SQL("DROP OWNED BY {}, {}").format(w, p))
