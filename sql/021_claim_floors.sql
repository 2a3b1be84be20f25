-- notifyq schema, version 21: claims that start where the queue starts, whatever a long
-- transaction elsewhere leaves behind.
--
-- A claim walks the claim index from its head, and at its head lie the entries of the jobs
-- claimed before: their rows are dead, and a scan steps over each, fetching its row to see so.
-- Vacuum removes them, and each scan that finds a row dead to every transaction marks its
-- entry so that the next skips it without a fetch. A transaction that holds an old snapshot
-- (a report left open, a REPEATABLE READ session, a standby with hot_standby_feedback) stops
-- both: every job claimed since it began stays in the way of every claim, and at 1,000 jobs a
-- second a claim read tens of thousands of dead rows within a minute (the bench's horizon
-- scenario: pickup p99 x5.6 in 30 s, and more than 160 s after ten minutes in version 19).
--
-- Now each queue and priority has a floor: a key (run_at, id) at or before every job of it
-- that a claim may take. A claim starts each of its scans at the floor, with an index range
-- condition, and so steps over only the dead entries behind it. The floor is only a lower
-- bound, so claims stay right whoever moves it:
--   - it goes down at once when a job becomes claimable below it: the insert's statement
--     trigger (one aggregate of the inserted rows) and a row trigger on what a requeue, an
--     unblocked group member or a released dependent changes. A job inserted or requeued now
--     is never below it (its run_at is now() or later; see the next point), so in the common
--     case nothing is written and no row is locked;
--   - it goes up only when the maintenance leader moves it, in two passes: one proposes the
--     first claimable job's key (at most its own now()), written with the snapshot's next
--     transaction id once that proposal is visible (seal_floors_v1); the next applies it once
--     every transaction that had an id then has ended (they may have written jobs that the
--     proposal did not see), taking the lower of it and the first claimable job then. A
--     transaction that writes its first job later finds the proposal in place, and lowers it.
--     A long transaction that has written something holds the floors of every queue where
--     they are (as it held back vacuum before); one that only reads holds nothing.
--
-- The floors also name every queue and priority that has jobs, so the claim of a worker that
-- serves every queue walks the index by queue, and the index that ordered the whole queue by
-- priority and run_at goes (an entry an insert wrote, and one index less to keep).

CREATE TABLE notifyq.claim_floors (
    queue text NOT NULL,
    priority integer NOT NULL,
    -- Every job of (queue, priority) that a claim may take sorts at or after (run_at, id).
    run_at timestamptz NOT NULL,
    id uuid NOT NULL,
    -- The raise proposed by the last pass of the maintenance leader, and (once sealed) the
    -- transaction id from which on it may be applied.
    next_run_at timestamptz,
    next_id uuid,
    next_after xid8,
    PRIMARY KEY (queue, priority)
) WITH (fillfactor = 50);

-- The floors of the jobs there are now: the earliest run_at of each queue and priority, with
-- the least id, so that every job of it is at or after it.
INSERT INTO notifyq.claim_floors (queue, priority, run_at, id)
SELECT queue, priority, min(run_at), '00000000-0000-0000-0000-000000000000'
FROM ONLY notifyq.jobs
WHERE status IN ('waiting', 'queued', 'processing')
GROUP BY queue, priority;

-- Lowers the floors of the given levels to the given run_ats (with the least id) where they
-- are above, the proposals too, and makes the floors of levels that have none. It writes, and
-- locks a floor's row, only when a floor or a proposal must move down.
CREATE FUNCTION notifyq.lower_floors_v1(
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_queues, p_priorities) AS k(queue, priority)
               WHERE NOT EXISTS (SELECT 1 FROM notifyq.claim_floors AS f
                                 WHERE f.queue = k.queue AND f.priority = k.priority)) THEN
        INSERT INTO notifyq.claim_floors (queue, priority, run_at, id)
        SELECT k.queue, k.priority, min(k.run_at), '00000000-0000-0000-0000-000000000000'
        FROM unnest(p_queues, p_priorities, p_run_ats) AS k(queue, priority, run_at)
        GROUP BY k.queue, k.priority
        ON CONFLICT (queue, priority) DO NOTHING;
    END IF;
    UPDATE notifyq.claim_floors AS f
    SET run_at = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                      THEN m.run_at ELSE f.run_at END,
        id = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                  THEN '00000000-0000-0000-0000-000000000000' ELSE f.id END,
        next_run_at = CASE WHEN (f.next_run_at, f.next_id)
                                > (m.run_at, '00000000-0000-0000-0000-000000000000')
                           THEN m.run_at ELSE f.next_run_at END,
        next_id = CASE WHEN (f.next_run_at, f.next_id)
                            > (m.run_at, '00000000-0000-0000-0000-000000000000')
                       THEN '00000000-0000-0000-0000-000000000000' ELSE f.next_id END
    FROM (SELECT k.queue, k.priority, min(k.run_at) AS run_at
          FROM unnest(p_queues, p_priorities, p_run_ats) AS k(queue, priority, run_at)
          GROUP BY k.queue, k.priority) AS m
    WHERE f.queue = m.queue AND f.priority = m.priority
      AND ((f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
           OR (f.next_run_at, f.next_id) > (m.run_at, '00000000-0000-0000-0000-000000000000'));
END;
$$;

-- The floors of the jobs an INSERT makes claimable: one aggregate of the inserted rows, in a
-- statement trigger of its own (the notification's, jobs_notify_inserted, reads them only
-- while a worker waits, and may be switched off).
CREATE FUNCTION notifyq.floors_inserted_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_levels record;
BEGIN
    SELECT array_agg(l.queue) AS queues, array_agg(l.priority) AS priorities,
           array_agg(l.run_at) AS run_ats
    INTO v_levels
    FROM (SELECT i.queue, i.priority, min(i.run_at) AS run_at FROM inserted AS i
          WHERE i.status = 'queued' AND NOT i.group_blocked
          GROUP BY i.queue, i.priority) AS l;
    IF v_levels.queues IS NOT NULL THEN
        PERFORM notifyq.lower_floors_v1(v_levels.queues, v_levels.priorities, v_levels.run_ats);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_floors AFTER INSERT ON notifyq.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION notifyq.floors_inserted_v1();

-- A job that an UPDATE makes claimable, or moves to another place in the claim order: a
-- requeue (a retry, a release, a rescue, a snooze), a dependent whose parents completed, the
-- next member of a group, a duplicate's replacement, a change by hand. A claim (queued to
-- processing) is not one: its WHEN is false, evaluated without a call.
CREATE FUNCTION notifyq.floor_requeued_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM notifyq.lower_floors_v1(ARRAY[NEW.queue], ARRAY[NEW.priority], ARRAY[NEW.run_at]);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_floor AFTER UPDATE OF status, queue, priority, run_at, group_blocked
    ON notifyq.jobs FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NOT NEW.group_blocked
          AND (OLD.status <> 'queued' OR OLD.group_blocked OR OLD.queue <> NEW.queue
               OR OLD.priority <> NEW.priority OR NEW.run_at < OLD.run_at))
    EXECUTE FUNCTION notifyq.floor_requeued_v1();

-- The maintenance leader's pass, one statement of two (seal_floors_v1 is the other). Applies
-- the proposals sealed by the last pass whose transactions have all ended, then proposes the
-- next raise for each floor that has none: the key of its first claimable job, or this
-- transaction's now() if that is earlier (a job inserted after now() runs at now() or later).
-- Each write is made only if the floor's row is as it was read (a trigger that lowered it
-- meanwhile wins). Answers the floors raised.
CREATE FUNCTION notifyq.raise_floors_v1() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_raised integer;
BEGIN
    WITH due AS (
        SELECT f.queue, f.priority, f.run_at, f.id, f.next_run_at, f.next_id,
               CASE WHEN c.run_at IS NOT NULL AND (c.run_at, c.id) < (f.next_run_at, f.next_id)
                    THEN c.run_at ELSE f.next_run_at END AS new_run_at,
               CASE WHEN c.run_at IS NOT NULL AND (c.run_at, c.id) < (f.next_run_at, f.next_id)
                    THEN c.id ELSE f.next_id END AS new_id
        FROM notifyq.claim_floors AS f
        LEFT JOIN LATERAL (
            SELECT j.run_at, j.id FROM ONLY notifyq.jobs AS j
            WHERE j.queue = f.queue AND j.priority = f.priority
              AND j.status = 'queued' AND NOT j.group_blocked
              AND (j.run_at, j.id) >= (f.run_at, f.id)
            ORDER BY j.run_at, j.id
            LIMIT 1) AS c ON true
        WHERE f.next_after IS NOT NULL
          AND f.next_after <= pg_snapshot_xmin(pg_current_snapshot())
    )
    UPDATE notifyq.claim_floors AS f
    SET run_at = d.new_run_at, id = d.new_id,
        next_run_at = NULL, next_id = NULL, next_after = NULL
    FROM due AS d
    WHERE f.queue = d.queue AND f.priority = d.priority
      AND f.run_at = d.run_at AND f.id = d.id
      AND f.next_run_at = d.next_run_at AND f.next_id = d.next_id
      AND (d.new_run_at, d.new_id) >= (f.run_at, f.id);
    GET DIAGNOSTICS v_raised = ROW_COUNT;

    WITH proposed AS (
        SELECT f.queue, f.priority, f.run_at, f.id,
               CASE WHEN c.run_at IS NOT NULL
                         AND (c.run_at, c.id) < (now(), '00000000-0000-0000-0000-000000000000')
                    THEN c.run_at ELSE now() END AS next_run_at,
               CASE WHEN c.run_at IS NOT NULL
                         AND (c.run_at, c.id) < (now(), '00000000-0000-0000-0000-000000000000')
                    THEN c.id ELSE '00000000-0000-0000-0000-000000000000'::uuid END AS next_id
        FROM notifyq.claim_floors AS f
        LEFT JOIN LATERAL (
            SELECT j.run_at, j.id FROM ONLY notifyq.jobs AS j
            WHERE j.queue = f.queue AND j.priority = f.priority
              AND j.status = 'queued' AND NOT j.group_blocked
              AND (j.run_at, j.id) >= (f.run_at, f.id)
            ORDER BY j.run_at, j.id
            LIMIT 1) AS c ON true
        WHERE f.next_run_at IS NULL
    )
    UPDATE notifyq.claim_floors AS f
    SET next_run_at = p.next_run_at, next_id = p.next_id, next_after = NULL
    FROM proposed AS p
    WHERE f.queue = p.queue AND f.priority = p.priority
      AND f.run_at = p.run_at AND f.id = p.id AND f.next_run_at IS NULL
      AND (p.next_run_at, p.next_id) > (f.run_at, f.id);
    RETURN v_raised;
END;
$$;

-- The net under the floors, which the leader casts every minute: the first claimable job of
-- every queue and priority in the queue (a walk of the claim index, one step a level), and
-- each floor lowered to it where it is above, or made where there is none. Every way a job
-- becomes claimable lowers its floor already; this catches one that a trigger switched off by
-- hand let through. Answers the floors made or lowered.
CREATE FUNCTION notifyq.mend_floors_v1() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_found record;
    v_mended integer;
BEGIN
    WITH RECURSIVE levels AS (
        (SELECT j.queue, j.priority, j.run_at FROM ONLY notifyq.jobs AS j
         WHERE j.status = 'queued' AND NOT j.group_blocked
         ORDER BY j.queue, j.priority DESC, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT n.queue, n.priority, n.run_at
        FROM levels AS l
        CROSS JOIN LATERAL (
            -- The next priority of the same queue, else the next queue: two index ranges, the
            -- second read only when the first has nothing.
            (SELECT j.queue, j.priority, j.run_at FROM ONLY notifyq.jobs AS j
             WHERE j.status = 'queued' AND NOT j.group_blocked
               AND j.queue = l.queue AND j.priority < l.priority
             ORDER BY j.queue, j.priority DESC, j.run_at, j.id LIMIT 1)
            UNION ALL
            (SELECT j.queue, j.priority, j.run_at FROM ONLY notifyq.jobs AS j
             WHERE j.status = 'queued' AND NOT j.group_blocked AND j.queue > l.queue
             ORDER BY j.queue, j.priority DESC, j.run_at, j.id LIMIT 1)
            LIMIT 1) AS n
    )
    SELECT array_agg(l.queue) AS queues, array_agg(l.priority) AS priorities,
           array_agg(l.run_at) AS run_ats,
           count(*) FILTER (WHERE f.queue IS NULL OR f.run_at > l.run_at) AS below
    INTO v_found
    FROM levels AS l
    LEFT JOIN notifyq.claim_floors AS f ON f.queue = l.queue AND f.priority = l.priority;
    v_mended := coalesce(v_found.below, 0)::integer;
    IF v_mended > 0 THEN
        PERFORM notifyq.lower_floors_v1(v_found.queues, v_found.priorities, v_found.run_ats);
    END IF;
    RETURN v_mended;
END;
$$;

-- The other statement of the pass, in a transaction of its own after raise_floors_v1 commits:
-- the proposals are visible now to every transaction that writes a job from here on, and the
-- ones that wrote before (their ids are below this snapshot's next id) must end before they
-- apply.
CREATE FUNCTION notifyq.seal_floors_v1() RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH sealed AS (
        UPDATE notifyq.claim_floors
        SET next_after = pg_snapshot_xmax(pg_current_snapshot())
        WHERE next_run_at IS NOT NULL AND next_after IS NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM sealed;
$$;

-- claim_v4 (sql/020) from the floors: for each priority from the highest, the queues' scans
-- start at their floors (an index range condition), and the priority's candidates are taken
-- in run_at order across its queues. Same arguments, answers and plan settings.
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
DECLARE
    v_ids uuid[] := ARRAY[]::uuid[];
    v_left integer := p_limit;
    v_priority integer;
BEGIN
    FOR v_priority IN
        SELECT DISTINCT f.priority FROM notifyq.claim_floors AS f
        WHERE p_queues IS NULL OR f.queue = ANY(p_queues)
        ORDER BY 1 DESC
    LOOP
        v_ids := v_ids || ARRAY(
            SELECT c.id
            FROM notifyq.claim_floors AS f
            CROSS JOIN LATERAL (
                SELECT j.id, j.run_at
                FROM ONLY notifyq.jobs AS j
                WHERE j.queue = f.queue AND j.priority = f.priority
                  AND (j.run_at, j.id) >= (f.run_at, f.id)
                  AND j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
                  AND j.task = ANY(p_tasks)
                  AND (p_probe OR j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                                 WHERE t.breaker_open_until IS NOT NULL))
                  AND j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                     WHERE t.max_concurrency IS NOT NULL
                                        OR t.rate_limit IS NOT NULL)
                ORDER BY j.run_at, j.id
                LIMIT v_left
                FOR NO KEY UPDATE SKIP LOCKED) AS c
            WHERE f.priority = v_priority
              AND (p_queues IS NULL OR f.queue = ANY(p_queues))
              AND f.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                  WHERE q.paused OR q.rate_limit IS NOT NULL)
            ORDER BY c.run_at, c.id
            LIMIT v_left);
        v_left := p_limit - cardinality(v_ids);
        EXIT WHEN v_left <= 0;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE ONLY notifyq.jobs AS j
    SET status = 'processing', attempt_count = j.attempt_count + 1, claims = j.claims + 1,
        started_at = now(), finished_at = NULL, heartbeat_at = NULL, progress = NULL,
        worker_id = p_worker_id, lease_expires_at = now() + make_interval(secs => p_lease)
    WHERE j.id = ANY(v_ids)
    RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
              j.claims, date_part('epoch', j.created_at), date_part('epoch', j.run_at),
              CASE WHEN cardinality(j.depends_on) > 0 THEN
                  (SELECT jsonb_object_agg(p.id::text, p.result) FROM notifyq.jobs_done AS p
                   WHERE p.id = ANY(j.depends_on))
              END,
              j.trace_context;
    -- Watchers are told of the start (Queue.wait, GET /jobs/{id}/events); none, the usual
    -- case, costs one look at an empty table.
    IF EXISTS (SELECT 1 FROM notifyq.watched_jobs) THEN
        PERFORM notifyq.announce_v1(v_ids);
    END IF;
END;
$$;

-- claim_limited_v4 (sql/020) from the floors too: its candidates are walked per queue and
-- priority from their floors (the index that ordered the whole queue is gone).
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
        SELECT c.id, c.task, c.queue
        FROM notifyq.claim_floors AS f
        CROSS JOIN LATERAL (
            SELECT j.id, j.task, j.queue, j.priority, j.run_at
            FROM ONLY notifyq.jobs AS j
            WHERE j.queue = f.queue AND j.priority = f.priority
              AND (j.run_at, j.id) >= (f.run_at, f.id)
              AND j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
              AND j.task = ANY(p_tasks)
              AND (v_task_room ? j.task OR v_queue_room ? j.queue)
              AND j.task NOT IN (SELECT name FROM notifyq.tasks
                                 WHERE breaker_open_until IS NOT NULL
                                    OR ((max_concurrency IS NOT NULL OR rate_limit IS NOT NULL)
                                        AND NOT v_task_room ? name))
            ORDER BY j.run_at, j.id
            LIMIT greatest(p_limit * 4, 100)
            FOR NO KEY UPDATE SKIP LOCKED) AS c
        WHERE (p_queues IS NULL OR f.queue = ANY(p_queues))
          AND f.queue NOT IN (SELECT name FROM notifyq.queues WHERE paused)
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT greatest(p_limit * 4, 100)
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

-- Every claim starts at its queue's floors now, by queue: the index of the whole queue by
-- priority and run_at served nothing else.
DROP INDEX notifyq.jobs_claim_idx;

-- Roles granted privileges on notifyq.jobs (`notifyq grant`, or version 20's copy of them) get
-- the same on the floors, which a worker's claim reads and its leader writes.
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
        EXECUTE format('GRANT %s ON notifyq.claim_floors TO %I', r.privileges, r.grantee);
    END LOOP;
END;
$$;
