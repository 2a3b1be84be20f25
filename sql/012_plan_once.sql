-- notifyq schema, version 12: the worker's statements plan once per connection, and a completion
-- that starts the jobs it unblocked wakes no one.
--
-- PostgreSQL plans a plpgsql statement with parameters anew at each of its first five runs, and
-- then keeps doing so for good when the generic plan's estimate looks costlier than the custom
-- ones (the arrays of ids these functions take make it look so): the claim and the completion
-- statements spent a good part of their time planning. They run with plan_cache_mode =
-- force_generic_plan now: one plan per connection. Their plans do not depend on the values (every
-- one finds its rows through an index by id, by status or by dependency; the functions already
-- turn sequential scans off). A completion that unblocks a dependent and claims it took a quarter
-- to a third less time, side by side on one machine; batches of 50 took the same.
--
-- Until now the statement that completes a parent queued its dependents and notified their
-- queues, and then, in the same statement, its own claim took them: every idle worker (this one
-- included) woke at the commit to claim nothing. The queues of jobs that became claimable are now
-- notified after the claim, only for those still queued. And the producer's question "when is
-- the next job due", asked before every sleep, is a plpgsql function: its plan is made once per
-- connection, not at every call as a SQL function with SET clauses is.
--
-- Only adds functions, and replaces the bodies of settle_v1 (now settle_v2 and the notification)
-- and complete_v3 (now write_completions_v1 and settle_v1) with the same behaviour: workers and
-- API processes of earlier versions keep working beside these.

-- What follows the end of these jobs, as settle_v1 said, without the notification of the queues
-- woken: answers each job that became claimable (a dependent queued, the next member of a group
-- that is queued), with its queue, for the caller to notify or to claim. The watchers of every
-- job changed are told here.
CREATE FUNCTION notifyq.settle_v2(p_ids uuid[], p_queues text[], p_group_keys text[])
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
        EXIT WHEN NOT EXISTS (SELECT 1 FROM notifyq.jobs AS c
                              WHERE c.status = 'waiting' AND c.depends_on <> '{}'
                                AND c.depends_on && v_ended);
        -- The waiting dependents are locked first, in id order, then their parents are looked
        -- at in statements of their own: see settle_v1 (sql/005).
        PERFORM 1 FROM notifyq.jobs AS c
        WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
        ORDER BY c.id FOR NO KEY UPDATE;
        -- Dependents with every job they need completed: queued (claimable unless a group
        -- holds them back).
        WITH ready AS (
            UPDATE notifyq.jobs AS c SET status = 'queued'
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
                   (SELECT p.id FROM notifyq.jobs AS p
                    WHERE p.id = ANY(c.depends_on) AND p.status IN ('failed', 'cancelled')
                    ORDER BY p.id LIMIT 1) AS cause
            FROM notifyq.jobs AS c
            WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
        ), cancelled AS (
            UPDATE notifyq.jobs AS c
            SET status = 'cancelled', finished_at = now(),
                last_error = format('cancelled: job %s, which it depends on, %s', d.cause,
                                    CASE WHEN p.status = 'failed' THEN 'failed'
                                         ELSE 'was cancelled' END)
            FROM doomed AS d JOIN notifyq.jobs AS p ON p.id = d.cause
            WHERE c.id = d.id AND d.cause IS NOT NULL
            RETURNING c.id, c.queue, c.group_key
        )
        SELECT coalesce(array_agg(x.id), '{}'),
               array_agg(x.queue) FILTER (WHERE x.group_key IS NOT NULL),
               array_agg(x.group_key) FILTER (WHERE x.group_key IS NOT NULL)
        INTO v_ended, v_queues, v_keys
        FROM cancelled AS x;
    END LOOP;
    PERFORM notifyq.announce_v1(v_told);
END;
$$;

-- settle_v1 (sql/005), now settle_v2 and the notification of the queues it woke.
CREATE OR REPLACE FUNCTION notifyq.settle_v1(p_ids uuid[], p_queues text[], p_group_keys text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM notifyq.notify_queues_v1(array_agg(s.queue))
    FROM notifyq.settle_v2(p_ids, p_queues, p_group_keys) AS s;
END;
$$;

-- What completing jobs writes, the one place that says it (complete_v3 and complete_and_claim_v2
-- call it): each job the worker still holds (the lease fence) becomes completed with its result,
-- and the circuit breakers of their tasks close. Answers the ids written and the (queue,
-- group_key) pairs of the grouped ones (NULL arrays when none was written), for settle_v2.
CREATE FUNCTION notifyq.write_completions_v1(
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

-- complete_v3 (sql/005), its writes now write_completions_v1's.
CREATE OR REPLACE FUNCTION notifyq.complete_v3(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[]
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
        PERFORM notifyq.settle_v1(v_done.ids, v_done.queues, v_done.group_keys);
        RETURN QUERY SELECT unnest(v_done.ids);
    END IF;
END;
$$;

-- complete_and_claim_v1 (sql/009), except that the queues of the jobs the completions made
-- claimable are notified after the claim, and only for those the claim left queued (no slot
-- free, a task or queue this worker does not serve, a limit): a dependent that starts here wakes
-- no other worker, and this one's own wake-up does not claim nothing right after.
CREATE FUNCTION notifyq.complete_and_claim_v2(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[],
    p_tasks text[], p_queues text[], p_take integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb,
                 trace_context jsonb)
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
        SELECT array_agg(s.id), array_agg(s.queue) INTO v_woken, v_woken_queues
        FROM notifyq.settle_v2(v_done.ids, v_done.queues, v_done.group_keys) AS s;
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
        JOIN notifyq.jobs AS j ON j.id = w.id
        WHERE j.status = 'queued';
    END IF;
END;
$$;

-- next_due_v2 (sql/005) in plpgsql: a worker asks it before every sleep, and the plan of a SQL
-- function with SET clauses is made again at every call (this one's took most of its time).
CREATE FUNCTION notifyq.next_due_v3(p_tasks text[], p_queues text[])
RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT extract(epoch FROM min(j.run_at) - now())::float8
            FROM notifyq.jobs AS j
            WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at > now()
              AND j.task = ANY(p_tasks)
              AND (p_queues IS NULL OR j.queue = ANY(p_queues)));
END;
$$;

-- The statements every claim and every outcome of a job runs: one plan per connection (see the
-- top of this file).
ALTER FUNCTION notifyq.claim_v4(text, text[], text[], integer, float8, boolean)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.claim_limited_v4(text, text[], text[], integer, float8)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.start_jobs_v3(text, uuid[], float8)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.fail_v3(text, uuid[], integer[], text[], boolean[], float8[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.advance_groups_v1(text[], text[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.beat_v1(text, uuid[], integer[], boolean[], float8)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.notify_queues_v1(text[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.announce_v1(uuid[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.release_v3(text, uuid[], integer[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION notifyq.snooze_v1(text, uuid[], integer[], float8[])
    SET plan_cache_mode = force_generic_plan;
