-- notifyq schema, version 27: each fair lane has a floor of its own.
--
-- A claim of a fair queue probes each lane it serves (jobs_fair_idx: queue, priority, fair_key,
-- run_at, id) from the claim floor of the queue and priority (sql/021): a key every claimable
-- job of the level sorts at or after. That floor is the level's lowest claimable job, so it
-- stays where the slowest lane is: a key of weight 1 beside one of weight 4, a key held at its
-- key_concurrency, a key whose jobs no worker serves. Every other lane's probe then steps over
-- the entries of all the jobs it gave since, one fetch each until vacuum or a later scan marks
-- them dead; behind a transaction that pins the xmin horizon neither can. Measured with the
-- claim alone (16 jobs a claim, the leader's passes every 0.2 s, a REPEATABLE READ transaction
-- open): beside a key whose jobs no worker serves, a claim took 3.5 ms, then 58 ms after 3,000
-- claims; keys of weights 4 and 1, 3.3 then 10 ms after 2,000. Four workers at once, whose
-- lanes move unevenly, read 6,600 to 9,900 buffers a claim statement.
--
-- Now each keyed lane has a floor too (notifyq.lane_floors), kept as the claim floors are: the
-- maintenance leader raises it in the same two passes (a proposal, applied once every
-- transaction that could still write below it has ended), the triggers of the insert and the
-- requeue lower it at once when a job becomes claimable below it (a write only then), and the
-- net of every minute removes one found above a claimable job. A lane without a row, or with
-- one below the level's floor, starts at the level's floor: a row is made at the lowest key and
-- raised from there. A claim probes each lane from the higher of the two floors. The lane ''
-- (jobs without a key) keeps the level's floor.

CREATE TABLE notifyq.lane_floors (
    queue text NOT NULL,
    priority integer NOT NULL,
    fair_key text NOT NULL,
    -- Every claimable job of (queue, priority, fair_key) sorts at or after (run_at, id).
    run_at timestamptz NOT NULL,
    id uuid NOT NULL,
    -- The raise proposed by the last pass of the maintenance leader, and (once sealed) the
    -- transaction id from which on it may be applied.
    next_run_at timestamptz,
    next_id uuid,
    next_after xid8,
    PRIMARY KEY (queue, priority, fair_key)
) WITH (fillfactor = 50);

-- Lowers the floors of the given lanes to the given run_ats (with the least id) where they are
-- above, the proposals too. It writes, and locks a floor's row, only when one must move down; a
-- lane without a row starts at its level's floor, which lower_floors_v1 lowers.
CREATE FUNCTION notifyq.lower_lane_floors_v1(
    p_queues text[],
    p_priorities integer[],
    p_keys text[],
    p_run_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    UPDATE notifyq.lane_floors AS f
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
    FROM (SELECT k.queue, k.priority, k.fair_key, min(k.run_at) AS run_at
          FROM unnest(p_queues, p_priorities, p_keys, p_run_ats)
               AS k(queue, priority, fair_key, run_at)
          GROUP BY k.queue, k.priority, k.fair_key) AS m
    WHERE f.queue = m.queue AND f.priority = m.priority AND f.fair_key = m.fair_key
      AND ((f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
           OR (f.next_run_at, f.next_id) > (m.run_at, '00000000-0000-0000-0000-000000000000'));
END;
$$;

-- floors_inserted_v1 (sql/024), which also lowers the floors of the keyed lanes it inserted
-- into when any lane has one: otherwise one more look, at an empty table.
CREATE OR REPLACE FUNCTION notifyq.floors_inserted_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_levels record;
BEGIN
    SELECT array_agg(l.queue) AS queues, array_agg(l.priority) AS priorities,
           array_agg(l.run_at) AS run_ats, bool_or(l.keyed) AS keyed
    INTO v_levels
    FROM (SELECT i.queue, i.priority, min(i.run_at) AS run_at,
                 bool_or(i.fair_key IS NOT NULL) AS keyed
          FROM inserted AS i
          WHERE i.status = 'queued' AND NOT i.group_blocked
          GROUP BY i.queue, i.priority) AS l;
    IF v_levels.queues IS NOT NULL THEN
        PERFORM notifyq.lower_floors_v1(v_levels.queues, v_levels.priorities, v_levels.run_ats);
        IF v_levels.keyed OR EXISTS (SELECT 1 FROM notifyq.fair_lanes) THEN
            PERFORM notifyq.open_lanes_v1(array_agg(k.queue), array_agg(k.priority),
                                          array_agg(k.fair_key))
            FROM (SELECT DISTINCT i.queue, i.priority, coalesce(i.fair_key, '') AS fair_key
                  FROM inserted AS i
                  WHERE i.status = 'queued' AND NOT i.group_blocked) AS k;
        END IF;
        IF v_levels.keyed AND EXISTS (SELECT 1 FROM notifyq.lane_floors) THEN
            PERFORM notifyq.lower_lane_floors_v1(array_agg(k.queue), array_agg(k.priority),
                                                 array_agg(k.fair_key), array_agg(k.run_at))
            FROM (SELECT i.queue, i.priority, i.fair_key, min(i.run_at) AS run_at
                  FROM inserted AS i
                  WHERE i.status = 'queued' AND NOT i.group_blocked AND i.fair_key IS NOT NULL
                  GROUP BY i.queue, i.priority, i.fair_key) AS k;
        END IF;
    END IF;
    RETURN NULL;
END;
$$;


-- floor_requeued_v1 (sql/024), which lowers the floor of the job's lane too.
CREATE OR REPLACE FUNCTION notifyq.floor_requeued_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM notifyq.lower_floors_v1(ARRAY[NEW.queue], ARRAY[NEW.priority], ARRAY[NEW.run_at]);
    IF NEW.fair_key IS NOT NULL OR EXISTS (SELECT 1 FROM notifyq.fair_lanes) THEN
        PERFORM notifyq.open_lanes_v1(ARRAY[NEW.queue], ARRAY[NEW.priority],
                                      ARRAY[coalesce(NEW.fair_key, '')]);
    END IF;
    IF NEW.fair_key IS NOT NULL AND EXISTS (SELECT 1 FROM notifyq.lane_floors) THEN
        PERFORM notifyq.lower_lane_floors_v1(ARRAY[NEW.queue], ARRAY[NEW.priority],
                                             ARRAY[NEW.fair_key], ARRAY[NEW.run_at]);
    END IF;
    RETURN NULL;
END;
$$;


-- The maintenance leader's pass (sql/021's raise_floors_v1, then the same for the lanes' floors):
-- applies each sealed proposal whose transactions have all ended (the lower of it and the
-- lane's first claimable job now), makes a row at the lowest key for each open keyed lane that
-- has none, proposes for each row without a proposal its lane's first claimable job (at most
-- its own now()), and removes the rows of lanes that are gone. A lane's probe starts at the
-- higher of its floor and its level's, as a claim's does (claims read the floors without a
-- lock: only a producer that lowers one holds its row). Answers the floors raised.
CREATE FUNCTION notifyq.raise_floors_v2() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_raised integer;
    v_lanes integer;
BEGIN
    v_raised := notifyq.raise_floors_v1();

    WITH due AS (
        SELECT f.queue, f.priority, f.fair_key, f.run_at, f.id, f.next_run_at, f.next_id,
               CASE WHEN c.run_at IS NOT NULL AND (c.run_at, c.id) < (f.next_run_at, f.next_id)
                    THEN c.run_at ELSE f.next_run_at END AS new_run_at,
               CASE WHEN c.run_at IS NOT NULL AND (c.run_at, c.id) < (f.next_run_at, f.next_id)
                    THEN c.id ELSE f.next_id END AS new_id
        FROM notifyq.lane_floors AS f
        JOIN notifyq.claim_floors AS g ON g.queue = f.queue AND g.priority = f.priority
        LEFT JOIN LATERAL (
            SELECT j.run_at, j.id FROM ONLY notifyq.jobs AS j
            WHERE j.queue = f.queue AND j.priority = f.priority AND j.fair_key = f.fair_key
              AND j.status = 'queued' AND NOT j.group_blocked
              AND (j.run_at, j.id)
                  >= (CASE WHEN (f.run_at, f.id) > (g.run_at, g.id) THEN f.run_at
                           ELSE g.run_at END,
                      CASE WHEN (f.run_at, f.id) > (g.run_at, g.id) THEN f.id ELSE g.id END)
            ORDER BY j.run_at, j.id
            LIMIT 1) AS c ON true
        WHERE f.next_after IS NOT NULL
          AND f.next_after <= pg_snapshot_xmin(pg_current_snapshot())
    )
    UPDATE notifyq.lane_floors AS f
    SET run_at = d.new_run_at, id = d.new_id,
        next_run_at = NULL, next_id = NULL, next_after = NULL
    FROM due AS d
    WHERE f.queue = d.queue AND f.priority = d.priority AND f.fair_key = d.fair_key
      AND f.run_at = d.run_at AND f.id = d.id
      AND f.next_run_at = d.next_run_at AND f.next_id = d.next_id
      AND (d.new_run_at, d.new_id) >= (f.run_at, f.id);
    GET DIAGNOSTICS v_lanes = ROW_COUNT;

    INSERT INTO notifyq.lane_floors AS f (queue, priority, fair_key, run_at, id)
    SELECT l.queue, l.priority, l.fair_key, '-infinity', '00000000-0000-0000-0000-000000000000'
    FROM notifyq.fair_lanes AS l
    WHERE l.idle_since IS NULL AND l.fair_key <> ''
      AND NOT EXISTS (SELECT 1 FROM notifyq.lane_floors AS o
                      WHERE o.queue = l.queue AND o.priority = l.priority
                        AND o.fair_key = l.fair_key)
    ON CONFLICT (queue, priority, fair_key) DO NOTHING;

    WITH proposed AS (
        SELECT f.queue, f.priority, f.fair_key, f.run_at, f.id,
               CASE WHEN c.run_at IS NOT NULL
                         AND (c.run_at, c.id) < (now(), '00000000-0000-0000-0000-000000000000')
                    THEN c.run_at ELSE now() END AS next_run_at,
               CASE WHEN c.run_at IS NOT NULL
                         AND (c.run_at, c.id) < (now(), '00000000-0000-0000-0000-000000000000')
                    THEN c.id ELSE '00000000-0000-0000-0000-000000000000'::uuid END AS next_id
        FROM notifyq.lane_floors AS f
        JOIN notifyq.claim_floors AS g ON g.queue = f.queue AND g.priority = f.priority
        LEFT JOIN LATERAL (
            SELECT j.run_at, j.id FROM ONLY notifyq.jobs AS j
            WHERE j.queue = f.queue AND j.priority = f.priority AND j.fair_key = f.fair_key
              AND j.status = 'queued' AND NOT j.group_blocked
              AND (j.run_at, j.id)
                  >= (CASE WHEN (f.run_at, f.id) > (g.run_at, g.id) THEN f.run_at
                           ELSE g.run_at END,
                      CASE WHEN (f.run_at, f.id) > (g.run_at, g.id) THEN f.id ELSE g.id END)
            ORDER BY j.run_at, j.id
            LIMIT 1) AS c ON true
        WHERE f.next_run_at IS NULL
    )
    UPDATE notifyq.lane_floors AS f
    SET next_run_at = p.next_run_at, next_id = p.next_id, next_after = NULL
    FROM proposed AS p
    WHERE f.queue = p.queue AND f.priority = p.priority AND f.fair_key = p.fair_key
      AND f.run_at = p.run_at AND f.id = p.id AND f.next_run_at IS NULL
      AND (p.next_run_at, p.next_id) > (f.run_at, f.id);

    DELETE FROM notifyq.lane_floors AS f
    WHERE NOT EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                      WHERE l.queue = f.queue AND l.priority = f.priority
                        AND l.fair_key = f.fair_key);
    RETURN v_raised + v_lanes;
END;
$$;

-- The proposals of the pass just committed, sealed with the next transaction id (sql/021's
-- seal_floors_v1, then the lanes'). Answers the proposals sealed.
CREATE FUNCTION notifyq.seal_floors_v2() RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH sealed AS (
        UPDATE notifyq.lane_floors
        SET next_after = pg_snapshot_xmax(pg_current_snapshot())
        WHERE next_run_at IS NOT NULL AND next_after IS NULL
        RETURNING 1
    )
    SELECT notifyq.seal_floors_v1() + (SELECT count(*)::integer FROM sealed);
$$;

-- The net under the floors, every minute (sql/021's mend_floors_v1, then the lanes'): a lane's
-- floor above one of its claimable jobs (a trigger switched off by hand) is removed, and the
-- lane starts at its level's floor again until the next raise. Answers the floors made,
-- lowered or removed.
CREATE FUNCTION notifyq.mend_floors_v2() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_mended integer;
    v_lanes integer;
BEGIN
    v_mended := notifyq.mend_floors_v1();
    DELETE FROM notifyq.lane_floors AS f
    USING notifyq.claim_floors AS g
    WHERE g.queue = f.queue AND g.priority = f.priority
      AND (f.run_at, f.id) > (g.run_at, g.id)
      AND EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS j
                  WHERE j.queue = f.queue AND j.priority = f.priority
                    AND j.fair_key = f.fair_key
                    AND j.status = 'queued' AND NOT j.group_blocked
                    AND (j.run_at, j.id) >= (g.run_at, g.id)
                    AND (j.run_at, j.id) < (f.run_at, f.id));
    GET DIAGNOSTICS v_lanes = ROW_COUNT;
    RETURN v_mended + v_lanes;
END;
$$;

-- claim_fair_v1 (sql/026), which probes each lane from the higher of its floor and its level's.
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
            -- next poll while the lanes still hold work.
            EXIT WHEN cardinality(v_tried) > 0 OR v_waits >= 8;
            SELECT l.fair_key INTO v_first FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
            ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
            LIMIT 1;
            EXIT WHEN v_first IS NULL;
            PERFORM 1 FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.fair_key = v_first
            FOR NO KEY UPDATE;
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


REVOKE EXECUTE ON FUNCTION notifyq.lower_lane_floors_v1(text[], integer[], text[], timestamptz[])
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.raise_floors_v2() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.seal_floors_v2() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.mend_floors_v2() FROM PUBLIC;

-- Roles granted before this version (notifyq grant) keep working: a worker role (it may update
-- jobs) gets the new table and functions.
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
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.lane_floors TO %I',
                       r.rolname);
        EXECUTE format('GRANT EXECUTE ON FUNCTION '
                       'notifyq.lower_lane_floors_v1(text[], integer[], text[], timestamptz[]), '
                       'notifyq.raise_floors_v2(), notifyq.seal_floors_v2(), '
                       'notifyq.mend_floors_v2() TO %I', r.rolname);
    END LOOP;
END;
$$;
