"""What each role may do (issue 29's security findings): no role oversteps.

A producer enqueues and reads the jobs whose ids it holds; a worker runs every function of the
schema; any other role with USAGE on the schema runs only ``notifyq.enqueue``, the one function
the contract gives psql users. Roles are global to the server: each test makes its own (with
``notifyq grant``) and drops them.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from notifyq.client import Queue
from notifyq.grants import Kind, statements
from notifyq.migrations import load_migrations
from notifyq.settings import Settings
from notifyq.workflows import chain, step
from tests.helpers import ROOT, notifyq_env
from tests.test_privileges import as_role, role

#: Every function of schema notifyq, and whether it runs as the schema's owner (SECURITY
#: DEFINER). A new function must be added here, with who may run it below.
FUNCTIONS = {
    "accept_job_v2": True, "advance_groups_v1": False, "announce_v1": True,
    "anything_follows_v1": False, "append_error_v1": False, "archive_drop_v1": True,
    "archive_prepare_v1": True, "archive_v1": False, "archived_jobs_v1": False, "beat_v1": False,
    "cancel_job_v2": False, "cancel_running_v3": False, "claim_limited_v4": False,
    "claim_v4": False, "clock_v1": False, "complete_and_claim_v2": False, "complete_v3": False,
    "doom_waiting_v1": False, "end_jobs_v1": False, "enqueue": True, "enqueue_tick_v2": False,
    "enqueue_v3": True, "enqueue_v4": True,
    "fail_v3": False, "fail_v4": False, "fill_defaults_v3": False, "floor_requeued_v1": True,
    "floors_inserted_v1": True, "forget_defaults_v1": False, "holds_v1": False,
    "job_defaults_v1": True, "job_v1": True, "join_workflow_v1": True,
    "keep_task_defaults_v2": True, "lead_v1": True, "limits_exist_v1": False,
    "lock_group_v1": False, "lower_floors_v1": True, "mark_busy_v1": False,
    "mark_waiting_v1": False, "mend_floors_v1": False, "minute_stats_v1": False,
    "next_due_v3": False, "notify_inserted_v2": True, "notify_queues_v1": True,
    "pending_duplicate_v1": False, "progress_v1": False, "prune_marks_v1": False,
    "prune_ticks_v1": False, "prune_v2": False, "raise_floors_v1": False,
    "recheck_waiting_v1": True, "refresh_waiting_v1": False, "refresh_watches_v1": True,
    "refuse_overflow_v1": True, "refuse_row_v1": False, "refuse_status_v1": False,
    "release_v3": False, "rescue_v3": False, "resign_v1": True,
    "retry_v1": False, "retry_v2": False, "revive_v1": False, "seal_floors_v1": False,
    "settle_v1": False, "settle_v2": False, "snooze_v1": False, "start_jobs_v3": False,
    "take_probes_v1": False, "unwatch_v1": True, "uuid_v7": False, "wake_v1": False,
    "watch_v1": True, "write_completions_v1": False,
    # sql/023, durable jobs.
    "durable_state_v1": False, "forget_durable_v1": True, "job_v2": True,
    "record_step_v1": False, "signal": True, "signal_v1": True, "suspend_v1": False,
    # sql/024, fair claims.
    "claim_fair_v1": False, "enqueue_many_v6": True, "enqueue_v5": True, "fair_keys_v1": False,
    "job_v3": True, "mend_lanes_v1": False, "open_lanes_v1": True, "register_task_v2": False,
    "tend_lanes_v1": False,
    # sql/027, the lanes' floors.
    "lower_lane_floors_v1": True, "mend_floors_v2": False, "raise_floors_v2": False,
    "seal_floors_v2": False,
    # sql/029, a bounded wait for a lane.
    "wait_for_lane_v1": False,
}  # fmt: skip
#: What a role with USAGE on the schema and nothing else may run: the contract's psql functions.
PUBLIC = {"enqueue", "signal"}
#: What a producer may run besides: its enqueues (the id, the defaults an insert's trigger
#: asks for), the read of a job by its id, and the watches of Queue.wait.
PRODUCER = PUBLIC | {
    "uuid_v7", "keep_task_defaults_v2", "job_defaults_v1", "enqueue_v4",
    "job_v1", "watch_v1", "refresh_watches_v1", "unwatch_v1",
    "job_v2", "signal_v1",  # sql/023: a job's read with its steps; Queue.signal
    "enqueue_v5", "enqueue_many_v6",  # sql/024: with a fair_key, on_conflict, debounce
    "job_v3",  # sql/024: a job's read with its fair_key
}  # fmt: skip


@contextlib.contextmanager
def granted(db_url: str, kind: Kind | None) -> Iterator[str]:
    """A role of this test's own with the privileges of ``kind`` (``notifyq grant``'s
    statements), or with USAGE on the schema alone for None."""
    with role(db_url) as name, psycopg.connect(db_url, autocommit=True) as admin:
        if kind is None:
            admin.execute(
                sql.SQL("GRANT USAGE ON SCHEMA notifyq TO {}").format(sql.Identifier(name))
            )
        else:
            for statement in statements(name, kind):
                admin.execute(statement)
        yield name


def executable(db_url: str, who: str) -> dict[str, bool]:
    """Each function of schema notifyq (by name) and whether ``who`` may execute it."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.prosecdef, has_function_privilege(%s, p.oid, 'EXECUTE') "
            "FROM pg_proc AS p WHERE p.pronamespace = 'notifyq'::regnamespace",
            [who],
        ).fetchall()
    assert {name: definer for name, definer, _ in rows} == FUNCTIONS
    return {name: allowed for name, _, allowed in rows}


def test_each_role_executes_exactly_the_functions_of_its_kind(db_url: str) -> None:
    with (
        granted(db_url, None) as anyone,
        granted(db_url, "producer") as producer,
        granted(db_url, "worker") as worker,
    ):
        assert {name for name, ok in executable(db_url, anyone).items() if ok} == PUBLIC
        assert {name for name, ok in executable(db_url, producer).items() if ok} == PRODUCER
        assert all(executable(db_url, worker).values())


def test_roles_granted_before_version_22_get_what_grant_gives_now(empty_db_url: str) -> None:
    # The grants of version 21: a producer had SELECT and INSERT, a worker DML; both ran every
    # function through PUBLIC. Migration 22 must not stop them.
    migrations = load_migrations()
    with (
        psycopg.connect(empty_db_url, autocommit=True) as admin,
        role(empty_db_url) as old_producer,
        role(empty_db_url) as old_worker,
    ):
        admin.execute("CREATE SCHEMA notifyq")
        for migration in migrations:
            if migration.version < 22:
                admin.execute(migration.sql.encode())
        admin.execute(
            sql.SQL(
                "GRANT USAGE ON SCHEMA notifyq TO {0}, {1}; "
                "GRANT SELECT, INSERT ON notifyq.jobs TO {0}; "
                "GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.jobs TO {1}"
            ).format(sql.Identifier(old_producer), sql.Identifier(old_worker))
        )
        for migration in migrations:
            if migration.version >= 22:  # 22, and the versions after it
                admin.execute(migration.sql.encode())
        allowed = executable(empty_db_url, old_producer)
        assert {name for name, ok in allowed.items() if ok} == PRODUCER
        assert all(executable(empty_db_url, old_worker).values())


def test_only_a_worker_takes_or_gives_up_the_lead_and_only_for_a_day(db_url: str) -> None:
    with granted(db_url, "producer") as producer, granted(db_url, "worker") as worker:
        with psycopg.connect(db_url, autocommit=True) as admin:
            assert admin.execute("SELECT notifyq.lead_v1('maintenance', 'w1', 30)").fetchone() == (
                True,
            )
        with psycopg.connect(as_role(db_url, producer), autocommit=True) as conn:
            for call in (
                "SELECT notifyq.resign_v1('maintenance', 'w1')",
                "SELECT notifyq.lead_v1('maintenance', 'me', 946080000)",
                "SELECT notifyq.notify_queues_v1(ARRAY['default'])",
                "SELECT notifyq.announce_v1(ARRAY[gen_random_uuid()])",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(call)
        with psycopg.connect(as_role(db_url, worker), autocommit=True) as conn:
            for ttl in (946080000, 0, -1, float("nan")):
                with pytest.raises(psycopg.errors.InvalidParameterValue, match="86400"):
                    conn.execute("SELECT notifyq.lead_v1('maintenance', 'w2', %s)", [ttl])
            assert conn.execute("SELECT notifyq.lead_v1('other', 'w2', 86400)").fetchone() == (
                True,
            )
        with psycopg.connect(db_url) as admin:
            assert admin.execute(
                "SELECT holder FROM notifyq.leaders WHERE role = 'maintenance'"
            ).fetchone() == ("w1",)


async def test_a_producer_reads_the_jobs_whose_ids_it_holds_and_no_table(
    settings: Settings, db_url: str
) -> None:
    async with Queue(settings=settings) as q:
        others = await q.enqueue("echo", {"headers": {"Authorization": "Bearer secret"}})
    with granted(db_url, "producer") as producer:
        url = as_role(db_url, producer)
        async with Queue(settings=settings.model_copy(update={"database_url": url})) as q:
            mine = await q.enqueue("echo", {"n": 1})
            job = await q.get(mine.job_id)
            assert job is not None and job.payload == {"n": 1}
            many = await q.enqueue_many([{"task": "echo", "payload": {"n": 2}}])
            assert (await q.get(many[0].job_id)) is not None
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for table in ("notifyq.jobs", "notifyq.jobs_done", "notifyq.jobs_archive"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await conn.execute(sql.SQL("SELECT payload FROM {}").format(sql.SQL(table)))
            # An id is all a producer has to read a job: the one notifyq.enqueue answered.
            cursor = await conn.execute("SELECT notifyq.enqueue('echo', '{\"n\": 3}')")
            row = await cursor.fetchone()
            assert row is not None and row[0] not in (others.job_id, mine.job_id)


async def test_no_job_joins_a_workflow_that_another_transaction_made(
    settings: Settings, db_url: str, conn: Any
) -> None:
    with granted(db_url, "producer") as producer:
        url = as_role(db_url, producer)
        async with Queue(settings=settings.model_copy(update={"database_url": url})) as q:
            made = await q.enqueue_workflow(chain(step("echo", ref="a"), step("echo", ref="b")))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as evil:
            with pytest.raises(psycopg.errors.CheckViolation, match="another transaction"):
                await evil.execute(
                    "INSERT INTO notifyq.jobs (task, workflow_id) VALUES ('fail', %s)",
                    [made.workflow_id],
                )
            with pytest.raises(psycopg.errors.CheckViolation, match="another transaction"):
                await evil.execute(
                    "SELECT * FROM notifyq.enqueue_v4('fail', '{}', NULL, NULL, NULL, NULL, "
                    "NULL, NULL, NULL, NULL, NULL, %s, NULL, NULL)",
                    [made.workflow_id],
                )
    cursor = await conn.execute(
        "SELECT count(*) FROM notifyq.jobs WHERE workflow_id = %s", [made.workflow_id]
    )
    assert await cursor.fetchone() == (2,)


def test_grant_makes_a_login_role_with_the_password_of_a_variable(db_url: str) -> None:
    # What docker-compose.yml's setup service runs: the role need not exist before.
    name = f"nq_test_role_{secrets.token_hex(4)}"
    env = notifyq_env(db_url, WORKER_PW="first-secret")
    try:
        for password in ("first-secret", "second-secret"):  # again: the password follows
            env["WORKER_PW"] = password
            done = subprocess.run(
                [sys.executable, "-m", "notifyq", "grant", name, "--as", "worker",
                 "--login-password-env", "WORKER_PW"],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert password not in done.stdout + done.stderr
            with psycopg.connect(db_url) as admin:
                row = admin.execute(
                    "SELECT rolcanlogin, rolsuper, rolpassword IS NOT NULL FROM pg_authid "
                    "WHERE rolname = %s",
                    [name],
                ).fetchone()
            assert row == (True, False, True)
        assert all(executable(db_url, name).values())
        env["WORKER_PW"] = " "
        refused = subprocess.run(
            [sys.executable, "-m", "notifyq", "grant", name, "--as", "worker",
             "--login-password-env", "WORKER_PW"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert "WORKER_PW" in refused.stderr
    finally:
        with psycopg.connect(db_url, autocommit=True) as admin:
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]).fetchone():
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
