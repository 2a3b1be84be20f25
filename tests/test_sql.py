"""The SQL face of notifyq: migrations, defaults, notifyq.enqueue and its duplicate rule."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from notifyq.errors import MigrationError
from notifyq.migrations import latest_version, migrate
from notifyq.queries import load_migrations
from notifyq.settings import Settings
from tests.helpers import wait_until
from tests.readme import readme_block


async def scalar(conn: psycopg.AsyncConnection[Any], query: str, *params: Any) -> Any:
    cursor = await conn.execute(query, params or None)
    row = await cursor.fetchone()
    return row[0] if row else None


async def test_migrate_is_idempotent_and_recorded(empty_db_url: str) -> None:
    settings = Settings.load(database_url=empty_db_url)
    first = await migrate(settings, progress=lambda _: None)
    second = await migrate(settings, progress=lambda _: None)
    # Every file, in order (numbers are handed out to branches ahead, so there may be gaps).
    assert [m.version for m in first] == [m.version for m in load_migrations()]
    assert second == []
    async with await psycopg.AsyncConnection.connect(empty_db_url) as conn:
        assert await scalar(conn, "SELECT max(version) FROM notifyq.migrations") == latest_version()


async def test_concurrent_migrations_apply_each_file_once(empty_db_url: str) -> None:
    settings = Settings.load(database_url=empty_db_url)
    results = await asyncio.gather(*(migrate(settings, progress=lambda _: None) for _ in range(4)))
    # Each file by one of them (each takes the lock per file, so they may share the work), in
    # order.
    applied = sorted(migration.version for each in results for migration in each)
    assert applied == [m.version for m in load_migrations()]
    for each in results:
        assert [m.version for m in each] == sorted(m.version for m in each)


async def test_a_changed_migration_is_refused(db_url: str, conn: Any) -> None:
    await conn.execute("UPDATE notifyq.migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await migrate(Settings.load(database_url=db_url), progress=lambda _: None)


async def test_migrate_stores_explicit_defaults_for_sql_clients(db_url: str, conn: Any) -> None:
    await migrate(
        Settings.load(database_url=db_url, default_task="hello_world", max_attempts=7),
        progress=lambda _: None,
    )
    job_id = await scalar(conn, "INSERT INTO notifyq.jobs (payload) VALUES ('{}') RETURNING id")
    cursor = await conn.execute(
        "SELECT task, max_attempts FROM notifyq.jobs WHERE id = %s", [job_id]
    )
    assert await cursor.fetchone() == ("hello_world", 7)


async def test_a_plain_insert_is_a_complete_enqueue(conn: Any) -> None:
    cursor = await conn.execute(
        """INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '{"n": 1}')
           RETURNING status, queue, priority, attempt_count, max_attempts, run_at <= now(),
                     created_at IS NOT NULL, dedup_key, result, last_error"""
    )
    assert await cursor.fetchone() == (
        "queued",
        "default",
        0,
        0,
        3,
        True,
        True,
        None,
        None,
        None,
    )


async def test_registered_task_max_attempts_applies_to_sql_inserts(conn: Any) -> None:
    await conn.execute("INSERT INTO notifyq.tasks (name, max_attempts) VALUES ('mailer', 9)")
    assert (
        await scalar(
            conn, "INSERT INTO notifyq.jobs (task) VALUES ('mailer') RETURNING max_attempts"
        )
        == 9
    )


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO notifyq.jobs (task, payload) VALUES ('echo', '[1, 2]')",
        "INSERT INTO notifyq.jobs (task, status) VALUES ('echo', 'bogus')",
        "INSERT INTO notifyq.jobs (task) VALUES ('')",
        "INSERT INTO notifyq.jobs (task, max_attempts) VALUES ('echo', 0)",
    ],
)
async def test_the_table_refuses_malformed_rows(conn: Any, statement: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        await conn.execute(statement)


async def test_enqueue_function_returns_the_id_and_applies_the_duplicate_rule(conn: Any) -> None:
    first = await scalar(
        conn, "SELECT notifyq.enqueue('echo', '{\"v\": 1}', dedup_key => 'k', priority => 1)"
    )
    again = await scalar(
        conn, "SELECT notifyq.enqueue('echo', '{\"v\": 2}', dedup_key => 'k', priority => 7)"
    )
    other_queue = await scalar(
        conn, "SELECT notifyq.enqueue('echo', '{}', queue => 'q2', dedup_key => 'k')"
    )
    assert again == first
    assert other_queue != first
    cursor = await conn.execute("SELECT payload, priority FROM notifyq.jobs WHERE id = %s", [first])
    assert await cursor.fetchone() == ({"v": 2}, 7)


async def test_a_duplicate_never_touches_a_running_job(conn: Any) -> None:
    first = await scalar(conn, "SELECT notifyq.enqueue('echo', '{\"v\": 1}', dedup_key => 'k')")
    await conn.execute(
        "UPDATE notifyq.jobs SET status = 'processing', worker_id = 'w' WHERE id = %s", [first]
    )
    second = await scalar(conn, "SELECT notifyq.enqueue('echo', '{\"v\": 2}', dedup_key => 'k')")
    assert second != first
    cursor = await conn.execute("SELECT payload, status FROM notifyq.jobs WHERE id = %s", [first])
    assert await cursor.fetchone() == ({"v": 1}, "processing")


async def test_concurrent_duplicates_leave_one_queued_job(db_url: str, conn: Any) -> None:
    async def submit(n: int) -> Any:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as c:
            return await scalar(
                c, "SELECT notifyq.enqueue('echo', %s::jsonb, dedup_key => 'same')", f'{{"n": {n}}}'
            )

    ids = await asyncio.gather(*(submit(n) for n in range(30)))
    assert len(set(ids)) == 1
    assert await scalar(conn, "SELECT count(*) FROM notifyq.jobs WHERE dedup_key = 'same'") == 1


async def test_a_duplicate_claimed_meanwhile_gets_a_new_job(db_url: str, conn: Any) -> None:
    first = await scalar(conn, "SELECT notifyq.enqueue('echo', '{}', dedup_key => 'k')")
    async with await psycopg.AsyncConnection.connect(db_url) as claimer:
        # A worker's claim holds the row lock while the duplicate arrives.
        await claimer.execute(
            "UPDATE notifyq.jobs SET status = 'processing', worker_id = 'w' WHERE id = %s",
            [first],
        )
        pending = asyncio.create_task(
            scalar(conn, "SELECT notifyq.enqueue('echo', '{\"late\": true}', dedup_key => 'k')")
        )
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as watcher:
            await wait_until(
                lambda: scalar(
                    watcher,
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()",
                )
            )
        assert not pending.done()
        await claimer.commit()
        second = await asyncio.wait_for(pending, 5)
    assert second != first
    cursor = await conn.execute(
        "SELECT id, status FROM notifyq.jobs WHERE dedup_key = 'k' ORDER BY created_at"
    )
    assert await cursor.fetchall() == [(first, "processing"), (second, "queued")]


async def test_enqueue_many_function_keeps_input_order(conn: Any) -> None:
    cursor = await conn.execute(
        """SELECT ord, duplicate FROM notifyq.enqueue_many_v6(
               ARRAY['echo', 'echo', 'echo', 'echo'], ARRAY['{}', '{}', '{}', '{}']::jsonb[],
               ARRAY['default', 'default', 'default', 'other'], ARRAY[0, 0, 0, 0],
               NULL, NULL, ARRAY[NULL, 'd', 'd', 'd'], NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               NULL, NULL, NULL, NULL) ORDER BY ord"""
    )
    assert await cursor.fetchall() == [(1, False), (2, False), (3, True), (4, False)]


@pytest.mark.parametrize(
    "call",
    [
        "notifyq.complete_v3('w', ARRAY[gen_random_uuid()], ARRAY[1], ARRAY['null'::jsonb])",
        "notifyq.fail_v4('w', ARRAY[gen_random_uuid()], ARRAY[1], ARRAY['boom'], ARRAY[true], "
        "ARRAY[1.0::float8])",
    ],
    ids=["complete_v3", "fail_v4"],
)
async def test_batch_writes_find_their_jobs_by_primary_key_on_any_table(
    conn: Any, call: str
) -> None:
    """The batch writes keep one plan for their session. Made on an empty table, a free planner
    picks a sequential scan (or a hash join over a walk of the whole primary key) and keeps it
    while the table grows; the functions' settings must leave it a probe of jobs_pkey for each
    job. auto_explain shows the plan of the statement inside the function."""
    try:
        await conn.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        pytest.skip("this server has no auto_explain module")
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_level = notice",
        "plan_cache_mode = force_generic_plan",
    ):
        await conn.execute(f"SET {setting}")
    assert await scalar(conn, "SELECT count(*) FROM notifyq.jobs") == 0
    assert await scalar(conn, f"SELECT count(*) FROM {call}") == 0
    # A completion moves its rows (a DELETE from the queue), a failure updates them.
    writes = [plan for plan in plans if "Update on jobs" in plan or "Delete on jobs" in plan]
    assert writes, plans
    assert "Index Scan using jobs_pkey" in writes[0]
    # A probe by id for each job of the batch, not a walk of the whole key joined afterwards.
    assert "Index Cond: (id = " in writes[0], writes[0]
    assert "Seq Scan on jobs" not in writes[0]


async def test_a_plain_insert_gets_the_same_defaults_as_the_enqueue_functions(
    db_url: str, conn: Any
) -> None:
    # Two ways in state the defaults rule: the row trigger of a plain INSERT that names its task
    # (notifyq.fill_defaults_v2) and the batch function of the enqueue paths (job_defaults_v1).
    await migrate(Settings.load(database_url=db_url, max_attempts=6), progress=lambda _: None)
    await conn.execute(
        "INSERT INTO notifyq.tasks (name, max_attempts, options) VALUES "
        """('mail', 9, '{"queue": "mail", "priority": 7}'), ('bare', NULL, '{}')"""
    )
    cases = [
        ("mail", None, None, None),
        ("mail", "other", None, None),
        ("mail", None, 2, None),
        ("mail", None, None, 1),
        ("bare", None, None, None),
        ("unknown", None, None, None),
        ("unknown", "q", 3, 4),
    ]
    for task, queue, priority, max_attempts in cases:
        columns = {"task": task, "queue": queue, "priority": priority, "max_attempts": max_attempts}
        given = {name: value for name, value in columns.items() if value is not None}
        names = ", ".join(given)
        marks = ", ".join(["%s"] * len(given))
        cursor = await conn.execute(
            f"INSERT INTO notifyq.jobs ({names}) VALUES ({marks}) "
            "RETURNING queue, priority, max_attempts",
            list(given.values()),
        )
        inserted = await cursor.fetchone()
        cursor = await conn.execute(
            "SELECT queue, priority, max_attempts FROM notifyq.job_defaults_v1("
            "ARRAY[%s]::text[], ARRAY['{}'::jsonb], ARRAY[%s]::text[], ARRAY[%s]::integer[], "
            "ARRAY[%s]::integer[], NULL)",
            [task, queue, priority, max_attempts],
        )
        assert inserted == await cursor.fetchone(), columns


async def test_one_insert_of_many_tasks_gives_each_row_its_own_tasks_defaults(
    db_url: str, conn: Any
) -> None:
    # fill_defaults_v2 keeps the last task's defaults for the rest of the statement: rows that
    # alternate between tasks must not take the previous row's.
    await migrate(Settings.load(database_url=db_url, max_attempts=6), progress=lambda _: None)
    await conn.execute(
        "INSERT INTO notifyq.tasks (name, max_attempts, options) VALUES "
        """('mail', 9, '{"queue": "mail", "priority": 7}'), ('bare', NULL, '{}')"""
    )
    cursor = await conn.execute(
        "INSERT INTO notifyq.jobs (task, payload, priority) "
        "SELECT t, jsonb_build_object('n', n), p FROM unnest("
        "ARRAY['mail', 'bare', 'mail', 'unknown', 'mail', 'mail'], "
        "ARRAY[NULL, NULL, NULL, NULL, 1, NULL]::integer[]) WITH ORDINALITY AS u(t, p, n) "
        "RETURNING payload ->> 'n', task, queue, priority, max_attempts"
    )
    rows = sorted(await cursor.fetchall(), key=lambda row: int(row[0]))
    assert [row[1:] for row in rows] == [
        ("mail", "mail", 7, 9),
        ("bare", "default", 0, 6),
        ("mail", "mail", 7, 9),
        ("unknown", "default", 0, 6),
        ("mail", "mail", 1, 9),
        ("mail", "mail", 7, 9),
    ]


async def test_a_bulk_insert_after_a_registration_in_the_same_transaction_sees_it(
    db_url: str, conn: Any
) -> None:
    # The defaults are kept per client statement: the next statement of the same transaction
    # reads the task again, as the statements of version 12 did at every row.
    await migrate(Settings.load(database_url=db_url), progress=lambda _: None)
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) "
            "SELECT 'resize', '{}' FROM generate_series(1, 100)"
        )
        await conn.execute(
            "INSERT INTO notifyq.tasks (name, max_attempts, options) "
            """VALUES ('resize', 2, '{"queue": "images", "priority": 5}')"""
        )
        await conn.execute(
            "INSERT INTO notifyq.jobs (task, payload) "
            "SELECT 'resize', '{}' FROM generate_series(1, 100)"
        )
    cursor = await conn.execute(
        "SELECT queue, priority, max_attempts, count(*) FROM notifyq.jobs "
        "GROUP BY 1, 2, 3 ORDER BY 1"
    )
    assert await cursor.fetchall() == [("default", 0, 3, 100), ("images", 5, 2, 100)]


# -- claims of a worker that names its queues (sql/017) ------------------------------------


async def test_a_claim_for_some_queues_takes_theirs_in_the_claim_order(conn: Any) -> None:
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue, priority, payload, run_at) VALUES "
        "('echo', 'a', 0, '{\"n\": 1}', now() - interval '3 seconds'), "
        "('echo', 'b', 5, '{\"n\": 2}', now() - interval '1 second'), "
        "('echo', 'a', 5, '{\"n\": 3}', now() - interval '2 seconds'), "
        "('echo', 'b', 0, '{\"n\": 4}', now() - interval '4 seconds'), "
        "('echo', 'c', 9, '{\"n\": 5}', now() - interval '5 seconds')"
    )
    claim = "SELECT payload->>'n' FROM notifyq.claim_v4('w', '{echo}', %s, %s, 60, false)"

    async def take(queues: list[str], limit: int) -> set[str]:
        return {n for (n,) in await (await conn.execute(claim, [queues, limit])).fetchall()}

    # Priority first, then run_at, across the queues served; queue c is not served.
    assert await take(["a", "b", "a"], 2) == {"3", "2"}
    assert await take(["b", "a"], 1) == {"4"}
    assert await take(["a", "b"], 10) == {"1"}
    assert await take(["a", "b"], 10) == set()
    row = await (
        await conn.execute("SELECT status FROM notifyq.jobs WHERE payload->>'n' = '5'")
    ).fetchone()
    assert row == ("queued",)


async def test_a_claim_for_one_queue_reads_none_of_the_other_queues_jobs(conn: Any) -> None:
    await conn.execute("ALTER TABLE notifyq.jobs SET (autovacuum_enabled = false)")
    await conn.execute(
        "INSERT INTO notifyq.jobs (task, queue) SELECT 'echo', 'default' "
        "FROM generate_series(1, 3000)"
    )
    await conn.execute("INSERT INTO notifyq.jobs (task, queue) VALUES ('echo', 'email')")
    await conn.execute("ANALYZE notifyq.jobs")
    # Index entries read, by every index of the table: the claim's walk, whichever it takes.
    fetched = (
        "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::int FROM pg_index "
        "WHERE indrelid = 'notifyq.jobs'::regclass"
    )
    claim = "SELECT queue FROM notifyq.claim_v4('w', '{echo}', '{email}', 50, 60, false)"
    for expected in (["email"], []):  # one job, then an empty claim
        async with conn.transaction():
            before = (await (await conn.execute(fetched)).fetchone())[0]
            claimed = [queue for (queue,) in await (await conn.execute(claim)).fetchall()]
            after = (await (await conn.execute(fetched)).fetchone())[0]
        assert claimed == expected
        assert after - before <= 5, f"the claim read {after - before} index entries"


async def test_the_readmes_concurrent_index_before_version_17_is_the_one_it_would_make(
    empty_db_url: str, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README, "Upgrading a large table to schema version 17": the index built by hand before
    the migration is the migration's own, and the migration then goes on."""
    settings = Settings.load(database_url=empty_db_url)
    everything = load_migrations()
    monkeypatch.setattr(
        "notifyq.migrations.load_migrations", lambda: [m for m in everything if m.version < 17]
    )
    await migrate(settings, progress=lambda _: None)
    async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as conn:
        await conn.execute(readme_block("CREATE INDEX CONCURRENTLY IF NOT EXISTS"))
    monkeypatch.setattr("notifyq.migrations.load_migrations", lambda: everything)
    assert [m.version for m in await migrate(settings, progress=lambda _: None)] == [
        m.version for m in everything if m.version >= 17
    ]
    definition = (
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
        "WHERE indexrelid = 'notifyq.jobs_queue_claim_idx'::regclass"
    )
    async with await psycopg.AsyncConnection.connect(empty_db_url) as by_hand:
        async with await psycopg.AsyncConnection.connect(db_url) as migrated:
            assert await scalar(by_hand, definition) == await scalar(migrated, definition)
