-- notifyq schema, version 9: a worker records its completions and claims its next jobs in one
-- statement.
--
-- Only adds a function: workers and API processes of earlier versions keep working beside these.

-- complete_v3 (sql/005), then claim_v4 (sql/007) of up to p_take jobs for the same worker, in one
-- transaction. A job that the completion unblocked (a dependent whose last parent this was, the
-- next member of a group) starts at once on this worker, without the round trips of a
-- notification and a claim of its own; a busy worker claims its next batch in the statement that
-- records its last. The rows answered: one per completion written (only its id: every other
-- column is null), then one per job claimed (task is never null).
CREATE FUNCTION notifyq.complete_and_claim_v1(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[],
    p_tasks text[], p_queues text[], p_take integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb,
                 trace_context jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT c.id, NULL::text, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
           NULL::integer, NULL::integer, NULL::float8, NULL::float8, NULL::jsonb, NULL::jsonb
    FROM notifyq.complete_v3(p_worker_id, p_ids, p_claims, p_results) AS c(id);
    IF p_take > 0 THEN
        RETURN QUERY
        SELECT * FROM notifyq.claim_v4(p_worker_id, p_tasks, p_queues, p_take, p_lease, false);
    END IF;
END;
$$;
