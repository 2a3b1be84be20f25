-- notifyq schema, version 1.
--
-- Everything lives in schema notifyq. The jobs table is the source of truth; NOTIFY is only a hint
-- that tells idle workers to look at it. Functions that workers and clients call carry a version
-- suffix (_v1) so that a later migration can add a _v2 while old workers still run.
--
-- The migration runner has already created the schema and its own bookkeeping table, and runs
-- this file in one transaction under an advisory lock.

-- Defaults that SQL-only clients cannot pass themselves. `notifyq migrate` writes the values of
-- NOTIFYQ_DEFAULT_TASK and NOTIFYQ_MAX_ATTEMPTS here when they are set.
CREATE TABLE notifyq.settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO notifyq.settings (key, value) VALUES ('default_task', 'echo'), ('max_attempts', '3');

-- Tasks that workers have registered, with their options. Written by every worker at start so
-- that SQL inserts and API processes (which may not import the task code) use the task's own
-- max_attempts, and so that `GET /tasks` can list them.
--
-- The circuit breaker of a task lives here too, so that every worker sees the same state:
-- closed while breaker_open_until is NULL; open until that time once consecutive_failures
-- reaches breaker_threshold; half-open after it, when one worker takes a probe by pushing the
-- time forward (see take_breaker_probes in queries.sql).
CREATE TABLE notifyq.tasks (
    name                 text PRIMARY KEY,
    max_attempts         integer CHECK (max_attempts >= 1),
    options              jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    breaker_threshold    integer CHECK (breaker_threshold >= 1),
    breaker_cooldown     double precision NOT NULL DEFAULT 30 CHECK (breaker_cooldown > 0),
    consecutive_failures integer NOT NULL DEFAULT 0,
    breaker_open_until   timestamptz,
    -- Limits enforced in the claim across all workers: jobs of this task running at once, and
    -- jobs started per second (a token bucket: rate_tokens refill at rate_limit per second up
    -- to rate_burst).
    max_concurrency      integer CHECK (max_concurrency >= 1),
    rate_limit           double precision CHECK (rate_limit > 0),
    rate_burst           double precision CHECK (rate_burst >= 1),
    rate_tokens          double precision NOT NULL DEFAULT 0,
    rate_refilled_at     timestamptz NOT NULL DEFAULT now()
);

-- Per-queue switches: pause (workers stop claiming), a rate limit like the task's, and whether
-- inserts notify at all (a queue fed in bulk and drained by polling can turn it off). A queue
-- without a row has the defaults.
CREATE TABLE notifyq.queues (
    name             text PRIMARY KEY,
    paused           boolean NOT NULL DEFAULT false,
    notify           boolean NOT NULL DEFAULT true,
    rate_limit       double precision CHECK (rate_limit > 0),
    rate_burst       double precision CHECK (rate_burst >= 1),
    rate_tokens      double precision NOT NULL DEFAULT 0,
    rate_refilled_at timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- One row per tick of a periodic task: whichever worker inserts it enqueues that tick's job, so
-- each tick runs once however many workers see it.
CREATE TABLE notifyq.periodic_ticks (
    name   text NOT NULL,
    tick   timestamptz NOT NULL,
    job_id uuid,
    PRIMARY KEY (name, tick)
);

CREATE TABLE notifyq.jobs (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    task             text NOT NULL CHECK (length(task) BETWEEN 1 AND 200),
    queue            text NOT NULL DEFAULT 'default' CHECK (length(queue) BETWEEN 1 AND 200),
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(payload) = 'object'),
    status           text NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'processing', 'completed', 'failed', 'cancelled')),
    priority         integer NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    attempt_count    integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts     integer NOT NULL CHECK (max_attempts >= 1),
    dedup_key        text,
    result           jsonb,
    last_error       text,
    -- One entry per failed attempt: {"attempt", "error", "at", "worker"}; the newest 25 are kept.
    errors           jsonb NOT NULL DEFAULT '[]'::jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    -- Who holds a processing job, and until when. A worker renews the lease by heartbeat; any
    -- worker requeues a job whose lease ran out. (worker_id, attempt_count) fences every write a
    -- worker makes about a job it claimed.
    worker_id        text,
    lease_expires_at timestamptz,
    -- Set by a cancel request for a running job; its worker stops the handler.
    cancel_requested_at timestamptz
) WITH (
    -- Every job is updated at least twice; free room on each page lets some of those updates stay
    -- on the page, and an aggressive autovacuum keeps dead versions from piling up.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- The claim index holds queued rows only, so it stays small however many finished jobs the table
-- keeps. Its order is the claim order.
CREATE INDEX jobs_claim_idx ON notifyq.jobs (priority DESC, run_at, id) WHERE status = 'queued';
-- Finds the next future run_at quickly, so an idle worker can sleep exactly until then.
CREATE INDEX jobs_due_idx ON notifyq.jobs (run_at) WHERE status = 'queued';
-- The rescuer's scan for leases that ran out.
CREATE INDEX jobs_lease_idx ON notifyq.jobs (lease_expires_at) WHERE status = 'processing';
-- At most one queued job per (queue, dedup_key). Running and finished jobs are outside the index,
-- so a duplicate can never touch them.
CREATE UNIQUE INDEX jobs_dedup_idx ON notifyq.jobs (queue, dedup_key)
    WHERE status = 'queued' AND dedup_key IS NOT NULL;
-- Listing jobs newest first, and finding old finished jobs.
CREATE INDEX jobs_created_idx ON notifyq.jobs (created_at DESC, id DESC);
-- Dead letters: failed and cancelled jobs by task, for inspection, counts and bulk retry; small,
-- as failures are rare (and retention may keep them for good).
CREATE INDEX jobs_dead_idx ON notifyq.jobs (status, task, created_at DESC)
    WHERE status IN ('failed', 'cancelled');
-- Finished jobs by age: retention deletes the oldest in small batches, and the last minute's
-- throughput is counted from the newest.
CREATE INDEX jobs_finished_idx ON notifyq.jobs (finished_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- Fills what an INSERT left out: the task from payload.task (when it is a string) or the default
-- task, and max_attempts from the task's registration or the global default. Runs only where a
-- value is missing, so clients that pass everything pay nothing.
CREATE FUNCTION notifyq.fill_job_defaults_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.task IS NULL THEN
        IF jsonb_typeof(NEW.payload -> 'task') = 'string' THEN
            NEW.task := NEW.payload ->> 'task';
        ELSE
            NEW.task := coalesce(
                (SELECT value FROM notifyq.settings WHERE key = 'default_task'), 'echo');
        END IF;
    END IF;
    IF NEW.max_attempts IS NULL THEN
        NEW.max_attempts := coalesce(
            (SELECT max_attempts FROM notifyq.tasks WHERE name = NEW.task),
            (SELECT value::integer FROM notifyq.settings WHERE key = 'max_attempts'),
            3);
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_fill_defaults
    BEFORE INSERT ON notifyq.jobs
    FOR EACH ROW WHEN (NEW.task IS NULL OR NEW.max_attempts IS NULL)
    EXECUTE FUNCTION notifyq.fill_job_defaults_v1();

-- Tells listening workers that these queues have new work. The payload is the queue name only:
-- workers always read jobs from the table. PostgreSQL folds identical notifications of one
-- transaction into one, so a transaction that wakes a queue many times sends it once.
CREATE FUNCTION notifyq.wake_v1(p_queues text[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(pg_notify('notifyq', q))::integer
    FROM (SELECT DISTINCT unnest(p_queues) AS q) AS s;
$$;

-- The queued job of (queue, dedup_key), if any. A job going back to the queue checks it first:
-- the unique index allows one queued job per key, and the queued one is the newer submission.
CREATE FUNCTION notifyq.queued_duplicate_v1(p_queue text, p_dedup_key text) RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT id FROM notifyq.jobs
    WHERE p_dedup_key IS NOT NULL AND queue = p_queue AND dedup_key = p_dedup_key
      AND status = 'queued';
$$;

-- Appends one failed attempt to a job's error history, keeping the newest 25 entries.
CREATE FUNCTION notifyq.append_error_v1(p_errors jsonb, p_attempt integer, p_error text,
                                        p_worker text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN jsonb_array_length(e) > 25 THEN e - 0 ELSE e END
    FROM (SELECT coalesce(p_errors, '[]'::jsonb)
                 || jsonb_build_array(jsonb_build_object(
                        'attempt', p_attempt, 'error', left(p_error, 4000),
                        'at', now(), 'worker', p_worker))) AS s(e);
$$;

-- Workers that wait for work with free slots. NOTIFY has a price: PostgreSQL serialises the
-- commits of all transactions that sent one (a global lock), which cut single-row insert
-- throughput by 60% in our measurements. Busy workers claim again as soon as a slot frees and
-- need no wake-up, so inserts notify only while some worker serving their queue waits here.
-- UNLOGGED: after a crash it is empty, and workers register again when they reconnect. A row of
-- a worker that died expires; until then it only costs extra notifications.
CREATE UNLOGGED TABLE notifyq.waiting_workers (
    worker_id  text PRIMARY KEY,
    queues     text[],
    expires_at timestamptz NOT NULL
);

-- The race this closes: an insert reads "nobody waits" just before a worker registers, commits
-- after the worker's last claim, and the job waits for a poll. Inserts hold this advisory lock
-- in shared mode from the flag check until their commit; a worker registers under the exclusive
-- mode, so it waits for such inserts to commit before its next claim, which then sees their
-- jobs. The lock key is 'nq' + 2.
CREATE FUNCTION notifyq.mark_waiting_v1(p_worker_id text, p_queues text[], p_ttl float8)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_locked boolean := true;
BEGIN
    -- Bounded wait: a long transaction that enqueued a job must not stall the worker (and all
    -- inserts queued behind its lock request). Without the lock the caller re-claims shortly.
    PERFORM set_config('lock_timeout', '50ms', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(1852899330);
    EXCEPTION WHEN lock_not_available THEN
        v_locked := false;
    END;
    INSERT INTO notifyq.waiting_workers (worker_id, queues, expires_at)
    VALUES (p_worker_id, p_queues, now() + make_interval(secs => p_ttl))
    ON CONFLICT (worker_id) DO UPDATE
    SET queues = EXCLUDED.queues, expires_at = EXCLUDED.expires_at;
    RETURN v_locked;
END;
$$;

-- Statement-level: a bulk INSERT ... SELECT of a million rows sends at most one notification per
-- queue, not one per row; none for a queue whose notify switch is off, and none while no worker
-- serving the queue waits.
CREATE FUNCTION notifyq.notify_inserted_v1() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_queues text[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1852899330);
    -- The common case under load: every worker is busy. Measured with 8 clients of single-row
    -- inserts, this early exit costs 2% where the full check below cost 40%.
    IF NOT EXISTS (SELECT 1 FROM notifyq.waiting_workers WHERE expires_at > now()) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(q) INTO v_queues
    FROM (SELECT DISTINCT queue AS q FROM inserted) AS s
    WHERE EXISTS (SELECT 1 FROM notifyq.waiting_workers AS w
                  WHERE w.expires_at > now() AND (w.queues IS NULL OR s.q = ANY(w.queues)))
      AND NOT EXISTS (SELECT 1 FROM notifyq.queues AS x WHERE x.name = s.q AND NOT x.notify);
    IF v_queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_queues);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON notifyq.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION notifyq.notify_inserted_v1();

-- The task a job runs: the one named, else payload.task when it is a string, else the default.
CREATE FUNCTION notifyq.resolve_task_v1(p_task text, p_payload jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        p_task,
        CASE WHEN jsonb_typeof(p_payload -> 'task') = 'string' THEN p_payload ->> 'task' END,
        (SELECT value FROM notifyq.settings WHERE key = 'default_task'),
        'echo');
$$;

-- Enqueues one job with the duplicate rule of the public contract: while a job with the same
-- (queue, dedup_key) is queued, the new submission replaces its payload, priority, run_at and
-- max_attempts and its id is returned with duplicate = true. The unique index decides; the loop
-- covers the moment when the queued duplicate is being claimed by a worker concurrently. A NULL
-- queue or priority takes the task's registered default.
CREATE FUNCTION notifyq.enqueue_v1(
    p_task text,
    p_payload jsonb,
    p_queue text,
    p_priority integer,
    p_run_at timestamptz,
    p_dedup_key text,
    p_max_attempts integer
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_new_id uuid := gen_random_uuid();
    v_task text := notifyq.resolve_task_v1(p_task, p_payload);
    v_options jsonb;
    v_job notifyq.jobs;
BEGIN
    IF p_queue IS NULL OR p_priority IS NULL THEN
        SELECT t.options INTO v_options FROM notifyq.tasks AS t WHERE t.name = v_task;
    END IF;
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts)
        VALUES (v_new_id, v_task, coalesce(p_payload, '{}'::jsonb),
                coalesce(p_queue, v_options ->> 'queue', 'default'),
                coalesce(p_priority, (v_options ->> 'priority')::integer, 0),
                coalesce(p_run_at, now()), p_dedup_key, p_max_attempts)
        ON CONFLICT (queue, dedup_key) WHERE status = 'queued' AND dedup_key IS NOT NULL
        DO UPDATE SET payload = EXCLUDED.payload,
                      priority = EXCLUDED.priority,
                      run_at = EXCLUDED.run_at,
                      max_attempts = EXCLUDED.max_attempts
            WHERE j.status = 'queued'
        RETURNING j.* INTO v_job;
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

-- Claims up to p_limit due jobs that are under a limit: a task's max_concurrency or rate_limit,
-- or a queue's rate_limit, all of them across every worker. The limit rows are locked first, in
-- one global order (tasks, then queues, each by name), so concurrent claimers wait for each
-- other instead of deadlocking; and because each statement of a PL/pgSQL function takes a new
-- snapshot, the counts made after the locks see every claim committed before them. Rates are
-- token buckets: rate_tokens refill at rate_limit per second up to rate_burst (default: one
-- second's worth, at least 1), and each claimed job spends one.
CREATE FUNCTION notifyq.claim_limited_v1(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, created_at float8, run_at float8)
LANGUAGE plpgsql AS $$
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
                WHERE j.status = 'processing' AND j.task = r.name)::integer);
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
        UPDATE notifyq.jobs AS j
        SET status = 'processing',
            attempt_count = j.attempt_count + 1,
            started_at = now(),
            finished_at = NULL,
            worker_id = p_worker_id,
            lease_expires_at = now() + make_interval(secs => p_lease)
        WHERE j.id = ANY(v_ids)
        RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count,
                  j.max_attempts, j.created_at, j.run_at
    ), spent_tasks AS (
        UPDATE notifyq.tasks AS t SET rate_tokens = t.rate_tokens - c.n
        FROM (SELECT claimed.task, count(*) AS n FROM claimed GROUP BY claimed.task) AS c
        WHERE t.name = c.task AND t.rate_limit IS NOT NULL
    ), spent_queues AS (
        UPDATE notifyq.queues AS q SET rate_tokens = q.rate_tokens - c.n
        FROM (SELECT claimed.queue, count(*) AS n FROM claimed GROUP BY claimed.queue) AS c
        WHERE q.name = c.queue AND q.rate_limit IS NOT NULL
    )
    SELECT c.id, c.task, c.queue, c.payload, c.priority, c.attempt_count, c.max_attempts,
           extract(epoch FROM c.created_at)::float8, extract(epoch FROM c.run_at)::float8
    FROM claimed AS c;
END;
$$;

-- Enqueues the job of one tick of a periodic task, unless another worker did: the tick's row is
-- the proof, inserted in the same transaction. Answers the job id, or NULL when the tick was
-- taken already.
CREATE FUNCTION notifyq.enqueue_tick_v1(p_task text, p_tick timestamptz, p_payload jsonb)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_job_id uuid;
BEGIN
    INSERT INTO notifyq.periodic_ticks (name, tick) VALUES (p_task, p_tick)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.job_id INTO v_job_id
    FROM notifyq.enqueue_v1(p_task, p_payload, NULL, NULL, p_tick, NULL, NULL) AS e;
    UPDATE notifyq.periodic_ticks SET job_id = v_job_id WHERE name = p_task AND tick = p_tick;
    RETURN v_job_id;
END;
$$;

-- Claims up to p_limit due jobs of p_tasks (and p_queues, when given) in one statement, highest
-- priority first. SKIP LOCKED lets concurrent workers take disjoint rows without waiting on each
-- other; the row locks last only for this statement, never while the job runs. Tasks whose
-- circuit breaker is open are skipped (unless p_probe: a worker holding that task's probe);
-- paused queues are skipped; jobs under a concurrency or rate limit are left to
-- claim_limited_v1.
--
-- The settings pin the plan: walk jobs_claim_idx in order and stop after p_limit rows. Right
-- after a bulk insert the statistics are stale, and with a large history they are large; in
-- both cases the planner preferred a bitmap scan of every queued row and a sort (48 ms for a
-- claim of 50 out of 50,000 queued). The UPDATE finds its rows by primary key.
CREATE FUNCTION notifyq.claim_v1(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, created_at float8, run_at float8)
LANGUAGE plpgsql
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    -- PL/pgSQL caches this statement's plan for the session (a SQL function would plan it on
    -- every call); with sorts, bitmap and sequential scans off, that plan can only walk
    -- jobs_claim_idx, and the UPDATE can only find its rows by primary key, whatever the
    -- statistics say (right after a TRUNCATE and a bulk insert they said "empty table", and a
    -- sequential scan per claim cut a worker to a tenth). JIT stays off: the cost penalty of
    -- the disabled scans on the tiny tasks and queues tables would otherwise trigger 40 ms of
    -- compilation per claim.
    RETURN QUERY
    WITH picked AS (
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
        FOR UPDATE SKIP LOCKED
    )
    UPDATE notifyq.jobs AS j
    SET status = 'processing',
        attempt_count = j.attempt_count + 1,
        started_at = now(),
        finished_at = NULL,
        worker_id = p_worker_id,
        lease_expires_at = now() + make_interval(secs => p_lease)
    WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p))
    RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
              extract(epoch FROM j.created_at)::float8, extract(epoch FROM j.run_at)::float8;
END;
$$;

-- The SQL face of the queue: SELECT notifyq.enqueue('echo', '{"n": 1}') returns the job id.
CREATE FUNCTION notifyq.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL
) RETURNS uuid
LANGUAGE sql AS $$
    SELECT job_id FROM notifyq.enqueue_v1(task, payload, queue, priority, run_at, dedup_key,
                                          max_attempts);
$$;

-- Enqueues many jobs in one call, with the same rules as enqueue_v1, and answers one row per input
-- position (ord, 1-based). Jobs without a dedup_key go in as one INSERT ... SELECT (one trigger
-- call, one notification per queue); jobs with one go through enqueue_v1 in input order, so that a
-- later duplicate in the same batch replaces an earlier one exactly as separate calls would.
CREATE FUNCTION notifyq.enqueue_many_v1(
    p_tasks text[],
    p_payloads jsonb[],
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[],
    p_dedup_keys text[],
    p_max_attempts integer[]
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    -- The answer comes from the input, not from joining the inserted rows back (which the
    -- planner, with no statistics on either side, ran as a nested loop: quadratic in the batch).
    -- Every inserted row is queued, created at now() and due at coalesce(run_at, now()).
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT gen_random_uuid() AS id, u.ord, u.payload, u.queue, u.priority, u.run_at,
               u.max_attempts, notifyq.resolve_task_v1(u.task, u.payload) AS task
        FROM unnest(p_tasks, p_payloads, p_queues, p_priorities, p_run_ats, p_dedup_keys,
                    p_max_attempts)
             WITH ORDINALITY AS u(task, payload, queue, priority, run_at, dedup_key,
                                  max_attempts, ord)
        WHERE u.dedup_key IS NULL
    ), inserted AS (
        INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts)
        SELECT i.id, i.task, coalesce(i.payload, '{}'::jsonb),
               coalesce(i.queue, t.options ->> 'queue', 'default'),
               coalesce(i.priority, (t.options ->> 'priority')::integer, 0),
               coalesce(i.run_at, now()), i.max_attempts
        FROM input AS i LEFT JOIN notifyq.tasks AS t ON t.name = i.task
        RETURNING 1
    )
    SELECT input.ord::integer, input.id, false, 'queued'::text, coalesce(input.run_at, now()),
           now()
    FROM input
    WHERE (SELECT count(*) FROM inserted) >= 0;

    FOR r IN
        SELECT u.*
        FROM unnest(p_tasks, p_payloads, p_queues, p_priorities, p_run_ats, p_dedup_keys,
                    p_max_attempts)
             WITH ORDINALITY AS u(task, payload, queue, priority, run_at, dedup_key,
                                  max_attempts, ord)
        WHERE u.dedup_key IS NOT NULL
        ORDER BY u.ord
    LOOP
        RETURN QUERY
        SELECT r.ord::integer, e.job_id, e.duplicate, e.status, e.run_at, e.created_at
        FROM notifyq.enqueue_v1(r.task, r.payload, r.queue, r.priority, r.run_at, r.dedup_key,
                                r.max_attempts) AS e;
    END LOOP;
END;
$$;
