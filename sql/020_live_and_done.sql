-- notifyq schema, version 20: the queue and the history in two tables, so that what a job costs
-- PostgreSQL comes close to what a bare queue costs it.
--
-- Until now notifyq.jobs held every job ever kept, live and finished, with 12 indexes: each
-- insert wrote five index entries and ran two row triggers, and each claim and each completion
-- was an update that added an entry to the primary key, the created_at index and the index of
-- the status it entered. Now:
--
--   notifyq.jobs       the live jobs (waiting, queued, processing): the parent table, with the
--                      claim indexes and nothing that only finished jobs need.
--   notifyq.jobs_done  the finished jobs (completed, failed, cancelled): a child of notifyq.jobs
--                      (INHERITS), with the indexes that reading and pruning the history need.
--
-- A job moves from the first to the second in the statement that finishes it (a DELETE ...
-- RETURNING feeding an INSERT), and back only when it is retried by hand. Deleting a row writes
-- no index entry, so a completion costs one heap row and the index entries of jobs_done, where
-- the update it replaces cost a new row version and three entries in the big table.
--
-- What psql users rely on stays as it was: `INSERT INTO notifyq.jobs (task, payload)` inserts
-- into the parent itself (an INSERT never goes to a child), with its defaults, checks and the
-- statement trigger that wakes workers; `SELECT ... FROM notifyq.jobs` reads the parent and its
-- child together, so it shows every job in every status with every column; a read that names a
-- status reads only the table that can hold it (each table has a CHECK on the statuses it holds,
-- and the planner leaves out the other). `SELECT ... FROM ONLY notifyq.jobs` reads the queue.
--
-- Job ids are made four times faster (uuid_v7, below), a plain INSERT's defaults are looked up
-- once a statement and task instead of being keyed on text built at every row, and the
-- functions every worker calls keep their names and arguments: workers of version 19 keep
-- working against this schema, and these against version 19's functions' callers.

-- -- Ids ------------------------------------------------------------------------------------

-- A UUID version 7 (RFC 9562): 48 bits of Unix time in milliseconds, the version, and 74
-- random bits (two draws of random(), 65 bits of entropy between them, so ids made in the same
-- millisecond by any number of sessions collide with a chance near 1 in 10^15 per million; the
-- primary key would refuse such a twin rather than keep it). Version 19 took its random bits
-- from gen_random_uuid(), whose cryptographic source cost 2 of this function's 3 microseconds a
-- row, most of a bulk INSERT's time. A job id is a name, not a secret: the API's token, not the
-- id, decides who may read a job. Still one SQL expression with every name qualified (see 019).
CREATE OR REPLACE FUNCTION notifyq.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT pg_catalog.encode(
    pg_catalog.int8send(
        (pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())
                          OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
         OPERATOR(pg_catalog.<<) 16)
        -- the version, 0111, then 12 random bits
        OPERATOR(pg_catalog.|) 28672
        OPERATOR(pg_catalog.|) pg_catalog.floor(pg_catalog.random()
                                                OPERATOR(pg_catalog.*) 4096)::pg_catalog.int8)
    OPERATOR(pg_catalog.||)
    pg_catalog.int8send(
        -- the variant, 10, then 62 random bits
        '-9223372036854775808'::pg_catalog.int8
        OPERATOR(pg_catalog.|) pg_catalog.floor(pg_catalog.random()
                                                OPERATOR(pg_catalog.*) 4611686018427387904)
                                   ::pg_catalog.int8),
    'hex'
)::pg_catalog.uuid
$$;

-- -- The two tables ---------------------------------------------------------------------------

-- The move is made in two steps, so that workers and producers of version 19 keep working
-- through most of it. First, without locking notifyq.jobs beyond what a writer takes: the new
-- table is made (a copy of the columns, defaults and NOT NULLs, with no CHECK: rows written
-- before the checks of sql/003 may break them, and move as they are), the finished jobs move
-- in one statement (it locks only their rows, which no worker changes), and the new table's
-- constraint and indexes are built (a sort each). Then, with notifyq.jobs locked (ACCESS
-- EXCLUSIVE: every reader and writer waits), what finished meanwhile moves, the checks and
-- indexes of the old layout go, the new table becomes the child of notifyq.jobs, and the
-- check of the statuses the parent holds reads the live jobs once. That second step reads the
-- queue, not the history: measured on a 2-core machine, 1,000,000 finished jobs beside 10,000
-- live ones took 6.9 s in the first step and 0.2 s in the second (docs/upgrading/020.md).
CREATE TABLE notifyq.jobs_done (LIKE notifyq.jobs INCLUDING DEFAULTS)
WITH (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.05);

WITH moved AS (
    DELETE FROM ONLY notifyq.jobs WHERE status IN ('completed', 'failed', 'cancelled')
    RETURNING *
)
INSERT INTO notifyq.jobs_done SELECT * FROM moved;

ALTER TABLE notifyq.jobs_done
    ADD CONSTRAINT jobs_done_statuses CHECK (status IN ('completed', 'failed', 'cancelled'));

-- The history's indexes (a sort each, not an insert a row): reads by id, pages newest first
-- (by id: ids are time-ordered), retention and the archive (by finished_at), the dashboard's
-- dead jobs, a workflow's jobs.
ALTER TABLE notifyq.jobs_done ADD CONSTRAINT jobs_done_pkey PRIMARY KEY (id);
CREATE INDEX jobs_done_finished_idx ON notifyq.jobs_done (finished_at);
CREATE INDEX jobs_done_dead_idx ON notifyq.jobs_done (status, task, created_at DESC)
    WHERE status IN ('failed', 'cancelled');
CREATE INDEX jobs_done_workflow_idx ON notifyq.jobs_done (workflow_id)
    WHERE workflow_id IS NOT NULL;

-- The second step: from here to this migration's commit, notifyq.jobs is locked.
LOCK TABLE notifyq.jobs IN ACCESS EXCLUSIVE MODE;

WITH moved AS (
    DELETE FROM ONLY notifyq.jobs WHERE status IN ('completed', 'failed', 'cancelled')
    RETURNING *
)
INSERT INTO notifyq.jobs_done SELECT * FROM moved;

-- The rules of a job's columns leave their CHECK constraints for a trigger (below). PostgreSQL
-- evaluates every CHECK of a table at every UPDATE, whatever columns it sets: 14 of them, the
-- range of seven timestamps among them, cost a claim and a completion together 7 of the 60
-- microseconds a job cost. A row is checked where its values come from outside: when it is
-- inserted, and when an UPDATE sets a column that a producer gives; notifyq's own writes of
-- the engine's columns (a claim, a lease, a completion) are not checked again. Moving a job to
-- notifyq.jobs_done is not an insert of new values either: that table keeps the check of the
-- statuses it may hold, and nothing else.
ALTER TABLE notifyq.jobs
    DROP CONSTRAINT jobs_attempt_count_check,
    DROP CONSTRAINT jobs_claims_check,
    DROP CONSTRAINT jobs_depends_on_check,
    DROP CONSTRAINT jobs_group_key_check,
    DROP CONSTRAINT jobs_lost_count_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_payload_check,
    DROP CONSTRAINT jobs_progress_check,
    DROP CONSTRAINT jobs_queue_check,
    DROP CONSTRAINT jobs_status_check,
    DROP CONSTRAINT jobs_task_check,
    DROP CONSTRAINT jobs_times_in_range,
    DROP CONSTRAINT jobs_trace_context_bounded,
    DROP CONSTRAINT jobs_ref_bounded;

-- Finished jobs become a child of notifyq.jobs (INHERITS): the same columns, read through it.
-- Its rows are written by notifyq's functions only (and deleted by retention, the archive and
-- DELETE /jobs/{id}); it has no insert triggers: nothing here wakes a worker.
ALTER TABLE notifyq.jobs_done INHERIT notifyq.jobs;

-- The parent holds live jobs only. NO INHERIT: the child holds the others.
ALTER TABLE ONLY notifyq.jobs ADD CONSTRAINT jobs_live_statuses
    CHECK (status IN ('waiting', 'queued', 'processing')) NO INHERIT;

-- An UPDATE that would end a job by hand, or bring a finished one back, is refused with what to
-- do instead: a job ends, or goes back, by moving between the two tables, and what depends on
-- it (its dependents, its group) moves on with it, which a bare UPDATE would skip. Only an
-- UPDATE that names the status runs the test, and notifyq's own never asks for either.
CREATE FUNCTION notifyq.refuse_status_v1() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'notifyq.jobs: job % cannot become % by an UPDATE', NEW.id, NEW.status
        USING ERRCODE = 'check_violation',
              HINT = CASE WHEN NEW.status IN ('completed', 'failed', 'cancelled')
                          THEN 'Cancel it with `notifyq cancel ID` or POST /jobs/{id}/cancel: '
                               'its dependents and its group follow. Live jobs are in '
                               'notifyq.jobs, finished ones in notifyq.jobs_done.'
                          ELSE 'Retry it with `notifyq retry ID` or POST /jobs/{id}/retry. '
                               'Live jobs are in notifyq.jobs, finished ones in '
                               'notifyq.jobs_done.' END;
END;
$$;
CREATE TRIGGER jobs_refuse_end BEFORE UPDATE OF status ON notifyq.jobs FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION notifyq.refuse_status_v1();
CREATE TRIGGER jobs_done_refuse_revival BEFORE UPDATE OF status ON notifyq.jobs_done FOR EACH ROW
    WHEN (NEW.status IN ('waiting', 'queued', 'processing'))
    EXECUTE FUNCTION notifyq.refuse_status_v1();

-- The rules of a job's columns, as their CHECK constraints stated them (sql/001, 003, 007, 018),
-- with the same answer to a NULL (allowed: NOT NULL says the rest) and the same error class, and
-- a message that names the column. The trigger's WHEN clause is the rules themselves, evaluated
-- without a function call: the function runs only to word the refusal.
CREATE FUNCTION notifyq.refuse_row_v1() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT length(NEW.task) BETWEEN 1 AND 200 THEN 'task must be 1 to 200 characters'
        WHEN NOT length(NEW.queue) BETWEEN 1 AND 200 THEN 'queue must be 1 to 200 characters'
        WHEN jsonb_typeof(NEW.payload) <> 'object' THEN 'payload must be a JSON object'
        WHEN NEW.status NOT IN ('waiting', 'queued', 'processing', 'completed', 'failed',
                                'cancelled')
            THEN format('status %L is not a status', NEW.status)
        WHEN NEW.attempt_count < 0 THEN 'attempt_count must not be negative'
        WHEN NEW.max_attempts < 1 THEN 'max_attempts must be at least 1'
        WHEN NEW.claims < 0 THEN 'claims must not be negative'
        WHEN NEW.lost_count < 0 THEN 'lost_count must not be negative'
        WHEN cardinality(NEW.depends_on) > 1000 THEN 'a job depends on 1000 jobs at most'
        WHEN NOT length(NEW.group_key) BETWEEN 1 AND 512
            THEN 'group_key must be 1 to 512 characters'
        WHEN jsonb_typeof(NEW.progress) <> 'object' THEN 'progress must be a JSON object'
        WHEN NEW.trace_context IS NOT NULL
             AND NOT (jsonb_typeof(NEW.trace_context) = 'object'
                      AND octet_length(NEW.trace_context::text) <= 1024)
            THEN 'trace_context must be a JSON object of 1024 bytes at most'
        WHEN NEW.ref IS NOT NULL
             AND NOT (NEW.workflow_id IS NOT NULL AND char_length(NEW.ref) BETWEEN 1 AND 200)
            THEN 'ref must be 1 to 200 characters, on a job of a workflow'
        ELSE 'its times must be finite, between the years 1900 and 9998'
    END;
    RAISE EXCEPTION 'notifyq.jobs: job %: %', NEW.id, v_broken
        USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER jobs_check BEFORE INSERT OR UPDATE OF
        task, queue, payload, priority, run_at, max_attempts, dedup_key, created_at,
        depends_on, workflow_id, group_key, trace_context, ref
    ON notifyq.jobs FOR EACH ROW
    WHEN (NOT (
        length(NEW.task) BETWEEN 1 AND 200
        AND length(NEW.queue) BETWEEN 1 AND 200
        AND jsonb_typeof(NEW.payload) = 'object'
        AND NEW.status IN ('waiting', 'queued', 'processing', 'completed', 'failed', 'cancelled')
        AND NEW.attempt_count >= 0 AND NEW.max_attempts >= 1 AND NEW.claims >= 0
        AND NEW.lost_count >= 0
        AND cardinality(NEW.depends_on) <= 1000
        AND (NEW.group_key IS NULL OR length(NEW.group_key) BETWEEN 1 AND 512)
        AND (NEW.progress IS NULL OR jsonb_typeof(NEW.progress) = 'object')
        AND (NEW.trace_context IS NULL
             OR (jsonb_typeof(NEW.trace_context) = 'object'
                 AND octet_length(NEW.trace_context::text) <= 1024))
        AND (NEW.ref IS NULL
             OR (NEW.workflow_id IS NOT NULL AND char_length(NEW.ref) BETWEEN 1 AND 200))
        AND NEW.run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
        AND NEW.created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
        AND (NEW.started_at IS NULL
             OR NEW.started_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
        AND (NEW.finished_at IS NULL
             OR NEW.finished_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
        AND (NEW.lease_expires_at IS NULL
             OR NEW.lease_expires_at BETWEEN '1900-01-01 00:00:00+00'
                                         AND '9999-01-01 00:00:00+00')
        AND (NEW.heartbeat_at IS NULL
             OR NEW.heartbeat_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00')
        AND (NEW.cancel_requested_at IS NULL
             OR NEW.cancel_requested_at BETWEEN '1900-01-01 00:00:00+00'
                                            AND '9999-01-01 00:00:00+00')))
    EXECUTE FUNCTION notifyq.refuse_row_v1();

-- What the queue no longer needs: its history's indexes, and the newest-first index (the
-- primary key serves pages now: a version 7 id sorts by its time). The look for the next
-- run_at reads an index of deferred jobs only: a plain insert's run_at is its created_at (both
-- now()), so it is not in it, and costs it nothing.
DROP INDEX notifyq.jobs_created_idx;
DROP INDEX notifyq.jobs_dead_idx;
DROP INDEX notifyq.jobs_finished_idx;
DROP INDEX notifyq.jobs_due_idx;
CREATE INDEX jobs_deferred_idx ON notifyq.jobs (run_at)
    WHERE status = 'queued' AND NOT group_blocked AND run_at > created_at;
-- The leases: every claim wrote an entry here (its row's new version was not HOT anyway, but
-- this index made it two entries, a tenth of a claim's cost). What read it can read the queue:
-- the rescue, once a heartbeat interval by the maintenance leader only, and the count of a
-- limited task's running jobs. Both read the queue's table from end to end now, which is its
-- backlog: a rescue of 100,000 queued jobs reads them in about 10 ms.
DROP INDEX notifyq.jobs_lease_idx;

-- -- Finishing and reviving ---------------------------------------------------------------------

-- Moves jobs whose final values were written (by the caller, in its transaction, which holds
-- their rows) to notifyq.jobs_done with the final status of each. The hot path, a completion,
-- moves its rows in its own statement (write_completions_v1); the rarer ends (a failure with no
-- attempt left, a cancel, a rescue that gives up) write their values and then move.
CREATE FUNCTION notifyq.end_jobs_v1(p_ids uuid[], p_statuses text[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    WITH ended AS (
        DELETE FROM ONLY notifyq.jobs AS j
        WHERE j.id = ANY(p_ids)
        RETURNING j.*, p_statuses[array_position(p_ids, j.id)] AS final
    )
    INSERT INTO notifyq.jobs_done
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
         lease_expires_at, cancel_requested_at, claims, heartbeat_at, lost_count, depends_on,
         workflow_id, group_key, group_seq, group_blocked, progress, trace_context, ref)
    SELECT id, task, queue, payload, final, priority, run_at, attempt_count, max_attempts,
           dedup_key, result, last_error, errors, created_at, started_at,
           coalesce(finished_at, now()), worker_id, NULL, cancel_requested_at, claims,
           heartbeat_at, lost_count, depends_on, workflow_id, group_key, group_seq, false,
           progress, trace_context, ref
    FROM ended;
END;
$$;

-- Completions, moved in one statement: fenced by the claim as before (holds_v1), the result
-- written, the row gone from the queue. Same arguments and answer as in sql/012. The plan is
-- made once per session (force_generic_plan), often on an empty queue, where any join of the
-- rows with the arrays of the batch looks as cheap as any other; the one it made there walked
-- the arrays again for every row (a nested loop with the function scan inside). So the batch
-- writes find their rows by the array of ids (j.id = ANY(p_ids): a probe of the primary key
-- whatever the estimates), and each row's values by its place in the arrays (array_position: a
-- batch is at most 100 jobs).
CREATE OR REPLACE FUNCTION notifyq.write_completions_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_results jsonb[]
) RETURNS TABLE (ids uuid[], queues text[], group_keys text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        DELETE FROM ONLY notifyq.jobs AS j
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.*, p_results[array_position(p_ids, j.id)] AS outcome
    ), moved AS (
        INSERT INTO notifyq.jobs_done
            (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
             dedup_key, result, last_error, errors, created_at, started_at, finished_at,
             worker_id, lease_expires_at, cancel_requested_at, claims, heartbeat_at, lost_count,
             depends_on, workflow_id, group_key, group_seq, group_blocked, progress,
             trace_context, ref)
        SELECT d.id, d.task, d.queue, d.payload, 'completed', d.priority, d.run_at,
               d.attempt_count, d.max_attempts, d.dedup_key, d.outcome, NULL, d.errors,
               d.created_at, d.started_at, now(), d.worker_id, NULL, d.cancel_requested_at,
               d.claims, d.heartbeat_at, d.lost_count, d.depends_on, d.workflow_id, d.group_key,
               d.group_seq, false, d.progress, d.trace_context, d.ref
        FROM done AS d
    ), closed AS (
        UPDATE notifyq.tasks AS t
        SET consecutive_failures = 0, breaker_open_until = NULL
        WHERE t.name IN (SELECT done.task FROM done)
          AND (t.consecutive_failures > 0 OR t.breaker_open_until IS NOT NULL)
    )
    SELECT array_agg(done.id),
           array_agg(done.queue) FILTER (WHERE done.group_key IS NOT NULL),
           array_agg(done.group_key) FILTER (WHERE done.group_key IS NOT NULL)
    FROM done;
END;
$$;

-- A failed or cancelled job back in the queue (retry_v1, POST /jobs/{id}/retry), its row held by
-- the caller: it moves from notifyq.jobs_done to notifyq.jobs as an INSERT, so that the insert's
-- rules decide what they decide for any insert (waiting for its parents or queued, its place in
-- its group, the notification of its workers); then what the job keeps from before is written
-- back: its errors, the claim number that fences its old workers out, and its place in its
-- group. Answers the new row's status, queue and whether its group holds it back.
CREATE FUNCTION notifyq.revive_v1(p_id uuid)
RETURNS TABLE (status text, queue text, group_blocked boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old record;
BEGIN
    SELECT d.claims, d.errors, d.last_error, d.group_seq INTO v_old
    FROM notifyq.jobs_done AS d WHERE d.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM notifyq.jobs_done AS d WHERE d.id = p_id RETURNING d.*
    )
    INSERT INTO notifyq.jobs (id, task, queue, payload, priority, run_at, max_attempts,
                              dedup_key, created_at, depends_on, workflow_id, group_key,
                              trace_context, ref)
    SELECT g.id, g.task, g.queue, g.payload, g.priority, now(), g.max_attempts, g.dedup_key,
           g.created_at, g.depends_on, g.workflow_id, g.group_key, g.trace_context, g.ref
    FROM gone AS g;
    RETURN QUERY
    UPDATE ONLY notifyq.jobs AS j
    SET claims = v_old.claims, errors = v_old.errors, last_error = v_old.last_error,
        group_seq = coalesce(v_old.group_seq, j.group_seq)
    WHERE j.id = p_id
    RETURNING j.status, j.queue, j.group_blocked;
END;
$$;

-- -- Claims ---------------------------------------------------------------------------------------

-- claim_v4 (sql/017) over the queue alone, and in one statement: the rows picked (FOR NO KEY
-- UPDATE SKIP LOCKED, in claim order) are started by the UPDATE that picks them, as
-- start_jobs_v3 starts them, which is not called (a function call with its settings saved and
-- restored, and its rows copied twice, cost a claim of one job a tenth of its time). Same
-- arguments, answers and plan settings. Times go out as date_part's float8 (extract's numeric,
-- then a cast, was two conversions a column).
CREATE OR REPLACE FUNCTION notifyq.claim_v4(
    p_worker_id text,
    p_tasks text[],
    p_queues text[],
    p_limit integer,
    p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer, created_at float8,
                 run_at float8, dependencies jsonb, trace_context jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    IF p_queues IS NULL THEN
        RETURN QUERY
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'processing', attempt_count = j.attempt_count + 1, claims = j.claims + 1,
            started_at = now(), finished_at = NULL, heartbeat_at = NULL, progress = NULL,
            worker_id = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease)
        WHERE j.id = ANY(ARRAY(
            SELECT c.id
            FROM ONLY notifyq.jobs AS c
            WHERE c.status = 'queued' AND NOT c.group_blocked AND c.run_at <= now()
              AND c.task = ANY(p_tasks)
              AND (p_probe OR c.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                             WHERE t.breaker_open_until IS NOT NULL))
              AND c.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                  WHERE q.paused OR q.rate_limit IS NOT NULL)
              AND c.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                 WHERE t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)
            ORDER BY c.priority DESC, c.run_at, c.id
            LIMIT p_limit
            FOR NO KEY UPDATE SKIP LOCKED))
        RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
                  j.claims, date_part('epoch', j.created_at), date_part('epoch', j.run_at),
                  CASE WHEN cardinality(j.depends_on) > 0 THEN
                      (SELECT jsonb_object_agg(p.id::text, p.result) FROM notifyq.jobs_done AS p
                       WHERE p.id = ANY(j.depends_on))
                  END,
                  j.trace_context;
    ELSE
        RETURN QUERY
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'processing', attempt_count = j.attempt_count + 1, claims = j.claims + 1,
            started_at = now(), finished_at = NULL, heartbeat_at = NULL, progress = NULL,
            worker_id = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease)
        WHERE j.id = ANY(ARRAY(
            SELECT c.id
            FROM (SELECT DISTINCT s.name FROM unnest(p_queues) AS s(name)) AS served
            CROSS JOIN LATERAL (
                SELECT c.id, c.priority, c.run_at
                FROM ONLY notifyq.jobs AS c
                WHERE c.queue = served.name
                  AND c.status = 'queued' AND NOT c.group_blocked AND c.run_at <= now()
                  AND c.task = ANY(p_tasks)
                  AND (p_probe OR c.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                                 WHERE t.breaker_open_until IS NOT NULL))
                  AND c.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                      WHERE q.paused OR q.rate_limit IS NOT NULL)
                  AND c.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                     WHERE t.max_concurrency IS NOT NULL
                                        OR t.rate_limit IS NOT NULL)
                ORDER BY c.priority DESC, c.run_at, c.id
                LIMIT p_limit
                FOR NO KEY UPDATE SKIP LOCKED) AS c
            ORDER BY c.priority DESC, c.run_at, c.id
            LIMIT p_limit))
        RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
                  j.claims, date_part('epoch', j.created_at), date_part('epoch', j.run_at),
                  CASE WHEN cardinality(j.depends_on) > 0 THEN
                      (SELECT jsonb_object_agg(p.id::text, p.result) FROM notifyq.jobs_done AS p
                       WHERE p.id = ANY(j.depends_on))
                  END,
                  j.trace_context;
    END IF;
    -- Watchers are told of the start (Queue.wait, GET /jobs/{id}/events); none, the usual
    -- case, costs one look at an empty table.
    IF FOUND AND EXISTS (SELECT 1 FROM notifyq.watched_jobs) THEN
        PERFORM notifyq.announce_v1(ARRAY(
            SELECT j.id FROM ONLY notifyq.jobs AS j
            WHERE j.worker_id = p_worker_id AND j.status = 'processing'
              AND j.started_at = now()));
    END IF;
END;
$$;

-- start_jobs_v3 (sql/007) over the queue alone; the results a job depends on are those of
-- finished jobs. Same arguments and answers.
CREATE OR REPLACE FUNCTION notifyq.start_jobs_v3(p_worker_id text, p_ids uuid[], p_lease float8)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
               attempt_count integer, max_attempts integer, claims integer, created_at float8,
               run_at float8, dependencies jsonb, trace_context jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE ONLY notifyq.jobs AS j
    SET status = 'processing',
        attempt_count = j.attempt_count + 1,
        claims = j.claims + 1,
        started_at = now(),
        finished_at = NULL,
        heartbeat_at = NULL,
        progress = NULL,
        worker_id = p_worker_id,
        lease_expires_at = now() + make_interval(secs => p_lease)
    WHERE j.id = ANY(p_ids)
    RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
              j.claims, date_part('epoch', j.created_at), date_part('epoch', j.run_at),
              CASE WHEN cardinality(j.depends_on) > 0 THEN
                  (SELECT jsonb_object_agg(p.id::text, p.result) FROM notifyq.jobs_done AS p
                   WHERE p.id = ANY(j.depends_on))
              END,
              j.trace_context;
    PERFORM notifyq.announce_v1(p_ids);
END;
$$;

-- Whether the end of jobs p_ids sets anything off: the next member of a group (they had group
-- keys) or a job that waits for one of them. Most jobs have neither: a completion then skips
-- settle_v2 and its calls, and only tells the jobs' watchers. plpgsql, whose plan is kept: a
-- SQL function with a SET clause is parsed and planned again at every call (a tenth of a
-- completion's time, measured).
CREATE FUNCTION notifyq.anything_follows_v1(p_ids uuid[], p_group_keys text[]) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN p_group_keys IS NOT NULL
        OR EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS c
                   WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && p_ids);
END;
$$;

-- complete_v3 (sql/012): what follows the completions only when anything does.
CREATE OR REPLACE FUNCTION notifyq.complete_v3(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_results jsonb[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_done record;
BEGIN
    SELECT * INTO v_done
    FROM notifyq.write_completions_v1(p_worker_id, p_ids, p_claims, p_results);
    IF v_done.ids IS NOT NULL THEN
        IF notifyq.anything_follows_v1(v_done.ids, v_done.group_keys) THEN
            PERFORM notifyq.settle_v1(v_done.ids, v_done.queues, v_done.group_keys);
        ELSE
            PERFORM notifyq.announce_v1(v_done.ids);
        END IF;
        RETURN QUERY SELECT unnest(v_done.ids);
    END IF;
END;
$$;

-- complete_and_claim_v2 (sql/012): what follows the completions only when anything does, and
-- the queues to wake are those of jobs still in the queue.
CREATE OR REPLACE FUNCTION notifyq.complete_and_claim_v2(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_results jsonb[],
    p_tasks text[],
    p_queues text[],
    p_take integer,
    p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer, created_at float8,
                 run_at float8, dependencies jsonb, trace_context jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_done record;
    v_woken uuid[];
    v_woken_queues text[];
BEGIN
    SELECT * INTO v_done
    FROM notifyq.write_completions_v1(p_worker_id, p_ids, p_claims, p_results);
    IF v_done.ids IS NOT NULL THEN
        IF notifyq.anything_follows_v1(v_done.ids, v_done.group_keys) THEN
            SELECT array_agg(s.id), array_agg(s.queue) INTO v_woken, v_woken_queues
            FROM notifyq.settle_v2(v_done.ids, v_done.queues, v_done.group_keys) AS s;
        ELSE
            PERFORM notifyq.announce_v1(v_done.ids);
        END IF;
        -- The completions written: their ids, every other column null.
        RETURN QUERY
        SELECT u, NULL::text, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
               NULL::integer, NULL::integer, NULL::float8, NULL::float8, NULL::jsonb, NULL::jsonb
        FROM unnest(v_done.ids) AS u;
    END IF;
    IF p_take > 0 THEN
        RETURN QUERY
        SELECT * FROM notifyq.claim_v4(p_worker_id, p_tasks, p_queues, p_take, p_lease, false);
    END IF;
    IF v_woken IS NOT NULL THEN
        PERFORM notifyq.notify_queues_v1(array_agg(w.queue))
        FROM unnest(v_woken, v_woken_queues) AS w(id, queue)
        JOIN ONLY notifyq.jobs AS j ON j.id = w.id
        WHERE j.status = 'queued';
    END IF;
END;
$$;

-- next_due_v3 (sql/012) reads the index of deferred jobs: a job whose run_at is not past its
-- created_at was due when it went in.
CREATE OR REPLACE FUNCTION notifyq.next_due_v3(p_tasks text[], p_queues text[])
RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT extract(epoch FROM min(j.run_at) - now())::float8
            FROM ONLY notifyq.jobs AS j
            WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at > j.created_at
              AND j.run_at > now()
              AND j.task = ANY(p_tasks)
              AND (p_queues IS NULL OR j.queue = ANY(p_queues)));
END;
$$;

-- claim_limited_v4 (sql/007) over the queue alone.
CREATE OR REPLACE FUNCTION notifyq.claim_limited_v4(
    p_worker_id text,
    p_tasks text[],
    p_queues text[],
    p_limit integer,
    p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer, created_at float8,
                 run_at float8, dependencies jsonb, trace_context jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
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
                SELECT count(*) FROM ONLY notifyq.jobs AS j
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
        FROM ONLY notifyq.jobs AS j
        WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
          AND j.task = ANY(p_tasks)
          AND (p_queues IS NULL OR j.queue = ANY(p_queues))
          AND (v_task_room ? j.task OR v_queue_room ? j.queue)
          AND j.queue NOT IN (SELECT name FROM notifyq.queues WHERE paused)
          AND j.task NOT IN (SELECT name FROM notifyq.tasks
                             WHERE breaker_open_until IS NOT NULL
                                OR ((max_concurrency IS NOT NULL OR rate_limit IS NOT NULL)
                                    AND NOT v_task_room ? name))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT greatest(p_limit * 4, 100)
        FOR NO KEY UPDATE SKIP LOCKED
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
        SELECT * FROM notifyq.start_jobs_v3(p_worker_id, v_ids, p_lease)
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


-- -- Outcomes other than success ----------------------------------------------------------------

-- fail_v3 (sql/005): a failure with an attempt left stays in the queue, with a later run_at; one
-- with none left moves to notifyq.jobs_done, failed. Same arguments and answers.
CREATE OR REPLACE FUNCTION notifyq.fail_v3(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_errors text[],
    p_retryable boolean[],
    p_delays float8[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_rows record;
BEGIN
    WITH d AS MATERIALIZED (
        SELECT d.*,
               CASE WHEN j.attempt_count < j.max_attempts AND d.retryable
                         AND j.cancel_requested_at IS NULL
                         AND notifyq.pending_duplicate_v1(j.queue, j.dedup_key) IS NULL
                    THEN 'queued' ELSE 'failed' END AS next,
               CASE WHEN j.attempt_count < j.max_attempts AND d.retryable
                         AND j.cancel_requested_at IS NULL
                    THEN notifyq.pending_duplicate_v1(j.queue, j.dedup_key) END AS newer
        FROM unnest(p_ids, p_claims, p_errors, p_retryable, p_delays)
             AS d(id, claim, error, retryable, delay)
        JOIN ONLY notifyq.jobs AS j ON j.id = d.id AND j.id = ANY(p_ids)
    ), failed AS (
        UPDATE ONLY notifyq.jobs AS j
        -- A job that ends keeps its status until it moves, below: queued, it could meet a
        -- newer duplicate in the unique index of pending dedup keys.
        SET status = CASE WHEN d.next = 'queued' THEN 'queued' ELSE j.status END,
            run_at = CASE WHEN d.next = 'queued'
                          THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.next = 'queued' THEN NULL ELSE now() END,
            worker_id = CASE WHEN d.next = 'queued' THEN NULL ELSE j.worker_id END,
            lease_expires_at = NULL,
            last_error = CASE WHEN d.newer IS NOT NULL
                              THEN d.error || format(E'\nnot retried: job %s with the same '
                                                     'dedup_key is queued and replaces it',
                                                     d.newer)
                              ELSE d.error END,
            errors = notifyq.append_error_v1(j.errors, j.attempt_count, d.error, j.worker_id)
        FROM d
        WHERE j.id = ANY(p_ids) AND j.id = d.id
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
        RETURNING j.id, d.next AS status, j.task, d.retryable, j.queue, j.group_key
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
    SELECT array_agg(failed.id) FILTER (WHERE failed.status = 'failed') AS ended,
           array_agg(failed.queue) FILTER (WHERE failed.status = 'failed'
                                           AND failed.group_key IS NOT NULL) AS queues,
           array_agg(failed.group_key) FILTER (WHERE failed.status = 'failed'
                                               AND failed.group_key IS NOT NULL) AS group_keys,
           array_agg(failed.id) FILTER (WHERE failed.status = 'queued') AS again,
           array_agg(failed.id) AS ids, array_agg(failed.status) AS statuses
    INTO v_rows FROM failed;
    IF v_rows.ended IS NOT NULL THEN
        -- Written above as queued with the failure's values; they move, failed.
        PERFORM notifyq.end_jobs_v1(v_rows.ended,
                                    array_fill('failed'::text, ARRAY[cardinality(v_rows.ended)]));
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.queues, v_rows.group_keys);
    END IF;
    IF v_rows.again IS NOT NULL THEN
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses);
END;
$$;

-- fail_v4 (sql/014): the queues of the retried jobs, which are in the queue.
CREATE OR REPLACE FUNCTION notifyq.fail_v4(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_errors text[],
    p_retryable boolean[],
    p_delays float8[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_rows record;
BEGIN
    SELECT array_agg(f.id) AS ids, array_agg(f.status) AS statuses,
           array_agg(f.id) FILTER (WHERE f.status = 'queued') AS again
    INTO v_rows
    FROM notifyq.fail_v3(p_worker_id, p_ids, p_claims, p_errors, p_retryable, p_delays) AS f;
    IF v_rows.again IS NOT NULL THEN
        PERFORM notifyq.notify_queues_v1(ARRAY(SELECT DISTINCT j.queue FROM ONLY notifyq.jobs AS j
                                               WHERE j.id = ANY(v_rows.again)));
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses);
END;
$$;

-- release_v3 (sql/005): a released job that is not requeued (a cancel was asked for, or a newer
-- duplicate waits) moves, cancelled.
CREATE OR REPLACE FUNCTION notifyq.release_v3(p_worker_id text, p_ids uuid[], p_claims integer[])
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_rows record;
BEGIN
    WITH d AS MATERIALIZED (
        SELECT d.*,
               notifyq.pending_duplicate_v1(j.queue, j.dedup_key) AS newer,
               j.cancel_requested_at IS NOT NULL AS asked
        FROM unnest(p_ids, p_claims) AS d(id, claim)
        JOIN ONLY notifyq.jobs AS j ON j.id = d.id AND j.id = ANY(p_ids)
    ), released AS (
        UPDATE ONLY notifyq.jobs AS j
        SET status = CASE WHEN d.newer IS NULL AND NOT d.asked THEN 'queued' ELSE j.status END,
            attempt_count = j.attempt_count - 1,
            run_at = now(),
            finished_at = CASE WHEN d.newer IS NULL AND NOT d.asked THEN NULL ELSE now() END,
            worker_id = NULL,
            lease_expires_at = NULL,
            last_error = CASE WHEN d.asked
                              THEN 'cancelled while running (its worker was stopping)'
                              WHEN d.newer IS NOT NULL
                              THEN format('interrupted by a stopping worker; not requeued: job %s '
                                          'with the same dedup_key is queued', d.newer)
                              ELSE j.last_error END
        FROM d
        WHERE j.id = ANY(p_ids) AND j.id = d.id
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
        RETURNING j.id, j.queue, j.group_key,
                  CASE WHEN d.newer IS NULL AND NOT d.asked THEN 'queued'
                       ELSE 'cancelled' END AS status
    )
    SELECT array_agg(r.id) AS ids,
           array_agg(r.id) FILTER (WHERE r.status = 'cancelled') AS ended,
           array_agg(r.queue) FILTER (WHERE r.status = 'cancelled'
                                      AND r.group_key IS NOT NULL) AS ended_queues,
           array_agg(r.group_key) FILTER (WHERE r.status = 'cancelled'
                                          AND r.group_key IS NOT NULL) AS ended_keys,
           array_agg(r.id) FILTER (WHERE r.status = 'queued') AS again,
           array_agg(DISTINCT r.queue) FILTER (WHERE r.status = 'queued') AS queues
    INTO v_rows FROM released AS r;
    IF v_rows.queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    IF v_rows.ended IS NOT NULL THEN
        PERFORM notifyq.end_jobs_v1(v_rows.ended,
                                    array_fill('cancelled'::text,
                                               ARRAY[cardinality(v_rows.ended)]));
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.ended_queues, v_rows.ended_keys);
    END IF;
    RETURN QUERY SELECT unnest(v_rows.ids);
END;
$$;

-- rescue_v3 (sql/005) over the queue; a rescue that gives a job up moves it.
CREATE OR REPLACE FUNCTION notifyq.rescue_v3(p_limit integer)
RETURNS TABLE (id uuid, status text, counted boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_rows record;
BEGIN
    WITH expired AS (
        SELECT j.id,
               j.heartbeat_at IS NOT NULL OR j.lost_count >= j.max_attempts AS counted,
               notifyq.pending_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM ONLY notifyq.jobs AS j
        WHERE j.status = 'processing'
          AND (j.lease_expires_at < now() OR j.lease_expires_at IS NULL)
        ORDER BY j.lease_expires_at NULLS FIRST
        LIMIT p_limit
        FOR NO KEY UPDATE SKIP LOCKED
    ), judged AS (
        SELECT e.id, e.counted, e.newer,
               CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                    WHEN e.newer IS NOT NULL THEN 'failed'
                    WHEN e.counted AND j.attempt_count >= j.max_attempts THEN 'failed'
                    ELSE 'queued' END AS next
        FROM expired AS e JOIN ONLY notifyq.jobs AS j ON j.id = e.id
    ), rescued AS (
        UPDATE ONLY notifyq.jobs AS j
        SET status = CASE WHEN x.next = 'queued' THEN 'queued' ELSE j.status END,
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
        RETURNING j.id, j.queue, x.next AS status, x.counted, j.group_key
    )
    SELECT array_agg(r.id) AS ids, array_agg(r.status) AS statuses, array_agg(r.counted) AS counted,
           array_agg(r.id) FILTER (WHERE r.status <> 'queued') AS ended,
           array_agg(r.status) FILTER (WHERE r.status <> 'queued') AS ended_statuses,
           array_agg(r.queue) FILTER (WHERE r.status <> 'queued'
                                      AND r.group_key IS NOT NULL) AS ended_queues,
           array_agg(r.group_key) FILTER (WHERE r.status <> 'queued'
                                          AND r.group_key IS NOT NULL) AS ended_keys,
           array_agg(r.id) FILTER (WHERE r.status = 'queued') AS again,
           array_agg(DISTINCT r.queue) FILTER (WHERE r.status = 'queued') AS queues
    INTO v_rows FROM rescued AS r;
    IF v_rows.queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    IF v_rows.ended IS NOT NULL THEN
        PERFORM notifyq.end_jobs_v1(v_rows.ended, v_rows.ended_statuses);
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.ended_queues, v_rows.ended_keys);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses, v_rows.counted);
END;
$$;

-- cancel_running_v3 (sql/007): attempts stopped by a cancel request move, cancelled.
CREATE OR REPLACE FUNCTION notifyq.cancel_running_v3(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_ended record;
BEGIN
    WITH stopped AS (
        UPDATE ONLY notifyq.jobs AS j
        SET finished_at = now(),
            lease_expires_at = NULL,
            last_error = format('cancelled while running attempt %s', j.attempt_count)
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.id, j.queue, j.group_key
    )
    SELECT array_agg(x.id) AS ids,
           array_agg(x.queue) FILTER (WHERE x.group_key IS NOT NULL) AS queues,
           array_agg(x.group_key) FILTER (WHERE x.group_key IS NOT NULL) AS group_keys
    INTO v_ended FROM stopped AS x;
    IF v_ended.ids IS NOT NULL THEN
        PERFORM notifyq.end_jobs_v1(v_ended.ids,
                                    array_fill('cancelled'::text,
                                               ARRAY[cardinality(v_ended.ids)]));
        PERFORM notifyq.settle_v1(v_ended.ids, v_ended.queues, v_ended.group_keys);
        RETURN QUERY SELECT unnest(v_ended.ids);
    END IF;
END;
$$;

-- cancel_job_v2 (sql/007): a job cancelled before it ran (or while no live worker held it)
-- moves, cancelled. A job that a worker moved while this waited for its row is read again: the
-- first read's snapshot predates the row in notifyq.jobs_done.
CREATE OR REPLACE FUNCTION notifyq.cancel_job_v2(p_id uuid)
RETURNS TABLE (was text, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_found boolean := false;
    v_held boolean;
BEGIN
    FOR v_try IN 1..2 LOOP
        SELECT j.status, j.lease_expires_at, j.cancel_requested_at, j.queue, j.group_key
        INTO v_job
        FROM notifyq.jobs AS j WHERE j.id = p_id FOR NO KEY UPDATE;
        v_found := FOUND;
        EXIT WHEN v_found;
    END LOOP;
    IF NOT v_found THEN
        RETURN;
    END IF;
    v_held := v_job.status = 'processing'
              AND coalesce(v_job.lease_expires_at > now(), false);
    IF v_job.status IN ('queued', 'waiting') OR (v_job.status = 'processing' AND NOT v_held) THEN
        UPDATE ONLY notifyq.jobs AS j
        SET finished_at = now(), lease_expires_at = NULL,
            cancel_requested_at = coalesce(j.cancel_requested_at, now()),
            last_error = CASE WHEN v_job.status IN ('queued', 'waiting')
                              THEN 'cancelled before it ran'
                              ELSE 'cancelled while no live worker held it (its lease had '
                                   'run out)' END
        WHERE j.id = p_id;
        PERFORM notifyq.end_jobs_v1(ARRAY[p_id], ARRAY['cancelled']);
        PERFORM notifyq.settle_v1(ARRAY[p_id], ARRAY[v_job.queue], ARRAY[v_job.group_key]);
        RETURN QUERY SELECT v_job.status, 'cancelled'::text;
    ELSIF v_held THEN
        IF v_job.cancel_requested_at IS NULL THEN
            UPDATE ONLY notifyq.jobs AS j SET cancel_requested_at = now() WHERE j.id = p_id;
        END IF;
        PERFORM pg_notify('notifyq_cancel', p_id::text);
        PERFORM notifyq.announce_v1(ARRAY[p_id]);
        RETURN QUERY SELECT v_job.status, v_job.status;
    ELSE
        RETURN QUERY SELECT v_job.status, v_job.status;
    END IF;
END;
$$;

-- settle_v2 (sql/016): dependents are in the queue; those of a job that failed or was
-- cancelled move, cancelled, and end in turn.
CREATE OR REPLACE FUNCTION notifyq.settle_v2(p_ids uuid[], p_queues text[], p_group_keys text[])
RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = on
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ended uuid[] := p_ids;
    v_queues text[] := p_queues;
    v_keys text[] := p_group_keys;
    v_told uuid[] := ARRAY[]::uuid[];
    v_ready uuid[];
    v_claimable uuid[];
    v_claimable_queues text[];
BEGIN
    WHILE cardinality(v_ended) > 0 LOOP
        v_told := v_told || v_ended;
        -- Groups: the next member becomes the head (claimable if it is queued).
        IF cardinality(v_keys) > 0 THEN
            RETURN QUERY
            SELECT a.id, a.queue FROM notifyq.advance_groups_v1(v_queues, v_keys) AS a
            WHERE a.queue IS NOT NULL;
        END IF;
        EXIT WHEN NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS c
                              WHERE c.status = 'waiting' AND c.depends_on <> '{}'
                                AND c.depends_on && v_ended);
        -- The waiting dependents are locked first, in id order, then their parents are looked
        -- at in statements of their own: see settle_v1 (sql/005).
        PERFORM 1 FROM ONLY notifyq.jobs AS c
        WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
        ORDER BY c.id FOR NO KEY UPDATE;
        -- Dependents with every job they need completed: queued (claimable unless a group
        -- holds them back).
        WITH ready AS (
            UPDATE ONLY notifyq.jobs AS c SET status = 'queued'
            WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
              AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS p
                              WHERE p.id = ANY(c.depends_on) AND p.status <> 'completed')
            RETURNING c.id, c.queue, c.group_blocked
        )
        SELECT coalesce(array_agg(r.id), '{}'),
               coalesce(array_agg(r.id) FILTER (WHERE NOT r.group_blocked), '{}'),
               coalesce(array_agg(r.queue) FILTER (WHERE NOT r.group_blocked), '{}')
        INTO v_ready, v_claimable, v_claimable_queues
        FROM ready AS r;
        v_told := v_told || v_ready;
        RETURN QUERY SELECT u.id, u.queue FROM unnest(v_claimable, v_claimable_queues) AS u(id, queue);
        -- Dependents of a job that failed or was cancelled: cancelled, and they end in turn.
        WITH doomed AS (
            SELECT c.id,
                   (SELECT p.id FROM notifyq.jobs_done AS p
                    WHERE p.id = ANY(c.depends_on) AND p.status IN ('failed', 'cancelled')
                    ORDER BY p.id LIMIT 1) AS cause
            FROM ONLY notifyq.jobs AS c
            WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
        ), cancelled AS (
            UPDATE ONLY notifyq.jobs AS c
            SET finished_at = now(),
                last_error = format('cancelled: job %s, which it depends on, %s', d.cause,
                                    CASE WHEN p.status = 'failed' THEN 'failed'
                                         ELSE 'was cancelled' END)
            FROM doomed AS d JOIN notifyq.jobs_done AS p ON p.id = d.cause
            WHERE c.id = d.id AND d.cause IS NOT NULL
            RETURNING c.id, c.queue, c.group_key
        )
        SELECT coalesce(array_agg(x.id), '{}'),
               array_agg(x.queue) FILTER (WHERE x.group_key IS NOT NULL),
               array_agg(x.group_key) FILTER (WHERE x.group_key IS NOT NULL)
        INTO v_ended, v_queues, v_keys
        FROM cancelled AS x;
        IF cardinality(v_ended) > 0 THEN
            PERFORM notifyq.end_jobs_v1(v_ended,
                                        array_fill('cancelled'::text,
                                                   ARRAY[cardinality(v_ended)]));
        END IF;
    END LOOP;
    PERFORM notifyq.announce_v1(v_told);
END;
$$;

-- A waiting job (just inserted) one of whose parents failed or was cancelled: cancelled, moved,
-- and its own dependents after it. An INSERT cannot put a cancelled row in notifyq.jobs, so the
-- insert's rule (accept_job_v3) leaves such a job waiting; enqueue_v4 and enqueue_many_v4 call
-- this at once, and the check at commit (recheck_waiting_v1) for the rest. Answers the jobs
-- cancelled of those asked about.
CREATE FUNCTION notifyq.doom_waiting_v1(p_ids uuid[]) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ended record;
BEGIN
    WITH doomed AS (
        SELECT c.id,
               (SELECT p.id FROM notifyq.jobs_done AS p
                WHERE p.id = ANY(c.depends_on) AND p.status IN ('failed', 'cancelled')
                ORDER BY p.id LIMIT 1) AS cause
        FROM ONLY notifyq.jobs AS c
        WHERE c.id = ANY(p_ids) AND c.status = 'waiting' AND c.depends_on <> '{}'
    ), cancelled AS (
        UPDATE ONLY notifyq.jobs AS c
        SET finished_at = now(),
            last_error = format('cancelled: job %s, which it depends on, %s', d.cause,
                                CASE WHEN p.status = 'failed' THEN 'failed'
                                     ELSE 'was cancelled' END)
        FROM doomed AS d JOIN notifyq.jobs_done AS p ON p.id = d.cause
        WHERE c.id = d.id AND d.cause IS NOT NULL
        RETURNING c.id, c.queue, c.group_key
    )
    SELECT array_agg(x.id) AS ids,
           array_agg(x.queue) FILTER (WHERE x.group_key IS NOT NULL) AS queues,
           array_agg(x.group_key) FILTER (WHERE x.group_key IS NOT NULL) AS keys
    INTO v_ended FROM cancelled AS x;
    IF v_ended.ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM notifyq.end_jobs_v1(v_ended.ids,
                                array_fill('cancelled'::text, ARRAY[cardinality(v_ended.ids)]));
    PERFORM notifyq.settle_v1(v_ended.ids, v_ended.queues, v_ended.keys);
    RETURN QUERY SELECT unnest(v_ended.ids);
END;
$$;

-- recheck_waiting_v1 (sql/005), the check at the commit of an insert that waits: its parents
-- are read from both tables in one statement (a parent that a worker moves meanwhile is read
-- again: the statement that waited for its row cannot see it in notifyq.jobs_done).
CREATE OR REPLACE FUNCTION notifyq.recheck_waiting_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parents record;
    v_child record;
BEGIN
    FOR v_try IN 1..2 LOOP
        SELECT count(*) AS found,
               count(*) FILTER (WHERE p.status = 'completed') AS completed,
               (array_agg(p.id ORDER BY p.id)
                    FILTER (WHERE p.status IN ('failed', 'cancelled')))[1] AS ended,
               array_agg(DISTINCT p.queue) FILTER (WHERE p.status = 'queued'
                                                   AND NOT p.group_blocked) AS queued
        INTO v_parents
        FROM (SELECT j.id, j.status, j.queue, j.group_blocked FROM notifyq.jobs AS j
              WHERE j.id = ANY(NEW.depends_on) ORDER BY j.id FOR SHARE) AS p;
        EXIT WHEN v_parents.found = cardinality(NEW.depends_on);
    END LOOP;
    PERFORM notifyq.notify_queues_v1(v_parents.queued);
    IF v_parents.ended IS NOT NULL THEN
        PERFORM notifyq.doom_waiting_v1(ARRAY[NEW.id]);
    ELSIF v_parents.completed = v_parents.found THEN
        UPDATE ONLY notifyq.jobs AS j SET status = 'queued'
        WHERE j.id = NEW.id AND j.status = 'waiting'
        RETURNING j.queue, j.group_blocked INTO v_child;
        IF FOUND THEN
            IF NOT v_child.group_blocked THEN
                PERFORM notifyq.notify_queues_v1(ARRAY[v_child.queue]);
            END IF;
            PERFORM notifyq.announce_v1(ARRAY[NEW.id]);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- advance_groups_v1 (sql/016) over the queue alone.
CREATE OR REPLACE FUNCTION notifyq.advance_groups_v1(p_queues text[], p_group_keys text[])
RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM notifyq.lock_group_v1(g.queue, g.group_key)
    FROM (SELECT DISTINCT u.queue, u.group_key
          FROM unnest(p_queues, p_group_keys) AS u(queue, group_key)
          WHERE u.group_key IS NOT NULL
          ORDER BY 1, 2) AS g;
    RETURN QUERY
    WITH groups AS (
        SELECT DISTINCT u.queue, u.group_key
        FROM unnest(p_queues, p_group_keys) AS u(queue, group_key)
        WHERE u.group_key IS NOT NULL
    ), heads AS (
        SELECT (SELECT j.id FROM ONLY notifyq.jobs AS j
                WHERE j.queue = g.queue AND j.group_key = g.group_key
                  AND j.status IN ('waiting', 'queued') AND j.group_blocked
                ORDER BY j.group_seq
                LIMIT 1) AS id
        FROM groups AS g
        WHERE (SELECT true FROM ONLY notifyq.jobs AS j
               WHERE j.queue = g.queue AND j.group_key = g.group_key
                 AND j.status IN ('waiting', 'queued', 'processing') AND NOT j.group_blocked
               LIMIT 1) IS NULL
    )
    UPDATE ONLY notifyq.jobs AS j SET group_blocked = false
    FROM heads AS h
    WHERE j.id = h.id
    RETURNING j.id, CASE WHEN j.status = 'queued' THEN j.queue END;
END;
$$;

-- -- The rest of a worker's writes, over the queue alone ------------------------------------------

-- snooze_v1, beat_v1 and progress_v1 (sql/005, sql/004): unchanged but for ONLY, which spares
-- each a probe of notifyq.jobs_done's primary key per row.
CREATE OR REPLACE FUNCTION notifyq.snooze_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_delays float8[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_rows record;
BEGIN
    WITH snoozed AS (
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'queued',
            run_at = now() + make_interval(secs => p_delays[array_position(p_ids, j.id)]),
            attempt_count = greatest(j.attempt_count - 1, 0),
            worker_id = NULL,
            lease_expires_at = NULL,
            heartbeat_at = NULL
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.id, j.queue
    )
    SELECT array_agg(x.id) AS ids, array_agg(DISTINCT x.queue) AS queues INTO v_rows
    FROM snoozed AS x;
    IF v_rows.ids IS NOT NULL THEN
        -- Idle workers sleep until the next run_at they know: it may be later than this one.
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.ids);
        RETURN QUERY SELECT unnest(v_rows.ids);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.beat_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_running boolean[],
    p_lease float8
) RETURNS TABLE (id uuid, cancel_requested boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE ONLY notifyq.jobs AS j
    SET lease_expires_at = now() + make_interval(secs => p_lease),
        heartbeat_at = CASE WHEN p_running[array_position(p_ids, j.id)] THEN now()
                            ELSE j.heartbeat_at END
    WHERE j.id = ANY(p_ids)
      AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                           p_claims[array_position(p_ids, j.id)])
    RETURNING j.id, j.cancel_requested_at IS NOT NULL;
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.progress_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_fractions float8[],
    p_messages text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_ids uuid[];
BEGIN
    WITH reported AS (
        UPDATE ONLY notifyq.jobs AS j
        SET progress = jsonb_build_object('fraction', p_fractions[array_position(p_ids, j.id)],
                                          'message', p_messages[array_position(p_ids, j.id)])
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.id
    )
    SELECT array_agg(x.id) INTO v_ids FROM reported AS x;
    IF v_ids IS NOT NULL THEN
        PERFORM notifyq.announce_v1(v_ids);
        RETURN QUERY SELECT unnest(v_ids);
    END IF;
END;
$$;

-- A pending duplicate is in the queue.
CREATE OR REPLACE FUNCTION notifyq.pending_duplicate_v1(p_queue text, p_dedup_key text)
RETURNS uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT id FROM ONLY notifyq.jobs
    WHERE p_dedup_key IS NOT NULL AND queue = p_queue AND dedup_key = p_dedup_key
      AND status IN ('waiting', 'queued');
$$;

-- retry_v1 (sql/005): the job moves back through revive_v1, whose INSERT decides what the old
-- function decided by hand (waiting or queued, blocked by its group or not; the statement
-- trigger wakes its workers).
CREATE OR REPLACE FUNCTION notifyq.retry_v1(p_id uuid) RETURNS TABLE (status text, refused text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_found boolean := false;
    v_newer uuid;
    v_ended uuid;
    v_now record;
BEGIN
    FOR v_try IN 1..2 LOOP
        SELECT j.status, j.queue, j.dedup_key, j.depends_on, j.group_key INTO v_job
        FROM notifyq.jobs AS j WHERE j.id = p_id FOR NO KEY UPDATE;
        v_found := FOUND;
        EXIT WHEN v_found;
    END LOOP;
    IF NOT v_found THEN
        RETURN;
    END IF;
    IF v_job.status NOT IN ('failed', 'cancelled') THEN
        RETURN QUERY SELECT v_job.status,
            format('it is %s; only failed or cancelled jobs go back', v_job.status);
        RETURN;
    END IF;
    v_newer := notifyq.pending_duplicate_v1(v_job.queue, v_job.dedup_key);
    IF v_newer IS NOT NULL THEN
        RETURN QUERY SELECT v_job.status,
            format('job %s with the same queue and dedup_key %L has not started and replaces it',
                   v_newer, v_job.dedup_key);
        RETURN;
    END IF;
    SELECT p.id INTO v_ended FROM notifyq.jobs_done AS p
    WHERE p.id = ANY(v_job.depends_on) AND p.status IN ('failed', 'cancelled')
    ORDER BY p.id LIMIT 1;
    IF v_ended IS NOT NULL THEN
        RETURN QUERY SELECT v_job.status,
            format('job %s, which it depends on, failed or was cancelled: retry it first',
                   v_ended);
        RETURN;
    END IF;
    SELECT * INTO v_now FROM notifyq.revive_v1(p_id);
    PERFORM notifyq.announce_v1(ARRAY[p_id]);
    RETURN QUERY SELECT v_now.status, NULL::text;
END;
$$;

-- watch_v1 (sql/005): a job that a worker moved while this waited for its row is read again.
CREATE OR REPLACE FUNCTION notifyq.watch_v1(p_job_id uuid, p_watcher text, p_ttl float8)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job record;
    v_found boolean := false;
BEGIN
    INSERT INTO notifyq.watched_jobs (job_id, watcher, expires_at)
    VALUES (p_job_id, p_watcher, now() + make_interval(secs => p_ttl))
    ON CONFLICT (job_id, watcher) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    FOR v_try IN 1..2 LOOP
        SELECT j.status, j.queue, j.group_blocked INTO v_job
        FROM notifyq.jobs AS j WHERE j.id = p_job_id FOR SHARE;
        v_found := FOUND;
        EXIT WHEN v_found;
    END LOOP;
    IF NOT v_found THEN
        DELETE FROM notifyq.watched_jobs WHERE job_id = p_job_id AND watcher = p_watcher;
        RETURN false;
    END IF;
    IF v_job.status = 'queued' AND NOT v_job.group_blocked THEN
        PERFORM notifyq.notify_queues_v1(ARRAY[v_job.queue]);
    END IF;
    RETURN true;
END;
$$;

-- -- Retention and the archive: finished jobs are in notifyq.jobs_done ------------------------

CREATE OR REPLACE FUNCTION notifyq.prune_v2(p_status text, p_keep float8, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_deleted integer;
BEGIN
    DELETE FROM notifyq.jobs_done
    WHERE id IN (SELECT j.id FROM notifyq.jobs_done AS j
                 WHERE j.status = p_status
                   AND j.finished_at < now() - make_interval(secs => p_keep)
                   AND NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS c
                                   WHERE c.status IN ('waiting', 'queued')
                                     AND c.depends_on <> '{}' AND c.depends_on @> ARRAY[j.id])
                 ORDER BY j.finished_at
                 LIMIT p_limit
                 FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.archive_v1(p_after float8, p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH moved AS (
        DELETE FROM notifyq.jobs_done AS j
        WHERE j.id IN (SELECT c.id FROM notifyq.jobs_done AS c
                       WHERE c.finished_at < now() - make_interval(secs => p_after)
                         AND NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS w
                                         WHERE w.status IN ('waiting', 'queued')
                                           AND w.depends_on <> '{}'
                                           AND w.depends_on @> ARRAY[c.id])
                       ORDER BY c.finished_at
                       LIMIT p_limit
                       FOR UPDATE SKIP LOCKED)
        RETURNING j.id, j.task, j.queue, j.payload, j.status, j.priority, j.run_at,
                  j.attempt_count, j.max_attempts, j.dedup_key, j.result, j.last_error,
                  j.errors, j.created_at, j.started_at, j.finished_at, j.worker_id,
                  j.cancel_requested_at, j.claims, j.lost_count, j.depends_on, j.group_key,
                  j.workflow_id, j.progress, j.trace_context, j.ref
    )
    INSERT INTO notifyq.jobs_archive
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
         cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
         trace_context, ref)
    SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
           dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
           cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
           trace_context, ref
    FROM moved;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END;
$$;

-- -- Enqueues ---------------------------------------------------------------------------------------

-- A plain INSERT's defaults (queue, priority and max_attempts from the task's registration):
-- looked up once a statement and task, as in sql/013, but the statement is told by a statement
-- trigger (jobs_0_statement, below, forgets the defaults kept) instead of a key built of the
-- transaction, the statement's time and the task at every row, which cost more than the
-- lookups it saved. Runs as the inserting role, with no SET clause (sql/013 says why): every
-- name is qualified.
CREATE FUNCTION notifyq.keep_task_defaults_v2(p_task text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task record;
BEGIN
    SELECT coalesce(t.options ->> 'queue', 'default') AS queue,
           coalesce((t.options ->> 'priority')::integer, 0) AS priority,
           coalesce(t.max_attempts,
                    (SELECT s.value::integer FROM notifyq.settings AS s
                     WHERE s.key = 'max_attempts'),
                    3) AS max_attempts
    INTO v_task
    FROM (SELECT p_task AS name) AS n
    LEFT JOIN notifyq.tasks AS t ON t.name = n.name;
    -- Transaction-local: set inside this function (which has a SET clause of its own), they
    -- still outlive the call, until the transaction ends.
    PERFORM set_config('notifyq.defaults_queue', v_task.queue, true),
            set_config('notifyq.defaults_priority', v_task.priority::text, true),
            set_config('notifyq.defaults_max_attempts', v_task.max_attempts::text, true),
            set_config('notifyq.defaults_task', '=' || p_task, true);
END;
$$;

CREATE FUNCTION notifyq.fill_defaults_v3() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    -- Kept as '=' and the task: the empty text, the mark of none kept, is no task's.
    IF (pg_catalog.current_setting('notifyq.defaults_task', true)
        OPERATOR(pg_catalog.=) ('=' OPERATOR(pg_catalog.||) NEW.task)) IS NOT TRUE THEN
        PERFORM notifyq.keep_task_defaults_v2(NEW.task);
    END IF;
    NEW.queue := coalesce(NEW.queue, pg_catalog.current_setting('notifyq.defaults_queue'));
    NEW.priority := coalesce(
        NEW.priority, pg_catalog.current_setting('notifyq.defaults_priority')::pg_catalog.int4);
    NEW.max_attempts := coalesce(
        NEW.max_attempts,
        pg_catalog.current_setting('notifyq.defaults_max_attempts')::pg_catalog.int4);
    RETURN NEW;
END;
$$;

-- Before each INSERT statement: the defaults kept are a previous statement's, and a task may
-- have been registered since (sql/013's test: a registration between two statements of one
-- transaction).
CREATE FUNCTION notifyq.forget_defaults_v1() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.set_config('notifyq.defaults_task', '', true);
    RETURN NULL;
END;
$$;

DROP TRIGGER jobs_a_defaults ON notifyq.jobs;
CREATE TRIGGER jobs_0_statement BEFORE INSERT ON notifyq.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION notifyq.forget_defaults_v1();
CREATE TRIGGER jobs_a_defaults BEFORE INSERT ON notifyq.jobs FOR EACH ROW
    WHEN (NEW.task IS NOT NULL
          AND (NEW.queue IS NULL OR NEW.priority IS NULL OR NEW.max_attempts IS NULL))
    EXECUTE FUNCTION notifyq.fill_defaults_v3();


-- accept_job_v2 (sql/018), the rule of every INSERT that names more than a plain one: parents are
-- read in both tables, and a job whose parent ended waits (see below).
CREATE OR REPLACE FUNCTION notifyq.accept_job_v2() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owned text[] := ARRAY[]::text[];
    v_defaults record;
    v_parents record;
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
    IF NEW.group_seq IS NOT NULL THEN v_owned := v_owned || 'group_seq'::text; END IF;
    IF NEW.group_blocked THEN v_owned := v_owned || 'group_blocked'::text; END IF;
    IF NEW.progress IS NOT NULL THEN v_owned := v_owned || 'progress'::text; END IF;
    IF cardinality(v_owned) > 0 THEN
        RAISE EXCEPTION 'notifyq.jobs: % % set by notifyq''s workers, not by an INSERT',
                        array_to_string(v_owned, ', '),
                        CASE WHEN cardinality(v_owned) = 1 THEN 'is' ELSE 'are' END
            USING ERRCODE = 'check_violation',
                  HINT = 'Insert the task and payload (and queue, priority, run_at, dedup_key, '
                         'max_attempts, depends_on, group_key, workflow_id) only.';
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
    IF cardinality(NEW.depends_on) > 0 THEN
        NEW.depends_on := ARRAY(SELECT DISTINCT d FROM unnest(NEW.depends_on) AS d ORDER BY d);
        IF NEW.id = ANY(NEW.depends_on) THEN
            RAISE EXCEPTION 'notifyq.jobs: job % cannot depend on itself', NEW.id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        -- Parents that have finished are locked (FOR KEY SHARE) so that retention cannot delete
        -- them before this insert commits; live ones cannot be deleted, and are looked at again
        -- at commit (recheck_waiting_v1). Both tables in one statement, so a parent that
        -- finishes meanwhile is counted once; one that a statement waited for (a retry moving
        -- it back) is read again by the next.
        FOR v_try IN 1..2 LOOP
            SELECT count(*) AS found,
                   count(*) FILTER (WHERE p.status = 'completed') AS completed,
                   bool_or(p.status IN ('failed', 'cancelled')) AS ended
            INTO v_parents
            FROM (SELECT d.id, d.status
                  FROM (SELECT d.id, d.status FROM notifyq.jobs_done AS d
                        WHERE d.id = ANY(NEW.depends_on) ORDER BY d.id FOR KEY SHARE) AS d
                  UNION ALL
                  SELECT j.id, j.status FROM ONLY notifyq.jobs AS j
                  WHERE j.id = ANY(NEW.depends_on)) AS p;
            EXIT WHEN v_parents.found >= cardinality(NEW.depends_on);
        END LOOP;
        IF v_parents.found < cardinality(NEW.depends_on) THEN
            RAISE EXCEPTION 'notifyq.jobs: depends_on names job(s) that do not exist: %',
                array_to_string(ARRAY(
                    SELECT d FROM unnest(NEW.depends_on) AS d
                    WHERE NOT EXISTS (SELECT 1 FROM notifyq.jobs AS j WHERE j.id = d)), ', ')
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        -- A job whose parent failed or was cancelled waits too: an INSERT cannot put it among
        -- the finished jobs. The enqueue functions cancel it at once (doom_waiting_v1), the
        -- check at commit otherwise.
        IF v_parents.ended OR v_parents.completed < v_parents.found THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.group_key IS NOT NULL THEN
        PERFORM notifyq.lock_group_v1(NEW.queue, NEW.group_key);
        NEW.group_seq := nextval('notifyq.group_seq');
        NEW.group_blocked := EXISTS (
            SELECT 1 FROM ONLY notifyq.jobs AS g
            WHERE g.queue = NEW.queue AND g.group_key = NEW.group_key
              AND g.status IN ('waiting', 'queued', 'processing'));
    END IF;
    RETURN NEW;
END;
$$;

-- enqueue_v4 (sql/019): a new job whose parent ended is cancelled before this answers.
CREATE OR REPLACE FUNCTION notifyq.enqueue_v4(
    p_task text,
    p_payload jsonb,
    p_queue text,
    p_priority integer,
    p_run_at timestamptz,
    p_delay float8,
    p_dedup_key text,
    p_max_attempts integer,
    p_fallback integer,
    p_depends_on uuid[],
    p_group_key text,
    p_workflow_id uuid,
    p_id uuid,
    p_trace_context jsonb
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_new_id uuid := coalesce(p_id, notifyq.uuid_v7());
    v_payload jsonb := coalesce(p_payload, '{}'::jsonb);
    v_asked uuid[] := ARRAY(SELECT DISTINCT a FROM unnest(p_depends_on) AS a ORDER BY a);
    v_job record;
    d record;
BEGIN
    SELECT * INTO d
    FROM notifyq.job_defaults_v1(ARRAY[p_task], ARRAY[v_payload], ARRAY[p_queue],
                                 ARRAY[p_priority], ARRAY[p_max_attempts], p_fallback);
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts, depends_on,
             group_key, workflow_id, trace_context)
        VALUES (v_new_id, d.task, v_payload, d.queue, d.priority,
                coalesce(p_run_at, now() + make_interval(secs => coalesce(p_delay, 0))),
                p_dedup_key, d.max_attempts, coalesce(p_depends_on, '{}'), p_group_key,
                p_workflow_id, p_trace_context)
        ON CONFLICT (queue, dedup_key)
            WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL
        DO UPDATE SET payload = EXCLUDED.payload,
                      priority = EXCLUDED.priority,
                      run_at = EXCLUDED.run_at,
                      max_attempts = EXCLUDED.max_attempts,
                      trace_context = coalesce(EXCLUDED.trace_context, j.trace_context)
            WHERE j.status IN ('waiting', 'queued')
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at, j.group_blocked,
                  j.depends_on, j.group_key INTO v_job;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_job.id <> v_new_id THEN
        -- Raising undoes the replacement above: the pending job stays as it was.
        IF v_job.depends_on <> v_asked THEN
            RAISE EXCEPTION 'job % is pending with dedup_key % and depends_on {%}, not {%}',
                            v_job.id, p_dedup_key, array_to_string(v_job.depends_on, ', '),
                            array_to_string(v_asked, ', ')
                USING ERRCODE = 'unique_violation',
                      HINT = 'Submit it with the same depends_on, or with another dedup_key.';
        END IF;
        IF v_job.group_key IS DISTINCT FROM p_group_key THEN
            RAISE EXCEPTION 'job % is pending with dedup_key % and group_key %, not %',
                            v_job.id, p_dedup_key, coalesce(quote_literal(v_job.group_key), 'none'),
                            coalesce(quote_literal(p_group_key), 'none')
                USING ERRCODE = 'unique_violation',
                      HINT = 'Submit it with the same group_key, or with another dedup_key.';
        END IF;
        -- A replaced job may now be due earlier than the time its workers sleep until.
        IF v_job.status = 'queued' AND NOT v_job.group_blocked THEN
            PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
        END IF;
        PERFORM notifyq.announce_v1(ARRAY[v_job.id]);
    END IF;
    IF v_job.id = v_new_id AND v_job.status = 'waiting'
       AND EXISTS (SELECT 1 FROM notifyq.doom_waiting_v1(ARRAY[v_new_id])) THEN
        -- A parent had failed or was cancelled: it ended at once, cancelled.
        v_job.status := 'cancelled';
    END IF;
    RETURN QUERY SELECT v_job.id, v_job.id <> v_new_id, v_job.status, v_job.run_at,
                        v_job.created_at;
END;
$$;

-- enqueue_many_v4 (sql/019): the new jobs whose parent ended are cancelled before this answers.
CREATE OR REPLACE FUNCTION notifyq.enqueue_many_v4(
    p_tasks text[],
    p_payloads jsonb[],
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[],
    p_delays float8[],
    p_dedup_keys text[],
    p_max_attempts integer[],
    p_fallback integer,
    p_depends_on text[],
    p_group_keys text[],
    p_workflow_ids uuid[],
    p_ids uuid[],
    p_trace_context jsonb
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_row_by_row boolean := EXISTS (SELECT 1 FROM unnest(p_dedup_keys) AS k WHERE k IS NOT NULL)
                            AND EXISTS (SELECT 1 FROM unnest(p_group_keys) AS k
                                        WHERE k IS NOT NULL);
    v_set record;
BEGIN
    WITH input AS MATERIALIZED (
        SELECT u.ord, coalesce(u.id, notifyq.uuid_v7()) AS id,
               coalesce(u.payload, '{}'::jsonb) AS payload,
               coalesce(u.run_at, now() + make_interval(secs => coalesce(u.delay, 0))) AS run_at,
               coalesce(u.depends_on::uuid[], '{}') AS depends_on, u.group_key, u.workflow_id,
               u.dedup_key
        FROM ROWS FROM (unnest(p_payloads), unnest(p_run_ats), unnest(p_delays),
                        unnest(p_dedup_keys), unnest(p_depends_on), unnest(p_group_keys),
                        unnest(p_workflow_ids), unnest(p_ids)) WITH ORDINALITY
             AS u(payload, run_at, delay, dedup_key, depends_on, group_key, workflow_id, id, ord)
    ), inserted AS (
        INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts,
                                  depends_on, group_key, workflow_id, trace_context)
        SELECT i.id, d.task, i.payload, d.queue, d.priority, i.run_at, d.max_attempts,
               i.depends_on, i.group_key, i.workflow_id, p_trace_context
        FROM input AS i
        JOIN notifyq.job_defaults_v1(p_tasks, p_payloads, p_queues, p_priorities,
                                     p_max_attempts, p_fallback) AS d ON d.ord = i.ord
        WHERE i.dedup_key IS NULL AND NOT v_row_by_row
        ORDER BY i.ord
        RETURNING id, status, created_at
    )
    SELECT array_agg(i.ord::integer) AS ords, array_agg(i.id) AS ids,
           array_agg(x.status) AS statuses, array_agg(i.run_at) AS run_ats,
           array_agg(x.created_at) AS created,
           array_agg(i.id) FILTER (WHERE x.status = 'waiting') AS waiting
    INTO v_set
    FROM input AS i JOIN inserted AS x ON x.id = i.id;
    IF v_set.waiting IS NOT NULL THEN
        -- Jobs whose parent had ended are cancelled now, and those of this batch that depend
        -- on them after them: their statuses are read back.
        PERFORM notifyq.doom_waiting_v1(v_set.waiting);
    END IF;
    RETURN QUERY
    SELECT u.ord, u.id, false,
           CASE WHEN v_set.waiting IS NULL THEN u.status
                ELSE (SELECT j.status FROM notifyq.jobs AS j WHERE j.id = u.id) END,
           u.run_at, u.created_at
    FROM unnest(v_set.ords, v_set.ids, v_set.statuses, v_set.run_ats, v_set.created)
         AS u(ord, id, status, run_at, created_at);

    IF p_dedup_keys IS NOT NULL THEN
        FOR r IN
            SELECT u.*
            FROM ROWS FROM (unnest(p_tasks), unnest(p_payloads), unnest(p_queues),
                            unnest(p_priorities), unnest(p_run_ats), unnest(p_delays),
                            unnest(p_dedup_keys), unnest(p_max_attempts), unnest(p_depends_on),
                            unnest(p_group_keys), unnest(p_workflow_ids), unnest(p_ids))
                 WITH ORDINALITY
                 AS u(task, payload, queue, priority, run_at, delay, dedup_key, max_attempts,
                      depends_on, group_key, workflow_id, id, ord)
            WHERE u.dedup_key IS NOT NULL OR v_row_by_row
            ORDER BY u.ord
        LOOP
            RETURN QUERY
            SELECT r.ord::integer, e.job_id, e.duplicate, e.status, e.run_at, e.created_at
            FROM notifyq.enqueue_v4(r.task, r.payload, r.queue, r.priority, r.run_at, r.delay,
                                    r.dedup_key, r.max_attempts, p_fallback,
                                    r.depends_on::uuid[], r.group_key, r.workflow_id, r.id,
                                    p_trace_context) AS e;
        END LOOP;
    END IF;
END;
$$;

-- -- Privileges ----------------------------------------------------------------------------------

-- Roles granted privileges on notifyq.jobs before this version (`notifyq grant`) get the same on
-- notifyq.jobs_done, so their workers and readers keep working without a new grant: a worker
-- moves jobs into it, and a read through notifyq.jobs needs nothing more, but a worker's
-- functions write the child table by name.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT g.grantee, string_agg(g.privilege_type, ', ') AS privileges
        FROM information_schema.role_table_grants AS g
        WHERE g.table_schema = 'notifyq' AND g.table_name = 'jobs'
          AND g.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
          AND g.grantee <> (SELECT pg_get_userbyid(c.relowner) FROM pg_class AS c
                            WHERE c.oid = 'notifyq.jobs'::regclass)
        GROUP BY g.grantee
    LOOP
        EXECUTE format('GRANT %s ON notifyq.jobs_done TO %I', r.privileges, r.grantee);
    END LOOP;
END;
$$;

-- -- Functions no code calls any more -----------------------------------------------------------

-- Earlier versions of functions that workers call, replaced by the versions above or before
-- them, and the old defaults trigger: no worker of version 19 or later calls them, and most
-- wrote finished jobs into notifyq.jobs, which now refuses them.
DROP FUNCTION notifyq.accept_job_v1();
DROP FUNCTION notifyq.cancel_job_v1(uuid);
DROP FUNCTION notifyq.cancel_running_v2(text, uuid[], integer[]);
DROP FUNCTION notifyq.claim_limited_v3(text, text[], text[], integer, float8);
DROP FUNCTION notifyq.claim_limited_v2(text, text[], text[], integer, float8);
DROP FUNCTION notifyq.claim_limited_v1(text, text[], text[], integer, float8);
DROP FUNCTION notifyq.claim_v3(text, text[], text[], integer, float8, boolean);
DROP FUNCTION notifyq.claim_v2(text, text[], text[], integer, float8, boolean);
DROP FUNCTION notifyq.claim_v1(text, text[], text[], integer, float8, boolean);
DROP FUNCTION notifyq.complete_and_claim_v1(text, uuid[], integer[], jsonb[], text[], text[],
                                            integer, float8);
DROP FUNCTION notifyq.complete_v2(text, uuid[], integer[], jsonb[]);
DROP FUNCTION notifyq.complete_v1(text, uuid[], integer[], jsonb[]);
DROP FUNCTION notifyq.enqueue_many_v3;
DROP FUNCTION notifyq.enqueue_many_v2;
DROP FUNCTION notifyq.enqueue_many_v1;
DROP FUNCTION notifyq.enqueue_tick_v1;
DROP FUNCTION notifyq.enqueue_v2;
DROP FUNCTION notifyq.enqueue_v1;
DROP FUNCTION notifyq.fail_v2;
DROP FUNCTION notifyq.fail_v1;
DROP FUNCTION notifyq.fill_defaults_v2();
DROP FUNCTION notifyq.fill_defaults_v1();
DROP FUNCTION notifyq.keep_task_defaults_v1(text, text);
DROP FUNCTION notifyq.next_due_v2;
DROP FUNCTION notifyq.next_due_v1;
DROP FUNCTION notifyq.notify_inserted_v1();
DROP FUNCTION notifyq.prune_v1;
DROP FUNCTION notifyq.prune_waiting_v1;
DROP FUNCTION notifyq.queued_duplicate_v1(text, text);
DROP FUNCTION notifyq.release_v2;
DROP FUNCTION notifyq.rescue_v2;
DROP FUNCTION notifyq.resolve_task_v1;
DROP FUNCTION notifyq.start_jobs_v2;
DROP FUNCTION notifyq.start_jobs_v1;
