-- notifyq schema, version 2: batch writes find their jobs by primary key, one lookup per job.
--
-- Until now a batch of outcomes was one prepared statement joining the unnest()ed arrays to the
-- jobs matching "id = ANY(ids)". Its generic plan read those jobs and then scanned the arrays
-- once per job: quadratic in the batch, and 40% of the database's CPU for a completed job.
-- Walking the arrays and looking each id up in jobs_pkey is linear, but a planner that sees a
-- tiny table (a new queue, just after TRUNCATE) would choose a sequential scan and keep that
-- plan as the table grows. As in claim_v1, a PL/pgSQL function keeps the plan for the session,
-- and its SET clauses leave it no path but the primary key. JIT stays off for the reason
-- claim_v1 gives.
--
-- Workers of version 1 keep their own statements, which still work beside these.

-- Records successful attempts and answers the ids written. The (worker_id, attempt_count) check
-- in the same UPDATE discards the result of a worker that lost the job's lease meanwhile. A
-- success closes its task's circuit breaker (the task works again).
CREATE FUNCTION notifyq.complete_v1(
    p_worker_id text, p_ids uuid[], p_attempts integer[], p_results jsonb[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
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
        FROM unnest(p_ids, p_attempts, p_results) AS d(id, attempt, result)
        WHERE j.id = d.id AND (j.status = 'processing') IS TRUE
          AND j.worker_id = p_worker_id
          AND j.attempt_count = d.attempt
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
-- is retryable), else failed. Fenced like complete_v1. A job whose newer duplicate (same queue
-- and dedup_key) is queued is not retried: that newer job replaces it. Retryable failures count
-- towards the task's circuit breaker, which opens for its cool-down once they reach its
-- threshold. Answers the id and new status of each job written.
CREATE FUNCTION notifyq.fail_v1(
    p_worker_id text, p_ids uuid[], p_attempts integer[], p_errors text[],
    p_retryable boolean[], p_delays float8[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
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
        FROM unnest(p_ids, p_attempts, p_errors, p_retryable, p_delays)
             AS d(id, attempt, error, retryable, delay)
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
            errors = notifyq.append_error_v1(j.errors, d.attempt, d.error, j.worker_id)
        FROM d
        WHERE j.id = d.id AND (j.status = 'processing') IS TRUE
          AND j.worker_id = p_worker_id
          AND j.attempt_count = d.attempt
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
