-- notifyq schema, version 14: a failed attempt that will be retried wakes the idle workers of its
-- queue, as a snooze, a rescue and an insert do.
--
-- notifyq.fail_v3 puts a retried job back to queued with a later run_at and told no worker: an
-- idle worker (other than the one that failed it, whose writer wakes its own producer) slept on
-- until the run_at it knew from before the retry existed, or its fallback poll. Woken now at the
-- commit, it looks for the next run_at again and sleeps until the retry's.

-- fail_v3 (sql/005), then a notification for the queues of the jobs it put back in the queue,
-- to the workers that wait for them (notifyq.notify_queues_v1: none while every worker is busy).
CREATE FUNCTION notifyq.fail_v4(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_errors text[], p_retryable boolean[],
    p_delays float8[]
) RETURNS TABLE(id uuid, status text)
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
        PERFORM notifyq.notify_queues_v1(ARRAY(SELECT DISTINCT j.queue FROM notifyq.jobs AS j
                                               WHERE j.id = ANY(v_rows.again)));
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses);
END;
$$;
