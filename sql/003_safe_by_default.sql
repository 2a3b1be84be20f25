-- notifyq schema, version 3: safe by default.
--
-- What this changes, and why:
-- - Every function runs with a pinned search_path (pg_catalog, then pg_temp), so a role that may
--   create objects in a schema of the caller's path (public, on PostgreSQL 13 and 14) cannot
--   slip an overload of a built-in (jsonb_build_object, format, unnest, ...) under a worker that
--   runs as a superuser. Functions that clients call (enqueue) and the insert triggers run as the
--   schema's owner (SECURITY DEFINER), so a producer role needs no more than INSERT on the jobs
--   table or EXECUTE on notifyq.enqueue (see `notifyq grant`).
-- - A row inserted by SQL is untrusted input. Columns that only the engine writes (status,
--   attempts, lease, worker, timestamps of its life, result, errors) are refused on INSERT: a
--   producer could otherwise insert a 'processing' row that no rescuer looks at, or a
--   'completed' row with a made-up result. Times must be finite and in the range Python holds.
-- - The job-defaults rule (task from payload.task, queue, priority and max_attempts from the
--   task's registration, then the settings) is written once, in notifyq.job_defaults_v1, and
--   used by the insert trigger and by every enqueue function. A plain INSERT of (task, payload)
--   now gets the task's queue and priority, as HTTP and Python submissions do.
-- - Leases are fenced by a claim counter that only grows, so that an attempt given back (a
--   worker that died before its handler was confirmed running does not use up an attempt) can
--   never let a stale outcome through. A 'processing' row without a lease counts as expired.
--
-- Workers of versions 1 and 2 keep their functions (now pinned too). The new functions carry
-- version suffixes of their own.

-- -- pinned search_path for everything that exists -------------------------------------------

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
             WHERE p.pronamespace = 'notifyq'::regnamespace
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END;
$$;

-- -- the jobs table ------------------------------------------------------------------------

-- queue and priority lose their column defaults: the insert trigger fills them from the task's
-- registration, which a column default cannot tell apart from an explicit 'default' or 0.
ALTER TABLE notifyq.jobs
    ALTER COLUMN queue DROP DEFAULT,
    ALTER COLUMN priority DROP DEFAULT,
    -- How many times the job was claimed. Only grows: with worker_id it fences every write a
    -- worker makes about a job it holds (attempt_count may be given back, so it cannot).
    ADD COLUMN claims integer NOT NULL DEFAULT 0 CHECK (claims >= 0),
    -- The last heartbeat that found this job's handler running; NULL until the first one of
    -- each claim. A rescue of a job never confirmed running gives its attempt back.
    ADD COLUMN heartbeat_at timestamptz,
    -- Attempts given back that way; after max_attempts of them they count again, so a job that
    -- kills its worker as soon as it starts cannot go round for ever.
    ADD COLUMN lost_count integer NOT NULL DEFAULT 0 CHECK (lost_count >= 0);

-- Times that Python (and so every client of ours) can read. NOT VALID: rows written before this
-- version are left as they are (readers cope with them); every new or changed row is checked.
ALTER TABLE notifyq.jobs ADD CONSTRAINT jobs_times_in_range CHECK (
    run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
    AND created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
    AND (started_at IS NULL
         OR started_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
    AND (finished_at IS NULL
         OR finished_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
    AND (lease_expires_at IS NULL
         OR lease_expires_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
    AND (heartbeat_at IS NULL
         OR heartbeat_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
    AND (cancel_requested_at IS NULL
         OR cancel_requested_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
) NOT VALID;

-- Rows of earlier versions holding a time out of that range (an 'infinity' run_at inserted by
-- SQL, say) would fail the check at their next write (a claim, a cancel, a retry): those that
-- can still change, all but the completed ones, are brought into range. 'infinity' becomes the
-- range's end, which means the same.
UPDATE notifyq.jobs SET
    run_at = CASE WHEN run_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                 WHEN run_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                 ELSE run_at END,
    created_at = CASE WHEN created_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                     WHEN created_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                     ELSE created_at END,
    started_at = CASE WHEN started_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                     WHEN started_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                     ELSE started_at END,
    finished_at = CASE WHEN finished_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                      WHEN finished_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                      ELSE finished_at END,
    lease_expires_at = CASE WHEN lease_expires_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                           WHEN lease_expires_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                           ELSE lease_expires_at END,
    cancel_requested_at = CASE WHEN cancel_requested_at > '9999-01-01 00:00:00+00' THEN '9998-12-31 00:00:00+00'
                              WHEN cancel_requested_at < '1900-01-01 00:00:00+00' THEN '1900-01-01 00:00:00+00'
                              ELSE cancel_requested_at END
WHERE status <> 'completed'
  AND (run_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
       OR created_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
       OR started_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
       OR finished_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
       OR lease_expires_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
       OR cancel_requested_at NOT BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00');

-- The rescuer's scan now also finds processing rows without a lease.
DROP INDEX notifyq.jobs_lease_idx;
CREATE INDEX jobs_lease_idx ON notifyq.jobs (lease_expires_at NULLS FIRST)
    WHERE status = 'processing';

-- -- the job-defaults rule ---------------------------------------------------------------------

-- The one place that decides what a job left out: the task is the one named, else payload.task
-- when it is a string, else the default task; queue and priority are the job's, else its task's
-- registration (@task(queue=..., priority=...), written by every worker that serves it), else
-- 'default' and 0; max_attempts is the job's, else the task's, else p_fallback (a process's own
-- NOTIFYQ_MAX_ATTEMPTS), else the database's setting, else 3. Set-based: one call answers a
-- whole batch, one row per input position (ord, 1-based).
--
-- It runs as the schema's owner, so that a producer needs no privilege on the tasks and settings
-- it reads.
CREATE FUNCTION notifyq.job_defaults_v1(
    p_tasks text[], p_payloads jsonb[], p_queues text[], p_priorities integer[],
    p_max_attempts integer[], p_fallback integer
) RETURNS TABLE (ord integer, task text, queue text, priority integer, max_attempts integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT u.ord::integer, n.task,
           coalesce(u.queue, t.options ->> 'queue', 'default'),
           coalesce(u.priority, (t.options ->> 'priority')::integer, 0),
           coalesce(u.max_attempts, t.max_attempts, p_fallback,
                    (SELECT s.value::integer FROM notifyq.settings AS s
                     WHERE s.key = 'max_attempts'),
                    3)
    FROM unnest(p_tasks, p_payloads, p_queues, p_priorities, p_max_attempts) WITH ORDINALITY
         AS u(task, payload, queue, priority, max_attempts, ord)
    CROSS JOIN LATERAL (
        SELECT coalesce(
            u.task,
            CASE WHEN jsonb_typeof(u.payload -> 'task') = 'string' THEN u.payload ->> 'task' END,
            (SELECT s.value FROM notifyq.settings AS s WHERE s.key = 'default_task'),
            'echo') AS task
    ) AS n
    LEFT JOIN notifyq.tasks AS t ON t.name = n.task
    ORDER BY u.ord;
END;
$$;

-- -- what an INSERT may say --------------------------------------------------------------------

-- Runs for a row that needs a default or names something it may not: refuses columns that only
-- the engine writes (naming them), refuses times out of range, then fills the defaults.
CREATE FUNCTION notifyq.accept_job_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owned text[] := ARRAY[]::text[];
    v_defaults record;
BEGIN
    IF NEW.status IS DISTINCT FROM 'queued' THEN v_owned := v_owned || 'status'::text; END IF;
    IF NEW.attempt_count <> 0 THEN v_owned := v_owned || 'attempt_count'::text; END IF;
    IF NEW.claims <> 0 THEN v_owned := v_owned || 'claims'::text; END IF;
    IF NEW.lost_count <> 0 THEN v_owned := v_owned || 'lost_count'::text; END IF;
    IF NEW.worker_id IS NOT NULL THEN v_owned := v_owned || 'worker_id'::text; END IF;
    IF NEW.lease_expires_at IS NOT NULL THEN
        v_owned := v_owned || 'lease_expires_at'::text;
    END IF;
    IF NEW.heartbeat_at IS NOT NULL THEN v_owned := v_owned || 'heartbeat_at'::text; END IF;
    IF NEW.started_at IS NOT NULL THEN v_owned := v_owned || 'started_at'::text; END IF;
    IF NEW.finished_at IS NOT NULL THEN v_owned := v_owned || 'finished_at'::text; END IF;
    IF NEW.result IS NOT NULL THEN v_owned := v_owned || 'result'::text; END IF;
    IF NEW.last_error IS NOT NULL THEN v_owned := v_owned || 'last_error'::text; END IF;
    IF NEW.errors IS DISTINCT FROM '[]'::jsonb THEN v_owned := v_owned || 'errors'::text; END IF;
    IF NEW.cancel_requested_at IS NOT NULL THEN
        v_owned := v_owned || 'cancel_requested_at'::text;
    END IF;
    IF cardinality(v_owned) > 0 THEN
        RAISE EXCEPTION 'notifyq.jobs: % % set by notifyq''s workers, not by an INSERT',
                        array_to_string(v_owned, ', '),
                        CASE WHEN cardinality(v_owned) = 1 THEN 'is' ELSE 'are' END
            USING ERRCODE = 'check_violation',
                  HINT = 'Insert the task and payload (and queue, priority, run_at, dedup_key, '
                         'max_attempts) only: every job starts queued.';
    END IF;
    IF NOT NEW.run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'notifyq.jobs: run_at must be a finite time between the years 1900 and '
                        '9998, not %', NEW.run_at
            USING ERRCODE = 'datetime_field_overflow';
    END IF;
    IF NOT NEW.created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'notifyq.jobs: created_at must be a finite time between the years 1900 '
                        'and 9998, not %', NEW.created_at
            USING ERRCODE = 'datetime_field_overflow';
    END IF;
    IF NEW.task IS NULL OR NEW.queue IS NULL OR NEW.priority IS NULL
       OR NEW.max_attempts IS NULL THEN
        SELECT d.task, d.queue, d.priority, d.max_attempts INTO v_defaults
        FROM notifyq.job_defaults_v1(ARRAY[NEW.task], ARRAY[NEW.payload], ARRAY[NEW.queue],
                                     ARRAY[NEW.priority], ARRAY[NEW.max_attempts], NULL) AS d;
        NEW.task := v_defaults.task;
        NEW.queue := v_defaults.queue;
        NEW.priority := v_defaults.priority;
        NEW.max_attempts := v_defaults.max_attempts;
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER jobs_fill_defaults ON notifyq.jobs;
DROP FUNCTION notifyq.fill_job_defaults_v1();

-- The WHEN clause is evaluated without entering PL/pgSQL: a row that gives every value and names
-- nothing it may not costs the trigger nothing.
CREATE TRIGGER jobs_accept
    BEFORE INSERT ON notifyq.jobs
    FOR EACH ROW
    WHEN (NEW.task IS NULL OR NEW.queue IS NULL OR NEW.priority IS NULL
          OR NEW.max_attempts IS NULL
          OR NEW.status IS DISTINCT FROM 'queued' OR NEW.attempt_count <> 0 OR NEW.claims <> 0
          OR NEW.lost_count <> 0 OR NEW.worker_id IS NOT NULL
          OR NEW.lease_expires_at IS NOT NULL OR NEW.heartbeat_at IS NOT NULL
          OR NEW.started_at IS NOT NULL OR NEW.finished_at IS NOT NULL
          OR NEW.result IS NOT NULL OR NEW.last_error IS NOT NULL
          OR NEW.errors IS DISTINCT FROM '[]'::jsonb OR NEW.cancel_requested_at IS NOT NULL
          OR NOT NEW.run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
          OR NOT NEW.created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
    EXECUTE FUNCTION notifyq.accept_job_v1();

-- The statement-level notify trigger reads the waiting workers and the queues' switches: as the
-- owner, so that a producer needs no privilege on them.
ALTER FUNCTION notifyq.notify_inserted_v1() SECURITY DEFINER;

-- -- enqueueing --------------------------------------------------------------------------------

-- Enqueues one job with the duplicate rule of the public contract: while a job with the same
-- (queue, dedup_key) is queued, the new submission replaces its payload, priority, run_at and
-- max_attempts and its id is answered with duplicate = true. The unique index decides; the loop
-- covers the moment when the queued duplicate is being claimed concurrently. NULLs take the
-- defaults of notifyq.job_defaults_v1; run_at, else now() + p_delay seconds, else now().
CREATE FUNCTION notifyq.enqueue_v2(
    p_task text,
    p_payload jsonb,
    p_queue text,
    p_priority integer,
    p_run_at timestamptz,
    p_delay float8,
    p_dedup_key text,
    p_max_attempts integer,
    p_fallback integer
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_new_id uuid := gen_random_uuid();
    v_payload jsonb := coalesce(p_payload, '{}'::jsonb);
    v_job record;
    d record;
BEGIN
    SELECT * INTO d
    FROM notifyq.job_defaults_v1(ARRAY[p_task], ARRAY[v_payload], ARRAY[p_queue],
                                 ARRAY[p_priority], ARRAY[p_max_attempts], p_fallback);
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts)
        VALUES (v_new_id, d.task, v_payload, d.queue, d.priority,
                coalesce(p_run_at, now() + make_interval(secs => coalesce(p_delay, 0))),
                p_dedup_key, d.max_attempts)
        ON CONFLICT (queue, dedup_key) WHERE status = 'queued' AND dedup_key IS NOT NULL
        DO UPDATE SET payload = EXCLUDED.payload,
                      priority = EXCLUDED.priority,
                      run_at = EXCLUDED.run_at,
                      max_attempts = EXCLUDED.max_attempts
            WHERE j.status = 'queued'
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at INTO v_job;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_job.id <> v_new_id THEN
        -- A replaced job may now be due earlier than the time its workers sleep until.
        PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
    END IF;
    RETURN QUERY SELECT v_job.id, v_job.id <> v_new_id, v_job.status, v_job.run_at,
                        v_job.created_at;
END;
$$;

-- Enqueues many jobs in one call, with the same rules as enqueue_v2, and answers one row per input
-- position (ord, 1-based). Jobs without a dedup_key go in as one INSERT ... SELECT (one trigger
-- call, one notification per queue); jobs with one go through enqueue_v2 in input order, so that a
-- later duplicate in the same batch replaces an earlier one exactly as separate calls would. A
-- column that no job sets may come as one NULL array: unnest() pads it with NULLs.
CREATE FUNCTION notifyq.enqueue_many_v2(
    p_tasks text[],
    p_payloads jsonb[],
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[],
    p_delays float8[],
    p_dedup_keys text[],
    p_max_attempts integer[],
    p_fallback integer
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_plain boolean := p_dedup_keys IS NULL OR array_position(p_dedup_keys, NULL) IS NOT NULL;
BEGIN
    -- The answer comes from the input, not from joining the inserted rows back (which the
    -- planner, with no statistics on either side, ran as a nested loop: quadratic in the batch).
    -- Every inserted row is queued, created at now() and due at its run_at.
    IF v_plain THEN
        RETURN QUERY
        WITH input AS MATERIALIZED (
            SELECT gen_random_uuid() AS id, u.ord, coalesce(u.payload, '{}'::jsonb) AS payload,
                   coalesce(u.run_at, now() + make_interval(secs => coalesce(u.delay, 0)))
                       AS run_at,
                   u.dedup_key
            FROM unnest(p_payloads, p_run_ats, p_delays, p_dedup_keys) WITH ORDINALITY
                 AS u(payload, run_at, delay, dedup_key, ord)
        ), inserted AS (
            INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts)
            SELECT i.id, d.task, i.payload, d.queue, d.priority, i.run_at, d.max_attempts
            FROM input AS i
            JOIN notifyq.job_defaults_v1(p_tasks, p_payloads, p_queues, p_priorities,
                                         p_max_attempts, p_fallback) AS d ON d.ord = i.ord
            WHERE i.dedup_key IS NULL
            RETURNING 1
        )
        SELECT i.ord::integer, i.id, false, 'queued'::text, i.run_at, now()
        FROM input AS i
        WHERE i.dedup_key IS NULL AND (SELECT count(*) FROM inserted) >= 0;
    END IF;

    IF p_dedup_keys IS NOT NULL THEN
        FOR r IN
            SELECT u.*
            FROM unnest(p_tasks, p_payloads, p_queues, p_priorities, p_run_ats, p_delays,
                        p_dedup_keys, p_max_attempts) WITH ORDINALITY
                 AS u(task, payload, queue, priority, run_at, delay, dedup_key, max_attempts, ord)
            WHERE u.dedup_key IS NOT NULL
            ORDER BY u.ord
        LOOP
            RETURN QUERY
            SELECT r.ord::integer, e.job_id, e.duplicate, e.status, e.run_at, e.created_at
            FROM notifyq.enqueue_v2(r.task, r.payload, r.queue, r.priority, r.run_at, r.delay,
                                    r.dedup_key, r.max_attempts, p_fallback) AS e;
        END LOOP;
    END IF;
END;
$$;

-- The SQL face of the queue: SELECT notifyq.enqueue('echo', '{"n": 1}') returns the job id. A
-- queue or priority left out takes the task's own (its registration), like every other way in.
CREATE OR REPLACE FUNCTION notifyq.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL
) RETURNS uuid
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.job_id FROM notifyq.enqueue_v2(task, payload, queue, priority, run_at, NULL,
                                            dedup_key, max_attempts, NULL) AS e;
$$;

-- Enqueues the job of one tick of a periodic task, unless another worker did: the tick's row is
-- the proof, inserted in the same transaction. Answers the job id, or NULL when the tick was
-- taken already.
CREATE FUNCTION notifyq.enqueue_tick_v2(p_task text, p_tick timestamptz, p_payload jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job_id uuid;
BEGIN
    INSERT INTO notifyq.periodic_ticks (name, tick) VALUES (p_task, p_tick)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.job_id INTO v_job_id
    FROM notifyq.enqueue_v2(p_task, p_payload, NULL, NULL, p_tick, NULL, NULL, NULL, NULL) AS e;
    UPDATE notifyq.periodic_ticks SET job_id = v_job_id WHERE name = p_task AND tick = p_tick;
    RETURN v_job_id;
END;
$$;

-- -- claiming ----------------------------------------------------------------------------------

-- The lease fence: whether a job is still held by the worker that claimed it under this claim
-- number. Every write a worker makes about a job it holds checks it in the same UPDATE, so a
-- worker that lost the job (its lease ran out and another took it, or it was cancelled by
-- a rescue) cannot overwrite it. IMMUTABLE SQL with no SET clause, so that the planner inlines
-- it into each caller: it is written once and costs nothing. It only compares its arguments
-- (with pg_catalog's operators, which no search_path can shadow for these exact types), and its
-- callers pin their search_path.
CREATE FUNCTION notifyq.holds_v1(p_status text, p_worker_id text, p_claims integer,
                                 p_holder text, p_claim integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- IS TRUE: no partial index on status = 'processing' can serve the test, so a caller's plan
    -- finds its rows by primary key instead of walking every processing job (see 001's
    -- release_jobs).
    SELECT (p_status = 'processing') IS TRUE AND p_worker_id = p_holder AND p_claims = p_claim
$$;

-- Starts the claimed jobs p_ids for p_worker_id: processing, an attempt counted, a new claim
-- number, a lease of p_lease seconds. The one UPDATE that claims, for both claim functions;
-- called with the rows already locked by the caller's SKIP LOCKED pick.
CREATE FUNCTION notifyq.start_jobs_v1(p_worker_id text, p_ids uuid[], p_lease float8)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
               attempt_count integer, max_attempts integer, claims integer,
               created_at float8, run_at float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE notifyq.jobs AS j
    SET status = 'processing',
        attempt_count = j.attempt_count + 1,
        claims = j.claims + 1,
        started_at = now(),
        finished_at = NULL,
        heartbeat_at = NULL,
        worker_id = p_worker_id,
        lease_expires_at = now() + make_interval(secs => p_lease)
    WHERE j.id = ANY(p_ids)
    RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
              j.claims, extract(epoch FROM j.created_at)::float8,
              extract(epoch FROM j.run_at)::float8;
END;
$$;

-- Claims up to p_limit due jobs of p_tasks (and p_queues, when given), highest priority first.
-- SKIP LOCKED lets concurrent workers take disjoint rows without waiting on each other; the row
-- locks last only for this statement, never while the job runs. Tasks whose circuit breaker is
-- open are skipped (unless p_probe: a worker holding that task's probe); paused queues are
-- skipped; jobs under a concurrency or rate limit are left to claim_limited_v2.
--
-- The settings pin the plan (see claim_v1 in 001): walk jobs_claim_idx in order and stop after
-- p_limit rows, whatever the statistics say.
CREATE FUNCTION notifyq.claim_v2(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
BEGIN
    v_ids := ARRAY(
        SELECT j.id
        FROM notifyq.jobs AS j
        WHERE j.status = 'queued' AND j.run_at <= now() AND j.task = ANY(p_tasks)
          AND (p_queues IS NULL OR j.queue = ANY(p_queues))
          AND (p_probe OR j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                         WHERE t.breaker_open_until IS NOT NULL))
          AND j.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                              WHERE q.paused OR q.rate_limit IS NOT NULL)
          AND j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                             WHERE t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM notifyq.start_jobs_v1(p_worker_id, v_ids, p_lease);
END;
$$;

-- Claims up to p_limit due jobs that are under a limit: a task's max_concurrency or rate_limit,
-- or a queue's rate_limit, all of them across every worker. See claim_limited_v1 (001) for how
-- the limit rows are locked and counted; the difference is the shared start (start_jobs_v1),
-- and that a processing job without a lease (or with one that ran out) no longer holds a slot.
CREATE FUNCTION notifyq.claim_limited_v2(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_room integer;
    v_tokens double precision;
    v_task_room jsonb := '{}'::jsonb;
    v_queue_room jsonb := '{}'::jsonb;
    v_ids uuid[] := '{}';
BEGIN
    FOR r IN
        SELECT t.name, t.max_concurrency, t.rate_limit, t.rate_tokens, t.rate_refilled_at,
               coalesce(t.rate_burst, greatest(t.rate_limit, 1)) AS burst
        FROM notifyq.tasks AS t
        WHERE t.name = ANY(p_tasks) AND t.breaker_open_until IS NULL
          AND (t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)
        ORDER BY t.name
        FOR UPDATE
    LOOP
        v_room := p_limit;
        IF r.max_concurrency IS NOT NULL THEN
            v_room := least(v_room, r.max_concurrency - (
                SELECT count(*) FROM notifyq.jobs AS j
                WHERE j.status = 'processing' AND j.task = r.name
                  AND j.lease_expires_at > now())::integer);
        END IF;
        IF r.rate_limit IS NOT NULL THEN
            v_tokens := least(r.burst, r.rate_tokens
                              + r.rate_limit * extract(epoch FROM now() - r.rate_refilled_at));
            v_room := least(v_room, floor(v_tokens)::integer);
            UPDATE notifyq.tasks AS t SET rate_tokens = v_tokens, rate_refilled_at = now()
            WHERE t.name = r.name;
        END IF;
        v_task_room := v_task_room || jsonb_build_object(r.name, greatest(v_room, 0));
    END LOOP;

    FOR r IN
        SELECT q.name, q.rate_limit, q.rate_tokens, q.rate_refilled_at,
               coalesce(q.rate_burst, greatest(q.rate_limit, 1)) AS burst
        FROM notifyq.queues AS q
        WHERE q.rate_limit IS NOT NULL AND NOT q.paused
          AND (p_queues IS NULL OR q.name = ANY(p_queues))
        ORDER BY q.name
        FOR UPDATE
    LOOP
        v_tokens := least(r.burst, r.rate_tokens
                          + r.rate_limit * extract(epoch FROM now() - r.rate_refilled_at));
        UPDATE notifyq.queues AS q SET rate_tokens = v_tokens, rate_refilled_at = now()
        WHERE q.name = r.name;
        v_queue_room := v_queue_room || jsonb_build_object(r.name, floor(v_tokens)::integer);
    END LOOP;

    IF v_task_room = '{}'::jsonb AND v_queue_room = '{}'::jsonb THEN
        RETURN;
    END IF;

    FOR r IN
        SELECT j.id, j.task, j.queue
        FROM notifyq.jobs AS j
        WHERE j.status = 'queued' AND j.run_at <= now() AND j.task = ANY(p_tasks)
          AND (p_queues IS NULL OR j.queue = ANY(p_queues))
          AND (v_task_room ? j.task OR v_queue_room ? j.queue)
          AND j.queue NOT IN (SELECT name FROM notifyq.queues WHERE paused)
          AND j.task NOT IN (SELECT name FROM notifyq.tasks
                             WHERE breaker_open_until IS NOT NULL
                                OR ((max_concurrency IS NOT NULL OR rate_limit IS NOT NULL)
                                    AND NOT v_task_room ? name))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT greatest(p_limit * 4, 100)
        FOR UPDATE SKIP LOCKED
    LOOP
        CONTINUE WHEN v_task_room ? r.task AND (v_task_room ->> r.task)::integer <= 0;
        CONTINUE WHEN v_queue_room ? r.queue AND (v_queue_room ->> r.queue)::integer <= 0;
        IF v_task_room ? r.task THEN
            v_task_room := jsonb_set(v_task_room, ARRAY[r.task],
                                     to_jsonb((v_task_room ->> r.task)::integer - 1));
        END IF;
        IF v_queue_room ? r.queue THEN
            v_queue_room := jsonb_set(v_queue_room, ARRAY[r.queue],
                                      to_jsonb((v_queue_room ->> r.queue)::integer - 1));
        END IF;
        v_ids := v_ids || r.id;
        EXIT WHEN cardinality(v_ids) >= p_limit;
    END LOOP;

    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH claimed AS (
        SELECT * FROM notifyq.start_jobs_v1(p_worker_id, v_ids, p_lease)
    ), spent_tasks AS (
        UPDATE notifyq.tasks AS t SET rate_tokens = t.rate_tokens - c.n
        FROM (SELECT claimed.task, count(*) AS n FROM claimed GROUP BY claimed.task) AS c
        WHERE t.name = c.task AND t.rate_limit IS NOT NULL
    ), spent_queues AS (
        UPDATE notifyq.queues AS q SET rate_tokens = q.rate_tokens - c.n
        FROM (SELECT claimed.queue, count(*) AS n FROM claimed GROUP BY claimed.queue) AS c
        WHERE q.name = c.queue AND q.rate_limit IS NOT NULL
    )
    SELECT * FROM claimed;
END;
$$;

-- -- writing what happened -------------------------------------------------------------------

-- Records successful attempts and answers the ids written; fenced by notifyq.holds_v1. A success
-- closes its task's circuit breaker (the task works again).
CREATE FUNCTION notifyq.complete_v2(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        UPDATE notifyq.jobs AS j
        SET status = 'completed',
            result = d.result,
            finished_at = now(),
            lease_expires_at = NULL
        FROM unnest(p_ids, p_claims, p_results) AS d(id, claim, result)
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.task
    ), closed AS (
        UPDATE notifyq.tasks AS t
        SET consecutive_failures = 0, breaker_open_until = NULL
        WHERE t.name IN (SELECT done.task FROM done)
          AND (t.consecutive_failures > 0 OR t.breaker_open_until IS NOT NULL)
    )
    SELECT done.id FROM done;
END;
$$;

-- Records failed attempts: back to queued at now() + delay while attempts are left (and the error
-- is retryable), else failed; fenced by notifyq.holds_v1. A job whose newer duplicate (same queue
-- and dedup_key) is queued is not retried: that newer job replaces it. Retryable failures count
-- towards the task's circuit breaker. Answers the id and new status of each job written.
CREATE FUNCTION notifyq.fail_v2(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_errors text[],
    p_retryable boolean[], p_delays float8[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH d AS (
        SELECT d.*,
               j.attempt_count < j.max_attempts AND d.retryable
                   AND j.cancel_requested_at IS NULL AS wants_retry,
               notifyq.queued_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM unnest(p_ids, p_claims, p_errors, p_retryable, p_delays)
             AS d(id, claim, error, retryable, delay)
        JOIN notifyq.jobs AS j ON j.id = d.id
    ), failed AS (
        UPDATE notifyq.jobs AS j
        SET status = CASE WHEN d.wants_retry AND d.newer IS NULL THEN 'queued' ELSE 'failed' END,
            run_at = CASE WHEN d.wants_retry AND d.newer IS NULL
                          THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.wants_retry AND d.newer IS NULL THEN NULL ELSE now() END,
            worker_id = CASE WHEN d.wants_retry AND d.newer IS NULL THEN NULL ELSE j.worker_id END,
            lease_expires_at = NULL,
            last_error = CASE WHEN d.wants_retry AND d.newer IS NOT NULL
                              THEN d.error || format(E'\nnot retried: job %s with the same '
                                                     'dedup_key is queued and replaces it',
                                                     d.newer)
                              ELSE d.error END,
            errors = notifyq.append_error_v1(j.errors, j.attempt_count, d.error, j.worker_id)
        FROM d
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.status, j.task, d.retryable
    ), counted AS (
        UPDATE notifyq.tasks AS t
        SET consecutive_failures = t.consecutive_failures + f.n,
            breaker_open_until = CASE
                WHEN t.consecutive_failures + f.n >= t.breaker_threshold
                THEN now() + make_interval(secs => t.breaker_cooldown)
                ELSE t.breaker_open_until END
        FROM (SELECT failed.task, count(*) AS n FROM failed WHERE failed.retryable
              GROUP BY failed.task) AS f
        WHERE t.name = f.task AND t.breaker_threshold IS NOT NULL
    )
    SELECT failed.id, failed.status FROM failed;
END;
$$;

-- Puts jobs a stopping worker could not finish back in the queue at once, without counting the
-- interrupted attempt, and wakes the other workers; fenced by notifyq.holds_v1. A job whose newer
-- duplicate is queued is cancelled instead (that job replaces it), and so is one whose cancel was
-- requested. Answers the ids written.
CREATE FUNCTION notifyq.release_v2(p_worker_id text, p_ids uuid[], p_claims integer[])
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH d AS (
        SELECT d.*,
               notifyq.queued_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM unnest(p_ids, p_claims) AS d(id, claim)
        JOIN notifyq.jobs AS j ON j.id = d.id
    ), released AS (
        UPDATE notifyq.jobs AS j
        SET status = CASE WHEN d.newer IS NULL AND j.cancel_requested_at IS NULL
                          THEN 'queued' ELSE 'cancelled' END,
            attempt_count = j.attempt_count - 1,
            run_at = now(),
            finished_at = CASE WHEN d.newer IS NULL AND j.cancel_requested_at IS NULL
                               THEN NULL ELSE now() END,
            worker_id = NULL,
            lease_expires_at = NULL,
            last_error = CASE WHEN j.cancel_requested_at IS NOT NULL
                              THEN 'cancelled while running (its worker was stopping)'
                              WHEN d.newer IS NOT NULL
                              THEN format('interrupted by a stopping worker; not requeued: job %s '
                                          'with the same dedup_key is queued', d.newer)
                              ELSE j.last_error END
        FROM d
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.queue, j.status
    ), woken AS (
        SELECT notifyq.wake_v1(array_agg(DISTINCT r.queue)) FROM released AS r
        WHERE r.status = 'queued'
    )
    SELECT r.id FROM released AS r WHERE (SELECT count(*) FROM woken) >= 0;
END;
$$;

-- The heartbeat: renews the leases of the jobs a worker holds and, for those whose handler runs
-- (p_running), confirms it (heartbeat_at); fenced by notifyq.holds_v1. Answers the ids still held,
-- each with whether a cancel was requested (which catches a request whose notification was lost).
CREATE FUNCTION notifyq.beat_v1(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_running boolean[], p_lease float8
) RETURNS TABLE (id uuid, cancel_requested boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE notifyq.jobs AS j
    SET lease_expires_at = now() + make_interval(secs => p_lease),
        heartbeat_at = CASE WHEN d.running THEN now() ELSE j.heartbeat_at END
    FROM unnest(p_ids, p_claims, p_running) AS d(id, claim, running)
    WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
    RETURNING j.id, j.cancel_requested_at IS NOT NULL;
END;
$$;

-- Records attempts stopped by a cancel request; fenced by notifyq.holds_v1.
CREATE FUNCTION notifyq.cancel_running_v2(p_worker_id text, p_ids uuid[], p_claims integer[])
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    UPDATE notifyq.jobs AS j
    SET status = 'cancelled',
        finished_at = now(),
        lease_expires_at = NULL,
        last_error = format('cancelled while running attempt %s', j.attempt_count)
    FROM unnest(p_ids, p_claims) AS d(id, claim)
    WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
    RETURNING j.id;
END;
$$;

-- -- rescuing ------------------------------------------------------------------------------------

-- Requeues (or fails, when out of attempts) jobs whose lease ran out, or that have none: their
-- worker died or hung, or the row was written by hand. SKIP LOCKED keeps rescuers on several
-- workers from blocking each other. A job whose handler no heartbeat ever confirmed running
-- (its worker died between the claim and the handler's start, or right after) gets its attempt
-- back, up to max_attempts times. A job whose newer duplicate is queued fails instead of going
-- back: that job replaces it. A job whose cancel was requested is cancelled. Answers each job
-- written with its new status and whether the attempt counted; wakes the queues of the jobs
-- requeued.
CREATE FUNCTION notifyq.rescue_v2(p_limit integer)
RETURNS TABLE (id uuid, status text, counted boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT j.id,
               j.heartbeat_at IS NOT NULL OR j.lost_count >= j.max_attempts AS counted,
               notifyq.queued_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM notifyq.jobs AS j
        WHERE j.status = 'processing'
          AND (j.lease_expires_at < now() OR j.lease_expires_at IS NULL)
        ORDER BY j.lease_expires_at NULLS FIRST
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), judged AS (
        SELECT e.id, e.counted, e.newer,
               CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                    WHEN e.newer IS NOT NULL THEN 'failed'
                    WHEN e.counted AND j.attempt_count >= j.max_attempts THEN 'failed'
                    ELSE 'queued' END AS next
        FROM expired AS e JOIN notifyq.jobs AS j ON j.id = e.id
    ), rescued AS (
        UPDATE notifyq.jobs AS j
        SET status = x.next,
            attempt_count = CASE WHEN x.counted THEN j.attempt_count
                                 ELSE greatest(j.attempt_count - 1, 0) END,
            lost_count = CASE WHEN x.counted THEN j.lost_count ELSE j.lost_count + 1 END,
            run_at = now(),
            finished_at = CASE WHEN x.next = 'queued' THEN NULL ELSE now() END,
            lease_expires_at = NULL,
            worker_id = CASE WHEN x.next = 'queued' THEN NULL ELSE j.worker_id END,
            last_error = format('lease expired: worker %s stopped renewing attempt %s of %s%s',
                                coalesce(j.worker_id, '(none)'), j.attempt_count, j.max_attempts,
                                CASE WHEN x.newer IS NOT NULL
                                     THEN format('; not retried: job %s with the same dedup_key '
                                                 'is queued', x.newer)
                                     WHEN NOT x.counted
                                     THEN '; its handler was never confirmed running, so the '
                                          'attempt was not counted'
                                     WHEN x.next = 'failed' THEN '; no attempts left'
                                     ELSE '' END),
            errors = notifyq.append_error_v1(
                j.errors, j.attempt_count,
                format('lease expired: worker %s stopped renewing the lease%s',
                       coalesce(j.worker_id, '(none)'),
                       CASE WHEN x.counted THEN ''
                            ELSE ' before its handler was confirmed running (not counted)' END),
                j.worker_id)
        FROM judged AS x
        WHERE j.id = x.id
        RETURNING j.id, j.queue, j.status, x.counted
    ), woken AS (
        SELECT notifyq.wake_v1(array_agg(DISTINCT r.queue)) FROM rescued AS r
        WHERE r.status = 'queued'
    )
    SELECT r.id, r.status, r.counted FROM rescued AS r WHERE (SELECT count(*) FROM woken) >= 0;
END;
$$;

-- -- cancelling --------------------------------------------------------------------------------

-- Cancels a job: a queued one at once; a running one is marked, and its worker is told on the
-- notifyq_cancel channel (and by its next heartbeat) to stop the handler. A processing job that
-- no live worker holds (its lease ran out, or it has none) is cancelled at once: nobody would
-- act on the request. Answers the status the job had and the one it has now, or nothing for an
-- unknown id.
CREATE FUNCTION notifyq.cancel_job_v1(p_id uuid)
RETURNS TABLE (was text, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_held boolean;
BEGIN
    SELECT j.status, j.lease_expires_at, j.cancel_requested_at INTO v_job
    FROM notifyq.jobs AS j WHERE j.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_held := v_job.status = 'processing'
              AND coalesce(v_job.lease_expires_at > now(), false);
    IF v_job.status = 'queued' OR (v_job.status = 'processing' AND NOT v_held) THEN
        UPDATE notifyq.jobs AS j
        SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
            cancel_requested_at = coalesce(j.cancel_requested_at, now()),
            last_error = CASE WHEN v_job.status = 'queued' THEN 'cancelled before it ran'
                              ELSE 'cancelled while no live worker held it (its lease had '
                                   'run out)' END
        WHERE j.id = p_id;
        RETURN QUERY SELECT v_job.status, 'cancelled'::text;
    ELSIF v_held THEN
        IF v_job.cancel_requested_at IS NULL THEN
            UPDATE notifyq.jobs AS j SET cancel_requested_at = now() WHERE j.id = p_id;
        END IF;
        PERFORM pg_notify('notifyq_cancel', p_id::text);
        RETURN QUERY SELECT v_job.status, v_job.status;
    ELSE
        RETURN QUERY SELECT v_job.status, v_job.status;
    END IF;
END;
$$;
