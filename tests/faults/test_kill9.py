"""``kill -9`` of a random worker process every 3 s for a minute, over 5,000 jobs with 20 bad
rows among them (inserted by SQL, with payloads the handler cannot use) and 200 workflows (a
root, five branches, one sink): every good job completes, a job runs again only after a kill
cut its run short, every sink runs after all its parents, every bad row fails alone with its
error, and nothing is left unfinished. Rows a producer may not write are refused, and a
'processing' row without a lease, made by hand, is rescued and run."""

from __future__ import annotations

import itertools
import random
import signal
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

from notifyq import SyncQueue, chain, group, step
from tests.faults.cluster import Cluster
from tests.faults.report import Figures
from tests.faults.tasks import RUNS_TABLE
from tests.helpers import notifyq_env, processes

# Longer than the suite's default per-test timeout: the scenario's own length is fixed.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GOOD = 5_000
WORKFLOWS = 200
BRANCHES = 5
KILL_EVERY_S = 3.0
KILLING_S = 60.0
WORKERS = 3
LEASE_S = 3
#: The ``n`` of the row made 'processing' by hand.
ORPHAN = GOOD + 1
#: How long each good job works: the jobs last about as long as the killing.
JOB_SECONDS = 0.1
#: SQL rows no handler can use, four of each: nested deeper than Python decodes, no ``n``, an
#: ``n`` that is not a number, an ``n`` that is null, an ``n`` that is an object.
BAD_PAYLOADS = [
    "('{\"n\": ' || repeat('[', 3000) || repeat(']', 3000) || '}')::jsonb",
    "'{\"m\": 1}'::jsonb",
    '\'{"n": "seven"}\'::jsonb',
    "'{\"n\": null}'::jsonb",
    '\'{"n": {"a": 1}}\'::jsonb',
]
UNFINISHED = (
    "SELECT count(*) FROM notifyq.jobs WHERE status NOT IN ('completed', 'failed', 'cancelled')"
)
#: What a bad row's error names.
CLEAR_ERRORS = ("payload cannot be used", "KeyError", "ValueError", "TypeError")


def test_kill_9_every_3_s_for_a_minute_over_jobs_bad_rows_and_workflows(
    cluster: Cluster, tmp_path: Path
) -> None:
    figures = Figures("kill -9 every 3 s for 60 s")
    url = cluster.database("kills")
    env = notifyq_env(
        url,
        NOTIFYQ_IMPORT="tests.faults.tasks",
        NOTIFYQ_LEASE_SECONDS=str(LEASE_S),
        NOTIFYQ_POLL_INTERVAL="1",
        NOTIFYQ_CONCURRENCY="4",
    )
    rng = random.Random(29)
    killed: dict[int, float] = {}  # pid: when it was killed (time.time())
    bad_ids: list[object] = []
    with processes(tmp_path) as start, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RUNS_TABLE)
        workers = [start("worker", env=env, name=f"w{i}") for i in range(WORKERS)]
        for worker in workers:
            worker.wait_for_output("ready")
        # The bad rows fall among the good ones: a chunk of good jobs, then a bad row.
        chunk = GOOD // (len(BAD_PAYLOADS) * 4)
        for i in range(len(BAD_PAYLOADS) * 4):
            conn.execute(
                """INSERT INTO notifyq.jobs (task, payload)
                   SELECT 'fault_step', jsonb_build_object('n', n, 'seconds', %s::float8)
                   FROM generate_series(%s::int, %s::int) n""",
                [JOB_SECONDS, i * chunk + 1, (i + 1) * chunk],
            )
            row = conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, max_attempts) "
                f"VALUES ('fault_step', {BAD_PAYLOADS[i % len(BAD_PAYLOADS)]}, 1) RETURNING id"
            ).fetchone()
            assert row is not None
            bad_ids.append(row[0])
        # What else a careless producer sends by SQL: refused rows, never stored, and a
        # 'processing' row without a lease (an UPDATE by hand), which the rescuer must find.
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO notifyq.jobs (task, payload, status) "
                "VALUES ('fault_step', '{\"n\": -1}', 'processing')"
            )
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            conn.execute(
                "SELECT notifyq.enqueue('fault_step', '{\"n\": -2}', run_at => 'infinity')"
            )
        with conn.transaction():
            orphan = conn.execute(
                "INSERT INTO notifyq.jobs (task, payload) "
                "VALUES ('fault_step', jsonb_build_object('n', %s::int)) RETURNING id",
                [ORPHAN],
            ).fetchone()
            assert orphan is not None
            conn.execute(
                "UPDATE notifyq.jobs SET status = 'processing', attempt_count = 1 WHERE id = %s",
                [orphan[0]],
            )
        with SyncQueue(url) as queue:
            for w in range(WORKFLOWS):
                base = 100_000 + w * 10
                queue.enqueue_workflow(
                    chain(
                        step("fault_step", {"n": base, "seconds": JOB_SECONDS}),
                        group(
                            *(
                                step("fault_step", {"n": base + b, "seconds": JOB_SECONDS})
                                for b in range(1, BRANCHES + 1)
                            )
                        ),
                        step("fault_step", {"n": base + BRANCHES + 1, "seconds": JOB_SECONDS}),
                    )
                )
        total = GOOD + 1 + WORKFLOWS * (BRANCHES + 2)
        began = time.monotonic()
        while time.monotonic() - began < KILLING_S:
            time.sleep(KILL_EVERY_S)  # the scenario's pace, not a wait for a condition
            victim = rng.randrange(len(workers))
            # A bad row fails its job, never its worker: each victim was still running.
            for worker in workers:
                assert worker.popen.poll() is None, f"a worker died: {worker.output()[-3000:]}"
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait()
            killed[workers[victim].pid] = time.time()
            workers[victim] = start("worker", env=env, name=f"w{victim}")
        last_kill = time.monotonic()
        deadline = last_kill + 120
        while (row := conn.execute(UNFINISHED).fetchone()) and row[0] > 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        figures.notes["all jobs ended, seconds after the last kill"] = round(
            time.monotonic() - last_kill, 1
        )
        for worker in workers:
            worker.wait_for_output("ready")
            worker.signal(signal.SIGTERM)
        assert [w.wait() for w in workers] == [0] * WORKERS, [w.output()[-2000:] for w in workers]
        jobs = conn.execute(
            """SELECT id, status, (payload->>'n'), last_error, depends_on, attempt_count
               FROM notifyq.jobs"""
        ).fetchall()
        runs = conn.execute(
            "SELECT n, pid, seq, extract(epoch FROM at)::float8 FROM public.fault_runs ORDER BY seq"
        ).fetchall()
        unfinished = conn.execute(UNFINISHED).fetchone()
        rescues = conn.execute(
            """SELECT e->>'worker', extract(epoch FROM (e->>'at')::timestamptz)::float8
               FROM notifyq.jobs, jsonb_array_elements(errors) AS e
               WHERE e->>'error' LIKE 'lease expired%%'"""
        ).fetchall()

    by_job: dict[int, list[tuple[int, int]]] = defaultdict(list)
    started: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for n, pid, seq, at in runs:
        by_job[n].append((pid, seq))
        started[n].append((pid, at))
    # How soon a job held by a killed worker was requeued: its lease (3 s) running out, and
    # the rescue of the worker that leads the maintenance (itself perhaps killed: its lead runs
    # out with the same lease).
    requeued_after = [
        at - killed[pid]
        for holder, at in rescues
        if holder and (pid := int(holder.split(":")[1])) in killed and at > killed[pid]
    ]
    # How soon it started again: a requeued job goes to the back of its queue (run_at now), so
    # behind a backlog it waits for the jobs ahead of it.
    again_after = [
        later - killed[pid]
        for times in started.values()
        for (pid, _), (_, later) in itertools.pairwise(times)
        if pid in killed and later > killed[pid]
    ]
    good = [j for j in jobs if j[0] not in bad_ids]
    bad = [j for j in jobs if j[0] in bad_ids]
    n_of = {job_id: int(n) for job_id, _, n, _, _, _ in good}
    figures.stuck = unfinished[0] if unfinished else -1
    figures.lost = sum(1 for _, status, _, _, _, _ in good if status != "completed")
    figures.run_twice = sum(1 for n in n_of.values() if len(by_job[n]) > 1)
    # A run again is fine only after a kill cut the run before it short.
    unkilled_reruns = {
        n: pids
        for n in n_of.values()
        if len(pids := [pid for pid, _ in by_job[n]]) > 1
        and sum(1 for pid in pids if pid not in killed) > 1
    }
    never_ran = [n for n in n_of.values() if not by_job[n]]
    early_sinks = []
    for job_id, _, _, _, parents, _ in good:
        if not parents:
            continue
        first_run = min(seq for _, seq in by_job[n_of[job_id]])
        last_parent_run = max(seq for p in parents for _, seq in by_job[n_of[p]])
        if first_run < last_parent_run:
            early_sinks.append(n_of[job_id])
    # An attempt counts only when its handler ran: never more attempts than runs (the row
    # made 'processing' by hand came with one attempt and no run).
    over = [
        n_of[job_id]
        for job_id, _, _, _, _, attempts in good
        if attempts > len(by_job[n_of[job_id]]) + (n_of[job_id] == ORPHAN)
    ]
    if requeued_after:
        figures.recovery_s["killed worker's jobs requeued (max)"] = max(requeued_after)
        figures.recovery_s["killed worker's jobs requeued (median)"] = sorted(requeued_after)[
            len(requeued_after) // 2
        ]
    if again_after:
        figures.notes["started again after the kill, behind the backlog (max, median s)"] = [
            round(max(again_after), 1),
            round(sorted(again_after)[len(again_after) // 2], 1),
        ]
    figures.notes.update(
        kills=len(killed),
        jobs=total,
        bad_rows=len(bad),
        bad_failed=sum(1 for _, status, _, error, _, _ in bad if status == "failed" and error),
        jobs_run_again_after_a_kill=figures.run_twice,
    )
    figures.report()
    assert len(good) == total and len(bad) == len(bad_ids)
    assert figures.stuck == 0 and figures.lost == 0, figures.line()
    assert not never_ran, never_ran[:10]
    assert not unkilled_reruns, list(unkilled_reruns.items())[:10]
    assert not over, f"attempts counted without a run: {over[:10]}"
    assert not early_sinks, f"ran before all their parents: {early_sinks[:10]}"
    for job_id, status, _, error, _, _ in bad:
        assert status == "failed", (job_id, status)
        assert error and any(what in error for what in CLEAR_ERRORS), error
    assert len(killed) >= KILLING_S / KILL_EVERY_S - 1
    # Typically a lease (3 s) and a heartbeat of the leader. A killed leader's lead runs out
    # with the same lease first, and the next kill may hit the next leader: no bound on the
    # most, but on the median.
    assert requeued_after and sorted(requeued_after)[len(requeued_after) // 2] < 2 * LEASE_S, (
        figures.line()
    )
