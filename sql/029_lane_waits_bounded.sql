-- notifyq schema, version 29: a claim waits for a held lane a second at most.
--
-- A claim of a fair queue that finds every lane held waits for the first in line (sql/026, up to
-- eight times), which claims hold for a few milliseconds. But a lane's row can be held by other
-- transactions than claims: a producer whose insert reopened the lane (open_lanes_v1's ON
-- CONFLICT DO UPDATE, when the lane went idle between the claim's two looks, or raced with the
-- leader's tend_lanes_v1) holds it until that producer commits, which for a long import may be
-- minutes. The claim waited all that time, its worker's producer with it, and the jobs it had
-- locked in the levels before stayed out of every other claim's reach. Now the wait runs with a
-- lock_timeout of one second (notifyq.wait_for_lane_v1): a lane held longer than that is not
-- another claim's, and the claim leaves the level with what it has.

CREATE FUNCTION notifyq.wait_for_lane_v1(p_queue text, p_priority integer, p_key text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '1s'
AS $$
BEGIN
    PERFORM 1 FROM notifyq.fair_lanes AS l
    WHERE l.queue = p_queue AND l.priority = p_priority AND l.fair_key = p_key
    FOR NO KEY UPDATE;
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END;
$$;

-- claim_fair_v1 (sql/027), whose wait for a held lane is wait_for_lane_v1.
CREATE OR REPLACE FUNCTION notifyq.claim_fair_v1(
    p_queue text,
    p_priority integer,
    p_floor_run_at timestamptz,
    p_floor_id uuid,
    p_tasks text[],
    p_skip text[],
    p_limit integer
) RETURNS uuid[]
LANGUAGE plpgsql
-- The plan settings are claim_v4's, its only caller: a SET clause here would be saved and
-- restored at every call.
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids uuid[] := '{}';
    v_tried text[] := '{}';
    v_waits integer := 0;
    v_first text;
    v_low float8;
    v_keys text[];
    v_starts float8[];
    v_weights float8[];
    v_fruns timestamptz[];
    v_fids uuid[];
    v_took integer[];
    v_dry boolean[];
    v_left integer;
    v_round record;
    v_lane record;
    v_at integer;
    v_kc_tasks text[];
    v_kc_limits integer[];
    v_not text[];
    v_started jsonb := '{}';
    v_pair text;
    v_room integer;
    v_more uuid[];
    v_batch integer;
    v_moved text[];
    v_turns float8[];
    v_empty text[];
BEGIN
    SELECT array_agg(t.name), array_agg(t.key_concurrency) INTO v_kc_tasks, v_kc_limits
    FROM notifyq.tasks AS t
    WHERE t.name = ANY(p_tasks) AND t.key_concurrency IS NOT NULL AND t.name <> ALL(p_skip);
    v_not := p_skip || coalesce(v_kc_tasks, '{}');

    LOOP
        -- The lanes this claim holds: the first p_limit open ones, lowest turn first, that no
        -- other claim holds, each with where its jobs start (the higher of the level's floor and
        -- the lane's own); a new lane's turn is set below.
        SELECT array_agg(h.fair_key ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST,
                                             h.fair_key),
               array_agg(h.turn ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST,
                                         h.fair_key),
               array_agg(coalesce(w.weight, 1)
                         ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST, h.fair_key),
               array_agg(CASE WHEN (f.run_at, f.id) > (p_floor_run_at, p_floor_id)
                              THEN f.run_at ELSE p_floor_run_at END
                         ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST, h.fair_key),
               array_agg(CASE WHEN (f.run_at, f.id) > (p_floor_run_at, p_floor_id)
                              THEN f.id ELSE p_floor_id END
                         ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST, h.fair_key)
        INTO v_keys, v_starts, v_weights, v_fruns, v_fids
        FROM (SELECT l.fair_key, l.turn, l.served_at FROM notifyq.fair_lanes AS l
              WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
                AND l.fair_key <> ALL(v_tried)
              ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
              LIMIT p_limit
              FOR NO KEY UPDATE OF l SKIP LOCKED) AS h
        LEFT JOIN notifyq.fair_weights AS w ON w.fair_key = h.fair_key
        LEFT JOIN notifyq.lane_floors AS f
          ON f.queue = p_queue AND f.priority = p_priority AND f.fair_key = h.fair_key;
        IF v_keys IS NULL THEN
            -- Every open lane is another claim's now (or none is left): before it has served
            -- any, this claim waits for the first in line, then looks again. Claims are short,
            -- and a claim that left here empty-handed would put its worker to sleep until its
            -- next poll while the lanes still hold work; a lane held past a second is not a
            -- claim's, and the claim leaves the level.
            EXIT WHEN cardinality(v_tried) > 0 OR v_waits >= 8;
            SELECT l.fair_key INTO v_first FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
            ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
            LIMIT 1;
            EXIT WHEN v_first IS NULL
                   OR NOT notifyq.wait_for_lane_v1(p_queue, p_priority, v_first);
            v_waits := v_waits + 1;
            CONTINUE;
        END IF;
        IF array_position(v_starts, NULL) IS NOT NULL THEN
            -- A new lane starts level with the lowest turn of the open lanes, held or not.
            IF v_low IS NULL THEN
                SELECT min(l.turn) INTO v_low FROM notifyq.fair_lanes AS l
                WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL;
                v_low := coalesce(v_low, 0);
            END IF;
            v_starts := ARRAY(SELECT coalesce(t, v_low)
                              FROM unnest(v_starts) WITH ORDINALITY AS u(t, o) ORDER BY o);
        END IF;
        v_batch := cardinality(v_keys);
        v_tried := v_tried || v_keys;
        v_took := array_fill(0, ARRAY[v_batch]);
        v_dry := array_fill(false, ARRAY[v_batch]);

        FOR v_r IN 1..v_batch LOOP
            v_left := p_limit - cardinality(v_ids);
            -- One round, one statement: each held lane's share (the v_left lowest turns, ranked
            -- only below where the shares end: the level the turns would reach were the jobs
            -- left poured over every lane at once, above the true one, and never later than
            -- the last job the lane first in line would give alone), its jobs locked, and what
            -- each lane gave; a lane that gave less than its share is dry for this claim.
            WITH lanes AS (
                SELECT l.fair_key, l.start, l.weight, l.took, l.o, l.frun, l.fid
                FROM unnest(v_keys, v_starts, v_weights, v_took, v_dry, v_fruns, v_fids)
                     WITH ORDINALITY AS l(fair_key, start, weight, took, dry, frun, fid, o)
                WHERE NOT l.dry
            ), edge AS (
                SELECT least(min(l.start + (l.took + v_left - 1) / l.weight),
                             (v_left + sum(l.took + l.start * l.weight)) / sum(l.weight) + 1)
                       AS e
                FROM lanes AS l
            ), ask AS (
                SELECT s.fair_key, s.frun, s.fid, count(*)::integer AS n
                FROM (SELECT l.fair_key, l.frun, l.fid
                      FROM lanes AS l
                      CROSS JOIN edge
                      CROSS JOIN LATERAL generate_series(
                          0, least(v_left - 1,
                                   greatest(floor((edge.e - l.start) * l.weight) - l.took, 0)
                                   ::integer + 1)) AS g(i)
                      ORDER BY l.start + (l.took + g.i) / l.weight, l.o
                      LIMIT v_left) AS s
                GROUP BY s.fair_key, s.frun, s.fid
            ), got AS (
                SELECT c.id, a.fair_key
                FROM ask AS a
                CROSS JOIN LATERAL (
                    SELECT j.id FROM ONLY notifyq.jobs AS j
                    WHERE j.queue = p_queue AND j.priority = p_priority
                      AND j.fair_key = a.fair_key
                      AND (j.run_at, j.id) >= (a.frun, a.fid)
                      AND j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
                      AND j.id <> ALL(v_ids)
                      AND j.task = ANY(p_tasks) AND j.task <> ALL(v_not)
                    ORDER BY j.run_at, j.id
                    LIMIT a.n
                    FOR NO KEY UPDATE SKIP LOCKED) AS c
                WHERE a.fair_key <> ''
                UNION ALL
                SELECT c.id, a.fair_key
                FROM ask AS a
                CROSS JOIN LATERAL (
                    SELECT j.id FROM ONLY notifyq.jobs AS j
                    WHERE j.queue = p_queue AND j.priority = p_priority
                      AND (j.run_at, j.id) >= (p_floor_run_at, p_floor_id)
                      AND j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
                      AND j.id <> ALL(v_ids)
                      AND j.fair_key IS NULL
                      AND j.task = ANY(p_tasks) AND j.task <> ALL(p_skip)
                    ORDER BY j.run_at, j.id
                    LIMIT a.n
                    FOR NO KEY UPDATE SKIP LOCKED) AS c
                WHERE a.fair_key = ''
            ), gave AS (
                SELECT a.fair_key, a.n AS asked, count(g.id)::integer AS n
                FROM ask AS a
                LEFT JOIN got AS g ON g.fair_key = a.fair_key
                GROUP BY a.fair_key, a.n
            )
            SELECT (SELECT array_agg(g.id) FROM got AS g) AS ids,
                   (SELECT array_agg(v.fair_key) FROM gave AS v WHERE v.n < v.asked) AS short_keys,
                   (SELECT array_agg(v.asked - v.n) FROM gave AS v WHERE v.n < v.asked)
                       AS short_ns,
                   (SELECT array_agg(l.took + coalesce(v.n, 0) ORDER BY l.o)
                    FROM unnest(v_keys, v_took) WITH ORDINALITY AS l(fair_key, took, o)
                    LEFT JOIN gave AS v ON v.fair_key = l.fair_key) AS took,
                   (SELECT array_agg(l.dry OR coalesce(v.n < v.asked, false) ORDER BY l.o)
                    FROM unnest(v_keys, v_dry) WITH ORDINALITY AS l(fair_key, dry, o)
                    LEFT JOIN gave AS v ON v.fair_key = l.fair_key) AS dry,
                   EXISTS (SELECT 1 FROM ask) AS asked
            INTO v_round;
            EXIT WHEN NOT v_round.asked;
            v_ids := v_ids || coalesce(v_round.ids, '{}');
            v_took := v_round.took;
            v_dry := v_round.dry;

            IF v_kc_tasks IS NOT NULL AND v_round.short_keys IS NOT NULL THEN
                -- What each keyed lane still owes of its share, from its key-limited tasks.
                FOR v_lane IN
                    SELECT k.fair_key, k.need
                    FROM unnest(v_round.short_keys, v_round.short_ns) AS k(fair_key, need)
                    WHERE k.fair_key <> ''
                LOOP
                    v_at := array_position(v_keys, v_lane.fair_key);
                    FOR v_i IN 1..cardinality(v_kc_tasks) LOOP
                        EXIT WHEN v_lane.need <= 0;
                        v_pair := v_kc_tasks[v_i] || E'\x1f' || v_lane.fair_key;
                        CONTINUE WHEN NOT pg_try_advisory_xact_lock(
                            hashtextextended('notifyq.key_concurrency' || E'\x1f' || v_pair, 0));
                        v_room := v_kc_limits[v_i] - coalesce((v_started ->> v_pair)::integer, 0)
                                  - (SELECT count(*) FROM ONLY notifyq.jobs AS j
                                     WHERE j.status = 'processing' AND j.task = v_kc_tasks[v_i]
                                       AND j.fair_key = v_lane.fair_key)::integer;
                        CONTINUE WHEN v_room <= 0;
                        v_more := ARRAY(
                            SELECT j.id FROM ONLY notifyq.jobs AS j
                            WHERE j.queue = p_queue AND j.priority = p_priority
                              AND j.fair_key = v_lane.fair_key
                              AND (j.run_at, j.id) >= (v_fruns[v_at], v_fids[v_at])
                              AND j.status = 'queued' AND NOT j.group_blocked
                              AND j.run_at <= now() AND j.task = v_kc_tasks[v_i]
                              AND j.id <> ALL(v_ids)
                            ORDER BY j.run_at, j.id
                            LIMIT least(v_room, v_lane.need)
                            FOR NO KEY UPDATE SKIP LOCKED);
                        IF cardinality(v_more) > 0 THEN
                            v_ids := v_ids || v_more;
                            v_took[v_at] := v_took[v_at] + cardinality(v_more);
                            v_started := v_started || jsonb_build_object(
                                v_pair, coalesce((v_started ->> v_pair)::integer, 0)
                                        + cardinality(v_more));
                            v_lane.need := v_lane.need - cardinality(v_more);
                        END IF;
                    END LOOP;
                    IF v_lane.need <= 0 THEN
                        -- Its share made up: the lane is not dry.
                        v_dry[v_at] := false;
                    END IF;
                END LOOP;
            END IF;
            EXIT WHEN cardinality(v_ids) >= p_limit OR false <> ALL(v_dry);
        END LOOP;

        -- The held lanes' turns move on by what each gave; one that gave nothing goes to the
        -- back of its level (the highest turn there), or becomes idle if it has nothing queued
        -- at all. (The rows are found by key and their values by place in the arrays: a join
        -- with the arrays was planned as a loop over them for every lane of the level.)
        SELECT array_agg(k.fair_key),
               array_agg(CASE WHEN k.took > 0 THEN k.start + k.took / k.weight
                              ELSE greatest((SELECT max(l.turn) FROM notifyq.fair_lanes AS l
                                             WHERE l.queue = p_queue
                                               AND l.priority = p_priority
                                               AND l.idle_since IS NULL), k.start) END),
               array_agg(k.fair_key) FILTER (WHERE k.took = 0)
        INTO v_moved, v_turns, v_empty
        FROM unnest(v_keys, v_starts, v_weights, v_took, v_dry)
             AS k(fair_key, start, weight, took, dry)
        WHERE k.took > 0 OR k.dry;
        IF v_moved IS NOT NULL THEN
            UPDATE notifyq.fair_lanes AS l
            SET turn = v_turns[array_position(v_moved, l.fair_key)],
                served_at = CASE WHEN l.fair_key = ANY(coalesce(v_empty, '{}')) THEN l.served_at
                                 ELSE now() END,
                idle_since = CASE
                    WHEN l.fair_key <> ALL(coalesce(v_empty, '{}')) THEN NULL
                    WHEN l.fair_key <> '' AND NOT EXISTS (
                        SELECT 1 FROM ONLY notifyq.jobs AS j
                        WHERE j.queue = p_queue AND j.priority = p_priority
                          AND j.fair_key = l.fair_key
                          AND (j.run_at, j.id)
                              >= (v_fruns[array_position(v_keys, l.fair_key)],
                                  v_fids[array_position(v_keys, l.fair_key)])
                          AND j.status = 'queued' AND NOT j.group_blocked) THEN now()
                    WHEN l.fair_key = '' AND NOT EXISTS (
                        SELECT 1 FROM ONLY notifyq.jobs AS j
                        WHERE j.queue = p_queue AND j.priority = p_priority
                          AND (j.run_at, j.id) >= (p_floor_run_at, p_floor_id)
                          AND j.status = 'queued' AND NOT j.group_blocked
                          AND j.fair_key IS NULL) THEN now()
                    END
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.fair_key = ANY(v_moved);
        END IF;
        EXIT WHEN cardinality(v_ids) >= p_limit OR v_batch < p_limit;
    END LOOP;
    RETURN v_ids;
END;
$$;

REVOKE EXECUTE ON FUNCTION notifyq.wait_for_lane_v1(text, integer, text) FROM PUBLIC;

-- Roles granted before this version (notifyq grant) keep working: a worker role (it may update
-- jobs) gets the new function.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.rolname
        FROM pg_roles AS a
        WHERE NOT a.rolsuper AND a.rolname !~ '^pg_'
          AND a.oid <> (SELECT c.relowner FROM pg_class AS c
                        WHERE c.oid = 'notifyq.jobs'::regclass)
          AND has_table_privilege(a.oid, 'notifyq.jobs', 'UPDATE')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.wait_for_lane_v1(text, integer, text) '
                       'TO %I', r.rolname);
    END LOOP;
END;
$$;
