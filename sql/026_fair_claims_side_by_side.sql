-- notifyq schema, version 26: claims of a fair queue side by side, none of them left idle
-- while the lanes hold work.
--
-- A claim of a fair level (claim_fair_v1, sql/024) locks the lanes it serves and skips those
-- another claim holds. Version 24 also bounded what a claim took from its own lanes by the
-- turns the lanes of the others would reach (so that two claims racing for two keys took what
-- the weights give them together), and a claim that found every lane held waited once for the
-- first, then gave up. Both left claims empty-handed while jobs were queued: the bound, when
-- its lanes were further back than the others', and the wait, when the lanes were taken again
-- by the time it looked. A worker whose claim comes back empty sleeps until a notification or
-- its poll; a drain has no notifications, so the first worker kept the queue to itself. With
-- four workers of 16 slots over 20 keys, one worker ran 19,950 of 20,000 no-op jobs, the three
-- others 10 to 28; with jobs of 50 ms, one worker of four sat idle for most of the drain in half
-- of the runs (the keys' throughput x0.65 to x0.96 of the same jobs without keys).
--
-- Now a claim takes its share from the lanes it holds as if they were all the lanes: the turns
-- that each lane moves by what it gave settle the difference at the next claims (a lane that
-- got ahead comes later in line), so the weights hold over the claims that follow (4:1 gave
-- 80.0 % over 20,000 claims of four workers). A claim that finds every lane held waits for the
-- first, up to eight times, before it leaves the level. Measured on the same four workers: the
-- jobs of a drain spread over every worker; no-op jobs with keys x0.60 of those without (x0.50
-- before, in turns in one run), jobs of 50 ms x0.97.

-- Takes up to p_limit claimable jobs of one fair level (a queue and priority that has lanes),
-- locked, in turns across its lanes; the caller (claim_v4) starts them. p_skip names the tasks
-- this claim may not take (an open breaker, a limit that the limited claim enforces).
--
-- This claim holds the first p_limit open lanes, lowest turn first, that it can lock (FOR NO
-- KEY UPDATE SKIP LOCKED: another claim holds the rest, and serves them); if another claim
-- holds every one, it waits for the first (claims are short) and looks again, up to eight
-- times. The shares of the jobs are what start-time fair queueing gives the held lanes were
-- every backlog endless: the p_limit lowest of turn + i / weight. Each lane's share is taken in
-- one statement for all lanes (less the jobs this claim locked already: its own locks do not
-- make it skip them), and what a lane could not give (it ran dry) is shared out again among the
-- others, until the claim is full or every lane is dry. Each lane's turn then moves on by what
-- it gave; a lane that gave nothing goes to the back (its jobs are not due, or are another
-- worker's tasks), and one with nothing queued at all becomes idle. Lanes beyond the first
-- p_limit are served when those gave too little.
--
-- A task with key_concurrency is taken per lane with what its key has room for: the jobs of
-- that task and key processing are counted under a transaction-level advisory lock of the pair,
-- tried (never waited for: a claim that holds it is starting jobs of that key right now, and
-- this one leaves them to it), and the jobs this claim takes count too.
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
        -- other claim holds; a new lane's turn is set below.
        SELECT array_agg(h.fair_key ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST,
                                             h.fair_key),
               array_agg(h.turn ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST,
                                         h.fair_key),
               array_agg(coalesce(w.weight, 1)
                         ORDER BY h.turn NULLS FIRST, h.served_at NULLS FIRST, h.fair_key)
        INTO v_keys, v_starts, v_weights
        FROM (SELECT l.fair_key, l.turn, l.served_at FROM notifyq.fair_lanes AS l
              WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
                AND l.fair_key <> ALL(v_tried)
              ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
              LIMIT p_limit
              FOR NO KEY UPDATE OF l SKIP LOCKED) AS h
        LEFT JOIN notifyq.fair_weights AS w ON w.fair_key = h.fair_key;
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
                SELECT l.fair_key, l.start, l.weight, l.took, l.o
                FROM unnest(v_keys, v_starts, v_weights, v_took, v_dry) WITH ORDINALITY
                     AS l(fair_key, start, weight, took, dry, o)
                WHERE NOT l.dry
            ), edge AS (
                SELECT least(min(l.start + (l.took + v_left - 1) / l.weight),
                             (v_left + sum(l.took + l.start * l.weight)) / sum(l.weight) + 1)
                       AS e
                FROM lanes AS l
            ), ask AS (
                SELECT s.fair_key, count(*)::integer AS n
                FROM (SELECT l.fair_key
                      FROM lanes AS l
                      CROSS JOIN edge
                      CROSS JOIN LATERAL generate_series(
                          0, least(v_left - 1,
                                   greatest(floor((edge.e - l.start) * l.weight) - l.took, 0)
                                   ::integer + 1)) AS g(i)
                      ORDER BY l.start + (l.took + g.i) / l.weight, l.o
                      LIMIT v_left) AS s
                GROUP BY s.fair_key
            ), got AS (
                SELECT c.id, a.fair_key
                FROM ask AS a
                CROSS JOIN LATERAL (
                    SELECT j.id FROM ONLY notifyq.jobs AS j
                    WHERE j.queue = p_queue AND j.priority = p_priority
                      AND j.fair_key = a.fair_key
                      AND (j.run_at, j.id) >= (p_floor_run_at, p_floor_id)
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
                              AND (j.run_at, j.id) >= (p_floor_run_at, p_floor_id)
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
