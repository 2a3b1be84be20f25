-- The queries notifyq runs, each under a `-- name:` header; notifyq/queries.py parses this file
-- once and notifyq/store.py runs each by name. Values are always passed as parameters.
--
-- Built-in functions that an exact-typed overload in another schema could shadow (polymorphic
-- ones such as unnest and array_agg, variadic ones such as format, ones with defaults such as
-- make_interval) are written pg_catalog.<name>: some of these statements run on a caller's own
-- connection, whatever its search_path.

-- A job without a dedup_key needs no duplicate check: one INSERT, its defaults decided by
-- notifyq.job_defaults_v1 (sql/003), the one place that holds that rule. %(fallback)s is the
-- process's own NOTIFYQ_MAX_ATTEMPTS, when set. Built-ins are qualified: these statements also
-- run on the caller's own connection, whatever its search_path.
-- name: enqueue_plain
WITH input AS MATERIALIZED (
    SELECT notifyq.uuid_v7() AS id,
           coalesce(%(run_at)s::timestamptz,
                    pg_catalog.now() + pg_catalog.make_interval(secs => %(delay)s::float8))
               AS run_at
), inserted AS (
    INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts, fair_key)
    SELECT i.id, d.task, %(payload)s::jsonb, d.queue, d.priority, i.run_at, d.max_attempts,
           %(fair_key)s::text
    FROM input AS i,
         notifyq.job_defaults_v1(ARRAY[%(task)s::text], ARRAY[NULL::jsonb],
                                 ARRAY[%(queue)s::text], ARRAY[%(priority)s::integer],
                                 ARRAY[%(max_attempts)s::integer], %(fallback)s::integer) AS d
    RETURNING 1
)
-- What the row holds, answered without reading it back: a producer may not read the table
-- (sql/022). Such a job has no dependencies, so it starts queued, created now().
SELECT i.id AS job_id, false AS duplicate, 'queued' AS status, i.run_at,
       pg_catalog.now() AS created_at
FROM input AS i, (SELECT pg_catalog.count(*) FROM inserted) AS written

-- Many jobs without dedup keys, their tasks named: one INSERT ... SELECT, defaults from
-- notifyq.job_defaults_v1. The ids are made here and answered as one array in input order
-- (PostgreSQL makes and sends them in a fifth of the time Python takes to make them). A column
-- that is NULL for every job may come as one NULL array: unnest() pads it with NULLs.
-- name: enqueue_many_plain
WITH input AS MATERIALIZED (
    SELECT notifyq.uuid_v7() AS id, u.*
    -- ROWS FROM: a qualified unnest() takes one array (the many-array form is syntax).
    FROM ROWS FROM (pg_catalog.unnest(%(payloads)b::jsonb[]),
                    pg_catalog.unnest(%(run_at)b::timestamptz[]),
                    pg_catalog.unnest(%(delay)b::float8[]),
                    pg_catalog.unnest(%(fair_key)b::text[])) WITH ORDINALITY
         AS u(payload, run_at, delay, fair_key, ord)
), inserted AS (
    INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts, fair_key)
    SELECT i.id, d.task, i.payload, d.queue, d.priority,
           coalesce(i.run_at,
                    pg_catalog.now() + pg_catalog.make_interval(secs => coalesce(i.delay, 0))),
           d.max_attempts, i.fair_key
    FROM input AS i
    JOIN notifyq.job_defaults_v1(%(tasks)b::text[], NULL, %(queue)b::text[],
                                 %(priority)b::integer[], %(max_attempts)b::integer[],
                                 %(fallback)s::integer) AS d ON d.ord = i.ord
    RETURNING 1
)
SELECT pg_catalog.now(), (SELECT pg_catalog.count(*) FROM inserted),
       (SELECT pg_catalog.array_agg(id ORDER BY ord) FROM input)

-- With a dedup_key, a task to take from the payload, dependencies, a group, a workflow, an id
-- of its own or a trace context: notifyq.enqueue_v5 (sql/024) applies the duplicate rule and the
-- defaults.
-- name: enqueue
SELECT job_id, duplicate, status, run_at, created_at
FROM notifyq.enqueue_v5(%(task)s::text, %(payload)s::jsonb, %(queue)s::text,
                        %(priority)s::integer, %(run_at)s::timestamptz, %(delay)s::float8,
                        %(dedup_key)s::text, %(max_attempts)s::integer, %(fallback)s::integer,
                        %(depends_on)s::uuid[], %(group_key)s::text, %(workflow_id)s::uuid,
                        %(id)s::uuid, %(trace_context)s::jsonb, %(fair_key)s::text,
                        %(on_conflict)s::text, %(debounce)s::float8)

-- A batch of such jobs: notifyq.enqueue_many_v6 (sql/024). Each job's depends_on goes as the
-- text of an array ('{}' for none): an array of arrays must be rectangular. One trace context (or
-- NULL) for the whole batch. The refs of a workflow's jobs, or one NULL.
-- name: enqueue_many
SELECT ord, job_id, duplicate, status, run_at, created_at
FROM notifyq.enqueue_many_v6(
    %(tasks)b::text[], %(payloads)b::jsonb[], %(queue)b::text[], %(priority)b::integer[],
    %(run_at)b::timestamptz[], %(delay)b::float8[], %(dedup_key)b::text[],
    %(max_attempts)b::integer[], %(fallback)s::integer, %(depends_on)b::text[],
    %(group_key)b::text[], %(workflow_ids)b::uuid[], %(ids)b::uuid[],
    %(trace_context)s::jsonb, %(refs)b::text[], %(fair_key)b::text[], %(on_conflict)b::text[],
    %(debounce)b::float8[])
ORDER BY ord

-- A job by its id, live, finished or archived, with what a suspended job waits for and its steps
-- (sql/023) in the order they finished, and its fair_key (sql/024) (notifyq.job_v3: the read a
-- producer, which may not read the tables, is granted).
-- name: get_job
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       lease_expires_at, cancel_requested_at, depends_on, group_key, workflow_id, progress, ref,
       archived, suspended_until, waiting_for_signal, step_names, step_times, fair_key
FROM notifyq.job_v3(%(id)s::uuid);

-- See notifyq.claim_v4 (sql/007): with the results of the jobs each depends on, and the trace
-- context each was enqueued in.
--
-- A claim that takes jobs commits without waiting for its WAL to reach the disk (or a
-- synchronous standby): synchronous_commit is off for its transaction alone. No job can be lost
-- by it: a claim undone by a crash leaves its jobs queued, as they were. And whatever a job
-- records next (its completion, a failure, a step, a heartbeat) commits durably, and the WAL is
-- flushed in order, so the claim is on disk before anything of the job is. What a crash of the
-- server within the WAL writer's delay of a claim (at most three times wal_writer_delay, 200 ms
-- by default; at once under load, by the next commit) does to a worker that outlives it: it
-- loses the job's claim, as it would lose an expired lease. The claim number goes back with the
-- row, so the same worker's next claim of the job writes the same number, the fence of the run
-- it has: notifyq/worker/_ledger.py (Ledger.redone) lets that run go on as the new claim's, or
-- sends the claim back to the queue, and never runs two under one fence. The claim's wait for
-- the flush was a third of an idle pickup and most of a burst's p99
-- (docs/concepts/benchmark.md). The outcome writer's completion that also claims
-- (complete_and_claim_jobs) stays durable.
-- name: claim_jobs
SELECT id, task, queue, payload, priority, attempt_count AS attempt, max_attempts,
       claims AS claim, created_at, run_at, dependencies, trace_context
FROM notifyq.claim_v4(%(worker_id)s, %(tasks)b::text[], %(queues)b::text[], %(limit)s,
                      %(lease)s::float8, %(probe)s)
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL

-- claim_jobs and the look for the next run_at (notifyq.next_due_v3) in one statement, for a
-- claim that may end in a sleep: the claimed jobs, each with a null due, then one row whose id is
-- null and whose due is the look's answer. The two read the same now(), the transaction's, so a
-- job is either due for the claim or counted by the look (see notifyq/worker/_producer.py); one
-- statement costs the server one execution and one sync, where the two statements in one
-- pipeline cost two of each (a quarter of a millisecond of an idle worker's pickup, measured).
-- Its commit does not wait for the disk either, when it claimed a job (see claim_jobs).
-- name: look_and_claim_jobs
SELECT id, task, queue, payload, priority, attempt_count AS attempt, max_attempts,
       claims AS claim, created_at, run_at, dependencies, trace_context, NULL::float8 AS due
FROM notifyq.claim_v4(%(worker_id)s, %(tasks)b::text[], %(queues)b::text[], %(limit)s,
                      %(lease)s::float8, false)
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       notifyq.next_due_v3(%(tasks)b::text[], %(queues)b::text[])

-- Records successful attempts, one statement for a whole batch, fenced by the claim; the jobs
-- that waited for them and the next members of their groups move on in the same transaction:
-- see notifyq.complete_v3 (sql/005).
-- name: complete_jobs
SELECT id FROM notifyq.complete_v3(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                                  %(results)b::jsonb[]) AS id

-- Records successful attempts and claims up to %(take)s jobs for the same worker, in one
-- statement: see notifyq.complete_and_claim_v2 (sql/012). A row with a null task is a completion
-- written; the others are the jobs claimed.
-- name: complete_and_claim_jobs
SELECT id, task, queue, payload, priority, attempt_count AS attempt, max_attempts,
       claims AS claim, created_at, run_at, dependencies, trace_context
FROM notifyq.complete_and_claim_v2(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                                   %(results)b::jsonb[], %(tasks)b::text[], %(queues)b::text[],
                                   %(take)s, %(lease)s::float8)

-- Records failed attempts, one statement for a batch; a retry wakes the idle workers of its queue:
-- see notifyq.fail_v4 (sql/014).
-- name: fail_jobs
SELECT id, status FROM notifyq.fail_v4(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                              %(errors)b::text[], %(retryable)b::boolean[], %(delays)b::float8[])

-- Puts jobs a stopping worker could not finish back in the queue at once, without counting the
-- interrupted attempt: see notifyq.release_v3 (sql/005).
-- name: release_jobs
SELECT id FROM notifyq.release_v3(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[]) AS id

-- The heartbeat: renews the leases of the jobs a worker holds, and confirms those whose handler
-- runs; answers the ids still held, with whether a cancel was requested (see notifyq.beat_v1).
-- name: beat
SELECT id, cancel_requested FROM notifyq.beat_v1(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                              %(running)b::boolean[], %(lease)s::float8)

-- Records attempts stopped by a cancel request (see notifyq.cancel_running_v3).
-- name: cancel_running
SELECT id FROM notifyq.cancel_running_v3(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[]) AS id

-- Puts snoozed jobs back in the queue for later, attempt not counted (see notifyq.snooze_v1).
-- name: snooze_jobs
SELECT id FROM notifyq.snooze_v1(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                                 %(delays)b::float8[]) AS id

-- Records the progress of running jobs (see notifyq.progress_v1).
-- name: report_progress
SELECT id FROM notifyq.progress_v1(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                                   %(fractions)b::float8[], %(messages)b::text[]) AS id

-- Requeues (or fails, or cancels) jobs whose lease ran out or that have none: their worker died
-- or hung. See notifyq.rescue_v3 (sql/005).
-- name: rescue_expired
SELECT id, status, counted FROM notifyq.rescue_v3(%(limit)s)

-- The claim floors' two statements, the lanes' floors with them (see notifyq.raise_floors_v1 and
-- seal_floors_v1, sql/021, and their second versions, sql/027): each in a transaction of its
-- own, the second after the first commits.
-- name: raise_floors
SELECT notifyq.raise_floors_v2();

-- name: seal_floors
SELECT notifyq.seal_floors_v2();

-- The net under the floors and the lanes' floors (notifyq.mend_floors_v2): answers the floors
-- made, lowered or removed.
-- name: mend_floors
SELECT notifyq.mend_floors_v2();

-- The leader's care of the fair lanes (sql/024): answers the lanes opened.
-- name: tend_lanes
SELECT notifyq.tend_lanes_v1();

-- name: mend_lanes
SELECT notifyq.mend_lanes_v1();

-- The keys with the most jobs queued or running (notifyq.fair_keys_v1, sql/024).
-- name: fair_keys
SELECT queue, fair_key, queued, running, weight FROM notifyq.fair_keys_v1(%(limit)s);

-- A key's weight in the fair claims (sql/024): set, removed (back to 1), listed.
-- name: set_fair_weight
INSERT INTO notifyq.fair_weights (fair_key, weight) VALUES (%(fair_key)s, %(weight)s)
ON CONFLICT (fair_key) DO UPDATE SET weight = EXCLUDED.weight, updated_at = now();

-- name: unset_fair_weight
DELETE FROM notifyq.fair_weights WHERE fair_key = %(fair_key)s;

-- name: fair_weights
SELECT fair_key, weight, updated_at FROM notifyq.fair_weights
ORDER BY weight DESC, fair_key LIMIT %(limit)s;

-- name: register_task
SELECT notifyq.register_task_v2(
    %(name)s, %(max_attempts)s::integer, %(options)s::jsonb, %(breaker_threshold)s::integer,
    %(breaker_cooldown)s::float8, %(max_concurrency)s::integer, %(rate_limit)s::float8,
    %(rate_burst)s::float8, %(key_concurrency)s::integer);

-- A half-open breaker lets one probe through (see notifyq.take_probes_v1).
-- name: take_breaker_probes
SELECT name FROM notifyq.take_probes_v1(%(tasks)b::text[]) AS name;

-- name: list_tasks
SELECT name, max_attempts, options, updated_at, breaker_threshold, breaker_cooldown,
       consecutive_failures, breaker_open_until, max_concurrency, rate_limit,
       CASE WHEN breaker_open_until IS NULL THEN 'closed'
            WHEN breaker_open_until > now() THEN 'open'
            ELSE 'half_open' END AS breaker_state
FROM notifyq.tasks
ORDER BY name;

-- Jobs newest first (by id: a version 7 id sorts by the time it was made), filtered, one page
-- after the cursor's id. The live jobs and the finished ones are read each from its table, and
-- only from the one that can hold the status asked for, whatever plan the statement gets (the
-- test on %(status)s is a one-time filter; a CHECK can leave a table out only at planning).
-- name: list_jobs
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       lease_expires_at, cancel_requested_at, depends_on, group_key, workflow_id, progress, ref,
       suspended_until, waiting_for_signal, fair_key
FROM (
    SELECT * FROM ONLY notifyq.jobs
    WHERE (%(status)s::text IS NULL
           OR %(status)s::text IN ('waiting', 'queued', 'processing', 'suspended'))
    UNION ALL
    SELECT * FROM notifyq.jobs_done
    WHERE (%(status)s::text IS NULL OR %(status)s::text IN ('completed', 'failed', 'cancelled'))
) AS j
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
  AND (%(after_id)s::uuid IS NULL OR id < %(after_id)s::uuid)
ORDER BY id DESC
LIMIT %(limit)s;

-- A failed or cancelled job goes back (see notifyq.retry_v2, sql/015): answers its status now
-- and, when it did not go back, why.
-- name: retry_job
SELECT status, refused FROM notifyq.retry_v2(%(id)s)

-- Requeues failed (or cancelled) jobs matching the filters, %(limit)s candidates at a time in id
-- order after %(after)s; the caller repeats with the last candidate until fewer come back, so no
-- statement locks many rows. Of several jobs with one dedup_key only the newest goes back (none
-- while a job with that key has not started); each goes back as notifyq.retry_v2 says, the
-- members of a group in the order they were submitted.
-- name: retry_jobs
WITH candidates AS MATERIALIZED (
    SELECT id, queue, dedup_key, created_at, group_seq
    FROM notifyq.jobs_done
    WHERE status = %(status)s::text AND id > %(after)s::uuid
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), chosen AS MATERIALIZED (
    SELECT DISTINCT ON (queue, coalesce(dedup_key, id::text)) id, group_seq
    FROM candidates
    ORDER BY queue, coalesce(dedup_key, id::text), created_at DESC
), retried AS MATERIALIZED (
    SELECT r.refused
    FROM (SELECT id FROM chosen ORDER BY group_seq NULLS LAST, id) AS c
    CROSS JOIN LATERAL notifyq.retry_v2(c.id) AS r
)
SELECT (SELECT count(*) FROM retried WHERE refused IS NULL)::integer,
       (SELECT count(*) FROM candidates)::integer,
       (SELECT id FROM candidates ORDER BY id DESC LIMIT 1);

-- Registers the worker as waiting for work (see notifyq.waiting_workers); answers whether it
-- got the advisory lock that makes the claim after it see every earlier insert.
-- name: mark_waiting
SELECT notifyq.mark_waiting_v1(%(worker_id)s, %(queues)b::text[], %(ttl)s::float8);

-- name: unmark_waiting
SELECT notifyq.mark_busy_v1(%(worker_id)s);

-- name: refresh_waiting
SELECT notifyq.refresh_waiting_v1(%(worker_id)s, %(ttl)s::float8);

-- Takes or keeps the lead of a role for a while; answers whether this worker leads (see
-- notifyq.lead_v1, sql/010).
-- name: lead
SELECT notifyq.lead_v1(%(role)s, %(holder)s, %(ttl)s::float8);

-- name: resign
SELECT notifyq.resign_v1(%(role)s, %(holder)s);

-- Deletes the idle marks and the watches that their processes stopped refreshing.
-- name: prune_waiting
SELECT notifyq.prune_marks_v1();

-- Cancels a job: a queued one (or one no live worker holds) at once; a running one is marked and
-- its worker told; the jobs waiting for it are cancelled too. Answers the status it had and the
-- one it has (see notifyq.cancel_job_v2).
-- name: cancel_job
SELECT was, status FROM notifyq.cancel_job_v2(%(id)s)

-- Deletes a finished job; answers its id, or nothing when it is not finished (or unknown), or
-- when a job that has not started depends on it (its result is that job's input).
-- name: delete_job
DELETE FROM notifyq.jobs AS j
WHERE j.id = %(id)s AND j.status IN ('completed', 'failed', 'cancelled')
  AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS c
                  WHERE c.status IN ('waiting', 'queued') AND c.depends_on <> '{}'
                    AND c.depends_on @> ARRAY[j.id])
RETURNING j.id;

-- The jobs of a workflow, in the order they were created (one transaction gives them one
-- created_at; their ids, notifyq.workflows.ordered_ids, sort in the order they went in), the
-- archived ones too (one statement, one snapshot: a job being moved is seen once).
-- name: workflow_jobs
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       lease_expires_at, cancel_requested_at, depends_on, group_key, workflow_id, progress, ref,
       false AS archived
FROM notifyq.jobs
WHERE workflow_id = %(workflow_id)s
UNION ALL
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       NULL::timestamptz, cancel_requested_at, depends_on, group_key, workflow_id, progress, ref,
       true
FROM notifyq.archived_jobs_v1(NULL, %(workflow_id)s::uuid)
ORDER BY created_at, id
LIMIT %(limit)s;

-- Watches a job for %(ttl)s seconds: its changes are announced on the channel notifyq_job (see
-- notifyq.watch_v1). Answers whether the job exists.
-- name: watch_job
SELECT notifyq.watch_v1(%(id)s, %(watcher)s, %(ttl)s::float8);

-- Keeps watches alive (see notifyq.refresh_watches_v1).
-- name: refresh_watches
SELECT notifyq.refresh_watches_v1(%(watcher)s, %(ids)b::uuid[], %(ttl)s::float8);

-- name: unwatch_jobs
SELECT notifyq.unwatch_v1(id, %(watcher)s) FROM pg_catalog.unnest(%(ids)b::uuid[]) AS id;

-- Counts per queue. Live jobs are counted in the queue's table, failed and cancelled ones
-- through their partial index, exactly; completed jobs can be millions, so above
-- %(exact_below)s finished jobs they are estimated from a block sample. A page: the queues
-- named after %(after)s, %(limit)s of them (NULL: from the first, all).
-- name: queue_stats
WITH estimate AS (
    SELECT greatest(reltuples, 0)::bigint AS rows
    FROM pg_class WHERE oid = 'notifyq.jobs_done'::regclass
), live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'waiting') AS waiting,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'queued' AND run_at <= now()) AS due,
           count(*) FILTER (WHERE status = 'processing') AS processing,
           count(*) FILTER (WHERE status = 'suspended') AS suspended,
           count(*) FILTER (WHERE status = 'suspended' AND waiting_for_signal IS NOT NULL)
               AS waiting_for_signal,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued'
                                                           AND run_at <= now()))::float8
               AS oldest_due_seconds
    FROM ONLY notifyq.jobs
    GROUP BY queue
), dead AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM notifyq.jobs_done
    WHERE status IN ('failed', 'cancelled')
    GROUP BY queue
), recent AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'completed') AS completed_last_minute,
           count(*) FILTER (WHERE status = 'failed') AS failed_last_minute
    FROM notifyq.jobs_done
    WHERE finished_at > now() - interval '1 minute'
    GROUP BY queue
), completed_exact AS (
    SELECT queue, count(*) AS completed
    FROM notifyq.jobs_done
    WHERE status = 'completed' AND (SELECT rows FROM estimate) < %(exact_below)s
    GROUP BY queue
), completed_sampled AS (
    SELECT queue, (count(*) * 100.0 / %(sample_percent)s)::bigint AS completed
    FROM notifyq.jobs_done TABLESAMPLE SYSTEM (%(sample_percent)s)
    WHERE status = 'completed' AND (SELECT rows FROM estimate) >= %(exact_below)s
    GROUP BY queue
), names AS (
    SELECT queue FROM live UNION SELECT queue FROM dead UNION SELECT queue FROM recent
    UNION SELECT queue FROM completed_exact UNION SELECT queue FROM completed_sampled
    UNION SELECT name FROM notifyq.queues
)
SELECT n.queue,
       coalesce(l.waiting, 0) AS waiting, coalesce(l.queued, 0) AS queued, coalesce(l.due, 0) AS due,
       coalesce(l.processing, 0) AS processing, coalesce(l.suspended, 0) AS suspended,
       coalesce(l.waiting_for_signal, 0) AS waiting_for_signal,
       coalesce(ce.completed, cs.completed, 0) AS completed,
       coalesce(d.failed, 0) AS failed, coalesce(d.cancelled, 0) AS cancelled,
       (SELECT rows FROM estimate) >= %(exact_below)s AS completed_estimated,
       l.oldest_due_seconds,
       coalesce(r.completed_last_minute, 0) AS completed_last_minute,
       coalesce(r.failed_last_minute, 0) AS failed_last_minute,
       coalesce(q.paused, false) AS paused, coalesce(q.notify, true) AS notify,
       q.rate_limit, q.max_depth
FROM names AS n
LEFT JOIN live AS l ON l.queue = n.queue
LEFT JOIN dead AS d ON d.queue = n.queue
LEFT JOIN recent AS r ON r.queue = n.queue
LEFT JOIN completed_exact AS ce ON ce.queue = n.queue
LEFT JOIN completed_sampled AS cs ON cs.queue = n.queue
LEFT JOIN notifyq.queues AS q ON q.name = n.queue
WHERE %(after)s::text IS NULL OR n.queue > %(after)s::text
ORDER BY n.queue
LIMIT %(limit)s::bigint;

-- Changes a queue's switches; NULL leaves one as it is, a rate limit or a max_depth of 0
-- removes it. Resuming wakes the queue's workers.
-- name: configure_queue
WITH changed AS (
    INSERT INTO notifyq.queues (name, paused, notify, rate_limit, rate_tokens, max_depth,
                                updated_at)
    VALUES (%(queue)s, coalesce(%(paused)s::boolean, false), coalesce(%(notify)s::boolean, true),
            nullif(%(rate_limit)s::float8, 0), 0, nullif(%(max_depth)s::bigint, 0), now())
    ON CONFLICT (name) DO UPDATE
    SET paused = coalesce(%(paused)s::boolean, queues.paused),
        notify = coalesce(%(notify)s::boolean, queues.notify),
        rate_limit = CASE WHEN %(rate_limit)s::float8 IS NULL THEN queues.rate_limit
                          ELSE nullif(%(rate_limit)s::float8, 0) END,
        max_depth = CASE WHEN %(max_depth)s::bigint IS NULL THEN queues.max_depth
                         ELSE nullif(%(max_depth)s::bigint, 0) END,
        updated_at = now()
    RETURNING name, paused
)
SELECT name, CASE WHEN NOT paused THEN notifyq.wake_v1(ARRAY[name]) END FROM changed;

-- name: schema_version
SELECT max(version) FROM notifyq.migrations;

-- Claims jobs under a task's concurrency or rate limit, or a queue's rate limit (see
-- notifyq.claim_limited_v4, sql/007).
-- name: claim_limited_jobs
SELECT id, task, queue, payload, priority, attempt_count AS attempt, max_attempts,
       claims AS claim, created_at, run_at, dependencies, trace_context
FROM notifyq.claim_limited_v4(%(worker_id)s, %(tasks)b::text[], %(queues)b::text[],
                              %(limit)s, %(lease)s::float8);

-- Whether the worker must use the limited claim (see notifyq.limits_exist_v1).
-- name: limits_exist
SELECT notifyq.limits_exist_v1(%(tasks)b::text[]);

-- name: enqueue_tick
SELECT notifyq.enqueue_tick_v2(%(task)s, %(tick)s, %(payload)s::jsonb);

-- name: database_now
SELECT notifyq.clock_v1();

-- Retention, one batch (see notifyq.prune_v2: never a job that a job not started yet depends
-- on); the caller repeats until fewer come back.
-- name: prune_jobs
SELECT notifyq.prune_v2(%(status)s::text, %(keep)s::float8, %(limit)s);

-- The archive (NOTIFYQ_ARCHIVE_AFTER, sql/015): the partitions a move needs, created ahead by
-- the maintenance leader (see notifyq.archive_prepare_v1; the caller repeats while it answers
-- 8); one batch of finished jobs moved (notifyq.archive_v1: never a job that a job not started
-- yet depends on; the caller repeats until fewer come back); the days past the longest keep
-- dropped (notifyq.archive_drop_v1; again while it answers 8).
-- name: archive_prepare
SELECT notifyq.archive_prepare_v1(%(after)s::float8, %(ahead)s::integer);

-- name: archive_jobs
SELECT notifyq.archive_v1(%(after)s::float8, %(limit)s::integer);

-- name: archive_drop
SELECT notifyq.archive_drop_v1(%(keep)s::float8);

-- A job that is not in notifyq.jobs may be in the archive (read second: a job moves in one
-- transaction, from the table to the archive, never back, so one of the two reads sees it).
-- The columns of get_job; an archived job holds no lease. notifyq.archived_jobs_v1 answers
-- nothing to a role that may not read the archive.
-- name: get_archived_job
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       NULL::timestamptz AS lease_expires_at, cancel_requested_at, depends_on, group_key,
       workflow_id, progress, ref, true AS archived, fair_key
FROM notifyq.archived_jobs_v1(%(id)s::uuid, NULL);

-- name: prune_ticks
SELECT notifyq.prune_ticks_v1();

-- name: ping
SELECT 1;

-- The dashboard's search: jobs newest first, filtered, whose payload contains %(contains)s
-- (jsonb @>). No index serves @>, so the cost is bounded instead: at most %(scan)s rows after
-- the cursor are looked at (newest first, as list_jobs), and the page holds the matches among
-- them. Every row answers the scan's extent too (one row with NULL job columns when nothing
-- matched), so the caller can go on from where the scan stopped.
-- name: search_jobs
WITH scanned AS MATERIALIZED (
    SELECT id, created_at, payload @> %(contains)s::jsonb AS hit
    FROM (
        SELECT * FROM ONLY notifyq.jobs
        WHERE (%(status)s::text IS NULL
               OR %(status)s::text IN ('waiting', 'queued', 'processing', 'suspended'))
        UNION ALL
        SELECT * FROM notifyq.jobs_done
        WHERE (%(status)s::text IS NULL
               OR %(status)s::text IN ('completed', 'failed', 'cancelled'))
    ) AS j
    WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
      AND (%(after_id)s::uuid IS NULL OR id < %(after_id)s::uuid)
    ORDER BY id DESC
    LIMIT %(scan)s
), hits AS MATERIALIZED (
    SELECT id FROM scanned WHERE hit ORDER BY id DESC LIMIT %(limit)s
), extent AS (
    SELECT (SELECT count(*) FROM scanned)::integer AS scanned,
           (SELECT created_at FROM scanned ORDER BY id LIMIT 1) AS last_created,
           (SELECT id FROM scanned ORDER BY id LIMIT 1) AS last_id
)
SELECT j.id, j.task, j.queue, j.payload, j.status, j.priority, j.run_at, j.attempt_count,
       j.max_attempts, j.dedup_key, j.result, j.last_error, j.errors, j.created_at, j.started_at,
       j.finished_at, j.worker_id, j.lease_expires_at, j.cancel_requested_at, j.depends_on,
       j.group_key, j.workflow_id, j.progress, j.ref, j.suspended_until, j.waiting_for_signal,
       e.scanned, e.last_created, e.last_id
FROM extent AS e
LEFT JOIN (hits JOIN notifyq.jobs AS j USING (id)) ON true
ORDER BY j.id DESC;

-- How many jobs in %(statuses)s match the filters, looking at %(scan)s rows at most: answers
-- the matches and the rows looked at (the count is exact when fewer than %(scan)s were).
-- name: count_matching_jobs
SELECT count(*) FILTER (WHERE hit)::integer, count(*)::integer
FROM (SELECT %(contains)s::jsonb IS NULL OR payload @> %(contains)s::jsonb AS hit
      FROM notifyq.jobs
      WHERE status = ANY (%(statuses)s::text[])
        AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
        AND (%(task)s::text IS NULL OR task = %(task)s::text)
        AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
      LIMIT %(scan)s) AS s;

-- The bulk actions look at %(limit)s candidates at most, in id order after %(after)s (the
-- caller goes on from the last one until fewer come back), and lock only the matching ones
-- still in a status the action applies to, skipping those locked elsewhere: no statement locks
-- or reads many rows. Each answers the jobs it changed, the candidates it looked at, and the
-- last candidate's id.
--
-- Cancel: each goes through notifyq.cancel_job_v2, the path of POST /jobs/{id}/cancel, so a
-- running job's worker is told to stop it and dependents are cancelled with their parent.
-- name: bulk_cancel_jobs
WITH candidates AS MATERIALIZED (
    SELECT id, %(contains)s::jsonb IS NULL OR payload @> %(contains)s::jsonb AS hit
    FROM notifyq.jobs
    WHERE status = ANY (%(statuses)s::text[]) AND id > %(after)s::uuid
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
    ORDER BY id
    LIMIT %(limit)s
), locked AS MATERIALIZED (
    SELECT j.id FROM notifyq.jobs AS j
    WHERE j.id IN (SELECT id FROM candidates WHERE hit)
      AND j.status = ANY (%(statuses)s::text[])
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED
), done AS MATERIALIZED (
    SELECT c.was, c.status, c.was = c.status AS asked
    FROM locked AS l CROSS JOIN LATERAL notifyq.cancel_job_v2(l.id) AS c
)
SELECT (SELECT count(*) FROM done WHERE status = 'cancelled' AND was <> 'cancelled')::integer,
       (SELECT count(*) FROM done WHERE was = 'processing' AND status = 'processing')::integer,
       (SELECT count(*) FROM candidates)::integer,
       (SELECT id FROM candidates ORDER BY id DESC LIMIT 1);

-- Retry: each chosen job goes back as notifyq.retry_v2 says (as in retry_jobs: of several with
-- one dedup_key only the newest, the members of a group in the order they were submitted).
-- name: bulk_retry_jobs
WITH candidates AS MATERIALIZED (
    SELECT id, %(contains)s::jsonb IS NULL OR payload @> %(contains)s::jsonb AS hit
    FROM notifyq.jobs
    WHERE status = ANY (%(statuses)s::text[]) AND id > %(after)s::uuid
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
    ORDER BY id
    LIMIT %(limit)s
), locked AS MATERIALIZED (
    SELECT j.id, j.queue, j.dedup_key, j.created_at, j.group_seq FROM notifyq.jobs AS j
    WHERE j.id IN (SELECT id FROM candidates WHERE hit)
      AND j.status = ANY (%(statuses)s::text[])
    ORDER BY j.id
    FOR UPDATE SKIP LOCKED
), chosen AS MATERIALIZED (
    SELECT DISTINCT ON (queue, coalesce(dedup_key, id::text)) id, group_seq
    FROM locked
    ORDER BY queue, coalesce(dedup_key, id::text), created_at DESC
), retried AS MATERIALIZED (
    SELECT r.refused
    FROM (SELECT id FROM chosen ORDER BY group_seq NULLS LAST, id) AS c
    CROSS JOIN LATERAL notifyq.retry_v2(c.id) AS r
)
SELECT (SELECT count(*) FROM retried WHERE refused IS NULL)::integer,
       0,
       (SELECT count(*) FROM candidates)::integer,
       (SELECT id FROM candidates ORDER BY id DESC LIMIT 1);

-- Delete: finished jobs only, and never one that a job not started yet depends on (as
-- delete_job).
-- name: bulk_delete_jobs
WITH candidates AS MATERIALIZED (
    SELECT id, %(contains)s::jsonb IS NULL OR payload @> %(contains)s::jsonb AS hit
    FROM notifyq.jobs
    WHERE status = ANY (%(statuses)s::text[]) AND id > %(after)s::uuid
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(group_key)s::text IS NULL OR group_key = %(group_key)s::text)
    ORDER BY id
    LIMIT %(limit)s
), locked AS MATERIALIZED (
    SELECT j.id FROM notifyq.jobs AS j
    WHERE j.id IN (SELECT id FROM candidates WHERE hit)
      AND j.status = ANY (%(statuses)s::text[])
      AND j.status IN ('completed', 'failed', 'cancelled')
    ORDER BY j.id
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM notifyq.jobs AS j
    USING locked AS l
    WHERE j.id = l.id
      AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS c
                      WHERE c.status IN ('waiting', 'queued') AND c.depends_on <> '{}'
                        AND c.depends_on @> ARRAY[j.id])
    RETURNING 1
)
SELECT (SELECT count(*) FROM deleted)::integer,
       0,
       (SELECT count(*) FROM candidates)::integer,
       (SELECT id FROM candidates ORDER BY id DESC LIMIT 1);

-- Why a queue's due jobs may not move, for each queue named: the due jobs whose task no worker
-- registered (and up to 5 such task names), those whose task's breaker is open, and the idle
-- workers listening on the queue (a mark with no queues serves every queue). The queues are
-- named by the caller: a queue with nothing due and no row in notifyq.queues is still served
-- by the workers serving every queue, and no list of names kept here would know of it.
-- name: queue_conditions
WITH due AS (
    SELECT j.queue, j.task, count(*) AS n
    FROM notifyq.jobs AS j
    WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
    GROUP BY j.queue, j.task
), per_queue AS (
    SELECT d.queue,
           sum(d.n) FILTER (WHERE t.name IS NULL)::bigint AS unregistered,
           (array_agg(d.task ORDER BY d.n DESC) FILTER (WHERE t.name IS NULL))[1:5]
               AS unregistered_tasks,
           (array_agg(d.task ORDER BY d.n DESC)
               FILTER (WHERE t.breaker_open_until > now()))[1:5] AS breaker_open_tasks
    FROM due AS d LEFT JOIN notifyq.tasks AS t ON t.name = d.task
    GROUP BY d.queue
), names AS (
    SELECT DISTINCT queue FROM unnest(%(queues)s::text[]) AS queue
)
SELECT n.queue,
       coalesce(p.unregistered, 0) AS unregistered,
       coalesce(p.unregistered_tasks, '{}') AS unregistered_tasks,
       coalesce(p.breaker_open_tasks, '{}') AS breaker_open_tasks,
       (SELECT count(*) FROM notifyq.waiting_workers AS w
        WHERE w.expires_at > now() AND (w.queues IS NULL OR n.queue = ANY (w.queues)))::integer
           AS listening
FROM names AS n
LEFT JOIN per_queue AS p ON p.queue = n.queue
ORDER BY n.queue;

-- The workers the database knows of: those idle and listening (their marks in
-- waiting_workers) and those holding running jobs, with up to 20 of those jobs each.
-- name: list_workers
WITH idle AS (
    SELECT worker_id, queues, expires_at
    FROM notifyq.waiting_workers
    WHERE expires_at > now()
), busy AS (
    SELECT worker_id, count(*)::integer AS running
    FROM notifyq.jobs
    WHERE status = 'processing' AND worker_id IS NOT NULL
    GROUP BY worker_id
), workers AS (
    SELECT coalesce(i.worker_id, b.worker_id) AS worker_id,
           i.worker_id IS NOT NULL AS listening, i.queues, i.expires_at AS listening_until,
           coalesce(b.running, 0) AS running
    FROM idle AS i FULL JOIN busy AS b ON b.worker_id = i.worker_id
    ORDER BY 1
    LIMIT %(limit)s
)
SELECT w.worker_id, w.listening, w.queues, w.listening_until, w.running,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'job_id', r.id, 'task', r.task, 'queue', r.queue,
                   'started_at', r.started_at, 'lease_expires_at', r.lease_expires_at)
               ORDER BY r.started_at, r.id), '[]'::jsonb)
        FROM (SELECT id, task, queue, started_at, lease_expires_at
              FROM notifyq.jobs
              WHERE status = 'processing' AND worker_id = w.worker_id
              ORDER BY started_at, id
              LIMIT 20) AS r) AS jobs
FROM workers AS w
ORDER BY w.worker_id;

-- Jobs finished per minute over the last %(minutes)s minutes and the one under way (see
-- notifyq.minute_stats_v1: stored once per minute, so every API process answers the same).
-- name: minute_stats
SELECT minute, completed, failed, cancelled, partial
FROM notifyq.minute_stats_v1(%(minutes)s, %(fill)s);

-- When there is anything to count per minute: notifyq's install in this database (its first
-- migration), or the oldest finished job if one is older (a restored dump). The minutes before
-- it are not counts still missing: no job of this database ended in them.
-- name: counted_since
SELECT least((SELECT min(applied_at) FROM notifyq.migrations),
             (SELECT min(finished_at) FROM notifyq.jobs
              WHERE status IN ('completed', 'failed', 'cancelled')));

-- The dashboard's Scheduled page: queued jobs due later (first runs, retries waiting out their
-- backoff, snoozed jobs), soonest first, one page after the (run_at, id) cursor. Jobs held back
-- by their group are left out (jobs_deferred_idx serves the rest; the Jobs page lists
-- them: a job due later was deferred, so its run_at is past its created_at). The last
-- error's time and attempt come as text: the API tells retries from snoozes with them, and a
-- stored value that is not a time must not fail the page.
-- name: scheduled_jobs
SELECT id, task, queue, priority, run_at, attempt_count, max_attempts, claims, created_at,
       started_at, left(last_error, 500) AS last_error,
       CASE WHEN jsonb_typeof(errors) = 'array' THEN errors -> -1 ->> 'at' END AS last_error_at,
       CASE WHEN jsonb_typeof(errors) = 'array' THEN errors -> -1 ->> 'attempt' END
           AS last_error_attempt,
       now() AS now
FROM ONLY notifyq.jobs
WHERE status = 'queued' AND NOT group_blocked AND run_at > created_at AND run_at > now()
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(after_run_at)s::timestamptz IS NULL
       OR (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY run_at, id
LIMIT %(limit)s;

-- A queued job due later becomes due now, and the workers of its queue are woken (they sleep
-- until the next run_at they know, which may be this job's old one), and its watchers told.
-- Answers its queue (the other two columns are there for their effect); no row: it is not
-- queued for later (unknown, due already, or not queued).
-- name: run_job_now
WITH moved AS (
    UPDATE ONLY notifyq.jobs
    SET run_at = now()
    WHERE id = %(id)s AND status = 'queued' AND run_at > now()
    RETURNING id, queue, group_blocked
)
SELECT m.queue,
       CASE WHEN NOT m.group_blocked THEN notifyq.wake_v1(ARRAY[m.queue]) END AS woken,
       notifyq.announce_v1(ARRAY[m.id]) IS NULL AS announced
FROM moved AS m;

-- The dashboard's Cron page: every task registered with a cron expression, its last tick (and
-- the job that tick enqueued, with its status), and the switches of the queue its jobs go to.
-- name: periodic_tasks
SELECT t.name, t.options ->> 'cron' AS cron, t.updated_at AS registered_at,
       coalesce(j.queue, t.options ->> 'queue', 'default') AS queue,
       coalesce(q.paused, false) AS queue_paused,
       l.tick AS last_tick, l.job_id AS last_job_id, j.status AS last_job_status,
       j.finished_at AS last_job_finished_at,
       now() AS now
FROM notifyq.tasks AS t
LEFT JOIN LATERAL (
    SELECT p.tick, p.job_id FROM notifyq.periodic_ticks AS p
    WHERE p.name = t.name ORDER BY p.tick DESC LIMIT 1
) AS l ON true
LEFT JOIN notifyq.jobs AS j ON j.id = l.job_id
LEFT JOIN notifyq.queues AS q ON q.name = coalesce(j.queue, t.options ->> 'queue', 'default')
WHERE jsonb_typeof(t.options -> 'cron') = 'string'
ORDER BY t.name
LIMIT %(limit)s;

-- -- What `notifyq doctor`, /metrics and the maintenance leader read of the database's health --

-- The snapshots that hold the xmin horizon back, oldest first: sessions (their transaction's
-- age, and what runs), replication slots and prepared transactions. Since PostgreSQL 14 a
-- session of another database holds nothing here, so only this database's are named (all of
-- them on 13). A role without pg_read_all_stats sees others' queries as
-- "<insufficient privilege>".
-- name: horizon_holders
WITH here AS (
    SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()
), every_database AS (
    SELECT pg_catalog.current_setting('server_version_num')::integer < 140000 AS yes
)
SELECT kind, holder, age_seconds, xid_age, detail
FROM (
    SELECT 'session' AS kind, a.pid::text AS holder,
           extract(epoch FROM pg_catalog.clock_timestamp()
                              - coalesce(a.xact_start, a.query_start, a.backend_start))::float8
               AS age_seconds,
           pg_catalog.age(a.backend_xmin)::bigint AS xid_age,
           pg_catalog.jsonb_build_object(
               'pid', a.pid, 'database', a.datname, 'user', a.usename,
               'application', a.application_name, 'state', a.state,
               'query', pg_catalog.left(a.query, 300)) AS detail
    FROM pg_catalog.pg_stat_activity AS a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_catalog.pg_backend_pid()
      AND (a.datid IS NULL OR a.datid = (SELECT oid FROM here)
           OR (SELECT yes FROM every_database))
    UNION ALL
    SELECT 'replication slot', s.slot_name::text, NULL,
           pg_catalog.age(s.xmin)::bigint,
           pg_catalog.jsonb_build_object('slot', s.slot_name, 'active', s.active,
                                         'database', s.database)
    FROM pg_catalog.pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', p.gid,
           extract(epoch FROM pg_catalog.clock_timestamp() - p.prepared)::float8,
           pg_catalog.age(p.transaction)::bigint,
           pg_catalog.jsonb_build_object('gid', p.gid, 'owner', p.owner, 'database', p.database)
    FROM pg_catalog.pg_prepared_xacts AS p
    WHERE p.database = pg_catalog.current_database() OR (SELECT yes FROM every_database)
) AS h
ORDER BY xid_age DESC NULLS LAST, age_seconds DESC NULLS LAST
LIMIT 5;

-- Live and dead row versions of notifyq's busy tables (the statistics' counts, not exact).
-- name: table_tuples
SELECT s.relname::text AS "table", s.n_live_tup AS live, s.n_dead_tup AS dead,
       greatest(s.last_vacuum, s.last_autovacuum) AS vacuumed_at
FROM pg_catalog.pg_stat_user_tables AS s
WHERE s.schemaname = 'notifyq'
  AND s.relname IN ('jobs', 'jobs_done', 'claim_floors', 'leaders', 'waiting_workers',
                    'watched_jobs', 'queues', 'tasks', 'minute_stats')
ORDER BY s.relname;

-- The LISTEN connections of notifyq's processes on this database, and whether each still
-- receives: one inside a transaction gets nothing until it ends, and one waiting to write to
-- its client (ClientWrite) has a client that stopped reading.
-- name: listener_connections
SELECT a.pid, a.application_name, a.state, a.wait_event,
       extract(epoch FROM pg_catalog.clock_timestamp() - a.state_change)::float8
           AS state_seconds
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = pg_catalog.current_database()
  AND a.application_name IN ('notifyq-listener', 'notifyq-client-listener')
ORDER BY a.pid;

-- The rest of what the doctor reads, in one row.
-- name: health_overview
SELECT (SELECT max(version) FROM notifyq.migrations) AS schema_version,
       pg_catalog.pg_notification_queue_usage() AS notification_queue_usage,
       pg_catalog.current_setting('autovacuum') = 'on' AS autovacuum,
       (SELECT count(*) FROM ONLY notifyq.jobs AS j
        WHERE j.status = 'processing'
          AND (j.lease_expires_at IS NULL OR j.lease_expires_at < now())) AS expired_leases,
       (SELECT extract(epoch FROM now() - min(j.lease_expires_at))::float8
        FROM ONLY notifyq.jobs AS j
        WHERE j.status = 'processing' AND j.lease_expires_at < now()) AS oldest_expired_seconds,
       (SELECT l.holder FROM notifyq.leaders AS l
        WHERE l.role = 'maintenance' AND l.expires_at > now()) AS leader,
       (SELECT count(*) FROM notifyq.waiting_workers AS w WHERE w.expires_at > now())
           AS idle_workers,
       (SELECT count(DISTINCT j.worker_id) FROM ONLY notifyq.jobs AS j
        WHERE j.status = 'processing') AS busy_workers,
       -- The levels (queue, priority) whose first claimable job is of a task no worker has
       -- registered: it waits for ever, and holds the level's claim floor where it is (every
       -- claim then steps over the jobs claimed since; behind a long transaction, their dead
       -- index entries). One probe a level, from its floor; at most 20 levels.
       coalesce((SELECT jsonb_agg(u ORDER BY u.waited_seconds DESC)
                 FROM (SELECT f.queue, f.priority, h.task,
                              extract(epoch FROM now() - h.run_at)::float8 AS waited_seconds
                       FROM notifyq.claim_floors AS f
                       CROSS JOIN LATERAL (
                           SELECT j.task, j.run_at FROM ONLY notifyq.jobs AS j
                           WHERE j.queue = f.queue AND j.priority = f.priority
                             AND (j.run_at, j.id) >= (f.run_at, f.id)
                             AND j.status = 'queued' AND NOT j.group_blocked
                           ORDER BY j.run_at, j.id
                           LIMIT 1) AS h
                       WHERE h.run_at <= now()
                         AND NOT EXISTS (SELECT 1 FROM notifyq.tasks AS t WHERE t.name = h.task)
                       ORDER BY h.run_at
                       LIMIT 20) AS u), '[]'::jsonb) AS unserved,
       -- Functions PUBLIC may run besides notifyq.enqueue (sql/022 left it the only one) and
       -- notifyq.signal (sql/023 made it the second, for psql users).
       ARRAY(SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'notifyq'::regnamespace
               AND p.proname NOT IN ('enqueue', 'signal')
               AND pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE')
             ORDER BY 1) AS public_functions,
       -- Roles that read every job's payload without being workers (producers granted before
       -- version 22 keep their SELECT until granted again).
       ARRAY(SELECT DISTINCT r.grantee::regrole::text
             FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS r
             WHERE c.oid = 'notifyq.jobs'::regclass AND r.privilege_type = 'SELECT'
               AND r.grantee <> 0 AND r.grantee <> c.relowner
               AND NOT pg_catalog.has_table_privilege(r.grantee, c.oid, 'UPDATE')
             ORDER BY 1) AS job_readers;

-- -- Durable jobs (sql/023) -------------------------------------------------------------------

-- A job's recorded steps and marks, the signals sent to it, and the database's time (see
-- notifyq.durable_state_v1).
-- name: durable_state
SELECT kind, name, value FROM notifyq.durable_state_v1(%(job_id)s)

-- Stores a step's result, fenced by the claim (see notifyq.record_step_v1).
-- name: record_step
SELECT notifyq.record_step_v1(%(worker_id)s, %(job_id)s, %(claim)s, %(name)s, %(result)s::jsonb)

-- Suspends jobs their worker holds (see notifyq.suspend_v1); answers each with its status.
-- name: suspend_jobs
SELECT id, status FROM notifyq.suspend_v1(%(worker_id)s, %(ids)b::uuid[], %(claims)b::integer[],
                                         %(delays)b::float8[], %(signals)b::text[],
                                         %(marks)b::text[], %(kinds)b::text[])

-- Sends a signal to a job (see notifyq.signal_v1): sent, duplicate, unknown, final or too_many.
-- name: signal_job
SELECT notifyq.signal_v1(%(job_id)s, %(name)s, %(payload)s::jsonb)
