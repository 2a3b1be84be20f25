-- notifyq schema, version 18: a workflow's jobs keep their refs, and a completed job has no error.
--
-- Workers and API processes of version 17 keep working beside these: every function they call
-- keeps its signature and its answers (write_completions_v1 writes one more column).

-- -- first, the jobs that completed on a retry before this version ------------------------------

-- A completed job has no error (write_completions_v1, below, says so from now on): the rows that
-- completed after a failed attempt before this version are told the same. Completed rows can be
-- millions and no index finds these, so this reads the table and the archive once, changing only
-- the few such rows. It comes first: the ALTER TABLEs below lock their tables against every read
-- and write until this transaction commits, which must not be the whole of a long scan later.
UPDATE notifyq.jobs SET last_error = NULL
WHERE status = 'completed' AND last_error IS NOT NULL;
UPDATE notifyq.jobs_archive SET last_error = NULL
WHERE status = 'completed' AND last_error IS NOT NULL;

-- -- refs ----------------------------------------------------------------------------------------

-- The name a job has in its workflow (POST /workflows, Queue.enqueue_workflow): until now only
-- the answer to the submission mapped refs to job ids, so a client that had not kept it could
-- not find a workflow's steps by name. NULL outside a workflow. Unique within a workflow by
-- construction (notifyq.workflows.plan refuses a duplicate), so no index: a workflow is read
-- whole, by workflow_id. NOT VALID: every existing row is NULL, and the table need not be read
-- under its lock to say so.
ALTER TABLE notifyq.jobs ADD COLUMN ref text;
ALTER TABLE notifyq.jobs ADD CONSTRAINT jobs_ref_bounded CHECK (
    ref IS NULL OR (workflow_id IS NOT NULL AND char_length(ref) BETWEEN 1 AND 200)
) NOT VALID;
-- An archived job keeps it (a workflow is read from both tables).
ALTER TABLE notifyq.jobs_archive ADD COLUMN ref text;

-- enqueue_many_v4 (sql/007), which keeps the rule of enqueueing, then each job's ref. A job
-- with a ref is a workflow's: its id is given (notifyq.workflows.plan makes them), and it has no
-- dedup key, so it is the row of that id. The refs are written by an UPDATE of rows this
-- transaction has just inserted, which no other transaction can see yet; a workflow holds at
-- most 1,000 jobs, and its rows are written twice rather than the enqueue rule twice.
CREATE FUNCTION notifyq.enqueue_many_v5(
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
    p_trace_context jsonb,
    p_refs text[]
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1
               FROM ROWS FROM (unnest(p_refs), unnest(p_ids), unnest(p_dedup_keys))
                    AS u(ref, id, dedup_key)
               WHERE u.ref IS NOT NULL AND (u.id IS NULL OR u.dedup_key IS NOT NULL)) THEN
        RAISE EXCEPTION 'notifyq.enqueue_many_v5: a job with a ref (a workflow''s) needs an id '
                        'of its own and no dedup key'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN QUERY
    SELECT * FROM notifyq.enqueue_many_v4(p_tasks, p_payloads, p_queues, p_priorities,
                                          p_run_ats, p_delays, p_dedup_keys, p_max_attempts,
                                          p_fallback, p_depends_on, p_group_keys,
                                          p_workflow_ids, p_ids, p_trace_context);
    IF p_refs IS NOT NULL THEN
        UPDATE notifyq.jobs AS j SET ref = u.ref
        FROM ROWS FROM (unnest(p_ids), unnest(p_refs)) AS u(id, ref)
        WHERE j.id = u.id AND u.ref IS NOT NULL;
    END IF;
END;
$$;

-- archive_v1 (sql/015), moving the ref along.
CREATE OR REPLACE FUNCTION notifyq.archive_v1(p_after float8, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH moved AS (
        DELETE FROM notifyq.jobs AS j
        WHERE j.id IN (SELECT c.id FROM notifyq.jobs AS c
                       WHERE c.status IN ('completed', 'failed', 'cancelled')
                         AND c.finished_at < now() - make_interval(secs => p_after)
                         AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS w
                                         WHERE w.status IN ('waiting', 'queued')
                                           AND w.depends_on <> '{}'
                                           AND w.depends_on @> ARRAY[c.id])
                       ORDER BY c.finished_at
                       LIMIT p_limit
                       FOR UPDATE SKIP LOCKED)
          AND j.status IN ('completed', 'failed', 'cancelled')
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

-- -- a completed job has no error ----------------------------------------------------------------

-- write_completions_v1 (sql/012), the one place that says what a completion writes, now also
-- clears last_error: it is the error of a job that has one (GET /jobs/{id} answers it as
-- `error`), and a job that completed on a retry still showed its first attempt's. The attempts
-- keep their history in `errors`, which a completion leaves as it is.
CREATE OR REPLACE FUNCTION notifyq.write_completions_v1(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[]
) RETURNS TABLE (ids uuid[], queues text[], group_keys text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        UPDATE notifyq.jobs AS j
        SET status = 'completed',
            result = d.result,
            last_error = NULL,
            finished_at = now(),
            lease_expires_at = NULL
        FROM unnest(p_ids, p_claims, p_results) AS d(id, claim, result)
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.task, j.queue, j.group_key
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
