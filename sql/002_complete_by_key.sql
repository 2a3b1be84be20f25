-- notifyq schema, version 2: completions found by primary key, one lookup per job.
--
-- Until now a batch of completions was one prepared UPDATE joining the unnest()ed arrays to the
-- jobs matching "id = ANY(ids)". Its generic plan read those jobs first and then scanned the
-- arrays once per job: quadratic in the batch, and 40% of the database's CPU for a job. Walking
-- the arrays and looking each id up in jobs_pkey is linear, but a planner that sees a tiny
-- table (a new queue, just after TRUNCATE) would choose a sequential scan and keep that plan as
-- the table grows. As in claim_v1, a PL/pgSQL function keeps the plan for the session, and its
-- SET clauses leave it no path but the primary key. JIT stays off for the reason claim_v1 gives.
--
-- Workers of version 1 keep their own statement, which still works beside this one.

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
