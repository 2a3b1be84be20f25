-- notifyq schema, version 17: a worker that serves some queues reads only their jobs.
--
-- Same signature and the same answers as before: workers and API processes of earlier versions
-- keep working beside this.

-- The claim index (sql/005) is in the order jobs are claimed, across every queue: a worker
-- started with --queues email walked it past every queued job of the other queues, at each
-- claim, empty ones included. With 200,000 jobs queued in "default", a claim of the "email"
-- worker took 170-200 ms of the server's CPU, at every notification and every poll. The same
-- order, per queue: one short walk of each served queue.
--
-- A migration runs in a transaction, where CREATE INDEX CONCURRENTLY cannot: this build holds
-- off inserts (not reads or claims) while it reads the whole table, finished jobs included. On
-- a table of many millions of rows, create it CONCURRENTLY by hand first, with this name and
-- definition (README, "Upgrading"); the migration then finds it and goes on.
CREATE INDEX IF NOT EXISTS jobs_queue_claim_idx ON notifyq.jobs (queue, priority DESC, run_at, id)
    WHERE status = 'queued' AND NOT group_blocked;

-- claim_v4 (sql/007), the same for a worker that serves every queue; for one that names its
-- queues, the first p_limit claimable jobs of each queue, locked as they are read, then the
-- first p_limit of those in the claim order. Rows of the ones left over stay locked until this
-- statement's transaction ends, a moment later: a worker skips them meanwhile, and as the claim
-- came back full, its own worker claims again at once.
CREATE OR REPLACE FUNCTION notifyq.claim_v4(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
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
DECLARE
    v_ids uuid[];
BEGIN
    IF p_queues IS NULL THEN
        v_ids := ARRAY(
            SELECT j.id
            FROM notifyq.jobs AS j
            WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
              AND j.task = ANY(p_tasks)
              AND (p_probe OR j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                             WHERE t.breaker_open_until IS NOT NULL))
              AND j.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                  WHERE q.paused OR q.rate_limit IS NOT NULL)
              AND j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                 WHERE t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT p_limit
            FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        v_ids := ARRAY(
            SELECT c.id
            FROM (SELECT DISTINCT s.name FROM unnest(p_queues) AS s(name)) AS served
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM notifyq.jobs AS j
                WHERE j.queue = served.name
                  AND j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
                  AND j.task = ANY(p_tasks)
                  AND (p_probe OR j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                                 WHERE t.breaker_open_until IS NOT NULL))
                  AND j.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                      WHERE q.paused OR q.rate_limit IS NOT NULL)
                  AND j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                     WHERE t.max_concurrency IS NOT NULL
                                        OR t.rate_limit IS NOT NULL)
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT p_limit
                FOR NO KEY UPDATE SKIP LOCKED) AS c
            ORDER BY c.priority DESC, c.run_at, c.id
            LIMIT p_limit);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM notifyq.start_jobs_v3(p_worker_id, v_ids, p_lease);
END;
$$;
