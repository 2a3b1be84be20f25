-- notifyq schema, version 4: every statement a worker runs is a function of the schema.
--
-- Until now a worker ran some of its statements as plan-pinned functions (claims, outcomes,
-- rescue) and others as inline queries of queries.sql (its idle mark, retention, the look for
-- the next due job, task registration). Each one is now a versioned function with a pinned
-- search_path, so that the statements a worker depends on live, and change, in the schema's
-- migrations, and a reader finds each one in sql/schema.sql. queries.sql only calls them.

-- Seconds until the earliest queued job of these tasks (and queues) that is not due yet, on the
-- database's clock, so an idle worker can sleep exactly until then; NULL when there is none.
CREATE FUNCTION notifyq.next_due_v1(p_tasks text[], p_queues text[])
RETURNS float8
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT extract(epoch FROM min(j.run_at) - now())::float8
    FROM notifyq.jobs AS j
    WHERE j.status = 'queued' AND j.run_at > now() AND j.task = ANY(p_tasks)
      AND (p_queues IS NULL OR j.queue = ANY(p_queues));
$$;

-- Records a task that a worker serves, with its options, limits and breaker, for all workers,
-- the API and plain SQL inserts (which take the task's queue, priority and max_attempts from
-- here). A task registered again keeps its breaker's state and its tokens.
CREATE FUNCTION notifyq.register_task_v1(
    p_name text, p_max_attempts integer, p_options jsonb, p_breaker_threshold integer,
    p_breaker_cooldown float8, p_max_concurrency integer, p_rate_limit float8, p_rate_burst float8
) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO notifyq.tasks (name, max_attempts, options, breaker_threshold, breaker_cooldown,
                               max_concurrency, rate_limit, rate_burst, rate_tokens, updated_at)
    VALUES (p_name, p_max_attempts, p_options, p_breaker_threshold, p_breaker_cooldown,
            p_max_concurrency, p_rate_limit, p_rate_burst, coalesce(p_rate_burst, 0), now())
    ON CONFLICT (name) DO UPDATE
    SET max_attempts = EXCLUDED.max_attempts, options = EXCLUDED.options,
        breaker_threshold = EXCLUDED.breaker_threshold,
        breaker_cooldown = EXCLUDED.breaker_cooldown,
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_burst = EXCLUDED.rate_burst,
        updated_at = now();
$$;

-- A half-open breaker (open, cool-down over) lets one probe through: the worker whose UPDATE
-- wins pushes the time forward by another cool-down and may claim one job of that task.
-- Answers the tasks whose probe the caller won.
CREATE FUNCTION notifyq.take_probes_v1(p_tasks text[])
RETURNS SETOF text
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE notifyq.tasks
    SET breaker_open_until = now() + make_interval(secs => breaker_cooldown)
    WHERE name = ANY(p_tasks) AND breaker_open_until <= now()
    RETURNING name;
$$;

-- Whether any limited task of these, or any rate-limited queue, exists: a worker calls the
-- limited claim only then.
CREATE FUNCTION notifyq.limits_exist_v1(p_tasks text[])
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM notifyq.tasks
                   WHERE name = ANY(p_tasks)
                     AND (max_concurrency IS NOT NULL OR rate_limit IS NOT NULL))
        OR EXISTS (SELECT 1 FROM notifyq.queues WHERE rate_limit IS NOT NULL);
$$;

-- The other half of notifyq.mark_waiting_v1: a worker that is busy again (or stopping) removes
-- its idle mark, so inserts stop waking it.
CREATE FUNCTION notifyq.mark_busy_v1(p_worker_id text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM notifyq.waiting_workers WHERE worker_id = p_worker_id;
$$;

-- Keeps an idle mark from expiring while its worker still waits.
CREATE FUNCTION notifyq.refresh_waiting_v1(p_worker_id text, p_ttl float8)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE notifyq.waiting_workers
    SET expires_at = now() + make_interval(secs => p_ttl)
    WHERE worker_id = p_worker_id;
$$;

-- Deletes the idle marks of workers that stopped refreshing them (they died).
CREATE FUNCTION notifyq.prune_waiting_v1()
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM notifyq.waiting_workers WHERE expires_at < now();
$$;

-- Retention: deletes up to p_limit jobs in p_status that finished more than p_keep seconds ago,
-- oldest first, skipping rows another worker is deleting. Never a job that another job still
-- waits for (workflows will need that; today nothing waits). Answers how many; the caller repeats
-- until fewer than p_limit come back.
CREATE FUNCTION notifyq.prune_v1(p_status text, p_keep float8, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_deleted integer;
BEGIN
    DELETE FROM notifyq.jobs
    WHERE id IN (SELECT j.id FROM notifyq.jobs AS j
                 WHERE j.status = p_status
                   AND j.finished_at < now() - make_interval(secs => p_keep)
                 ORDER BY j.finished_at
                 LIMIT p_limit
                 FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;

-- Deletes periodic ticks older than a week: they only need to outlive the ticks' workers'
-- disagreement about the time.
CREATE FUNCTION notifyq.prune_ticks_v1()
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM notifyq.periodic_ticks WHERE tick < now() - interval '7 days';
$$;

-- The database's clock, which every worker's periodic scheduler reads, so that workers whose
-- own clocks drift agree on the ticks.
CREATE FUNCTION notifyq.clock_v1()
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT now();
$$;
