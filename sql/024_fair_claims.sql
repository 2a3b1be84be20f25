-- notifyq schema, version 24: fair claims per key. A job may carry a fair_key (a tenant, a
-- customer, an account): within a queue and priority, claims then go round-robin across the
-- keys that have work, weighted by notifyq.fair_weights, so that one key's flood delays another
-- key's next job by about one job of its own per turn. A task may cap the jobs of one key it
-- runs at once (key_concurrency).
--
-- The turns are kept per lane: a row of notifyq.fair_lanes for each (queue, priority, key) that
-- has had work lately, jobs without a key being the lane '' of their level. A lane's turn is a
-- virtual time: a claim serves the lanes whose turns are lowest (start-time fair queueing), and
-- each job it takes from a lane moves that lane's turn on by 1 / its weight. A claim locks the
-- lanes it serves (FOR NO KEY UPDATE, skipping those another claim holds), so two claims share
-- out the lanes between them instead of both taking the same key's next job. A level with no
-- lane, which is every level whose jobs have no key, is claimed as before, in one statement:
-- the only cost of fairness there is one look at an empty table.
--
-- Lanes come and go with their work:
--   - an INSERT's statement trigger (floors_inserted_v1, which aggregates the inserted rows
--     already) opens the lanes of the keys it inserted, and the lane '' of a level whose jobs
--     without a key now share it with keyed ones; a job requeued by an UPDATE opens its lane in
--     the row trigger of the floors. A lane that exists and is open costs a probe, no write;
--   - a claim that finds a lane without any queued job marks it idle (idle_since), which takes
--     it out of every later claim's look; a job inserted into it opens it again;
--   - the maintenance leader opens idle lanes that a job reached while a claim was marking
--     them idle (a race of two transactions), removes lanes idle for a minute, and every minute
--     makes the lanes of keyed jobs that have none (tend_lanes_v1, mend_lanes_v1).
-- A new or reopened lane starts at most one claim's worth of turns behind the busiest lane: no
-- key banks credit while it has nothing queued.

-- -- Columns ------------------------------------------------------------------------------------

ALTER TABLE notifyq.jobs ADD COLUMN fair_key text;

ALTER TABLE notifyq.tasks ADD COLUMN key_concurrency integer
    CONSTRAINT tasks_key_concurrency_check CHECK (key_concurrency >= 1);

-- The rules of a job's columns know the new one (refuse_row_v1 below says which was broken).
DROP TRIGGER jobs_check ON notifyq.jobs;
CREATE TRIGGER jobs_check BEFORE INSERT OR UPDATE OF task, queue, payload, priority, run_at, max_attempts, dedup_key, created_at, depends_on, workflow_id, group_key, trace_context, ref, fair_key ON notifyq.jobs FOR EACH ROW WHEN ((NOT (((length(new.task) >= 1) AND (length(new.task) <= 200)) AND ((length(new.queue) >= 1) AND (length(new.queue) <= 200)) AND (jsonb_typeof(new.payload) = 'object'::text) AND (new.status = ANY (ARRAY['waiting'::text, 'queued'::text, 'processing'::text, 'completed'::text, 'failed'::text, 'cancelled'::text, 'suspended'::text])) AND (new.attempt_count >= 0) AND (new.max_attempts >= 1) AND (new.claims >= 0) AND (new.lost_count >= 0) AND (cardinality(new.depends_on) <= 1000) AND ((new.group_key IS NULL) OR ((length(new.group_key) >= 1) AND (length(new.group_key) <= 512))) AND ((new.progress IS NULL) OR (jsonb_typeof(new.progress) = 'object'::text)) AND ((new.trace_context IS NULL) OR ((jsonb_typeof(new.trace_context) = 'object'::text) AND (octet_length((new.trace_context)::text) <= 1024))) AND ((new.fair_key IS NULL) OR ((char_length(new.fair_key) >= 1) AND (char_length(new.fair_key) <= 512))) AND ((new.ref IS NULL) OR ((new.workflow_id IS NOT NULL) AND ((char_length(new.ref) >= 1) AND (char_length(new.ref) <= 200)))) AND ((new.run_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.run_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)) AND ((new.created_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.created_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)) AND ((new.started_at IS NULL) OR ((new.started_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.started_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.finished_at IS NULL) OR ((new.finished_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.finished_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.lease_expires_at IS NULL) OR ((new.lease_expires_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.lease_expires_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.heartbeat_at IS NULL) OR ((new.heartbeat_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.heartbeat_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.cancel_requested_at IS NULL) OR ((new.cancel_requested_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.cancel_requested_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)))))) EXECUTE FUNCTION notifyq.refuse_row_v1();

CREATE OR REPLACE FUNCTION notifyq.refuse_row_v1() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_broken text;
BEGIN
    v_broken := CASE
        WHEN NOT length(NEW.task) BETWEEN 1 AND 200 THEN 'task must be 1 to 200 characters'
        WHEN NOT length(NEW.queue) BETWEEN 1 AND 200 THEN 'queue must be 1 to 200 characters'
        WHEN jsonb_typeof(NEW.payload) <> 'object' THEN 'payload must be a JSON object'
        WHEN NEW.status NOT IN ('waiting', 'queued', 'processing', 'completed', 'failed',
                                'cancelled', 'suspended')
            THEN format('status %L is not a status', NEW.status)
        WHEN NEW.attempt_count < 0 THEN 'attempt_count must not be negative'
        WHEN NEW.max_attempts < 1 THEN 'max_attempts must be at least 1'
        WHEN NEW.claims < 0 THEN 'claims must not be negative'
        WHEN NEW.lost_count < 0 THEN 'lost_count must not be negative'
        WHEN cardinality(NEW.depends_on) > 1000 THEN 'a job depends on 1000 jobs at most'
        WHEN NOT length(NEW.group_key) BETWEEN 1 AND 512
            THEN 'group_key must be 1 to 512 characters'
        WHEN NOT char_length(NEW.fair_key) BETWEEN 1 AND 512
            THEN 'fair_key must be 1 to 512 characters'
        WHEN jsonb_typeof(NEW.progress) <> 'object' THEN 'progress must be a JSON object'
        WHEN NEW.trace_context IS NOT NULL
             AND NOT (jsonb_typeof(NEW.trace_context) = 'object'
                      AND octet_length(NEW.trace_context::text) <= 1024)
            THEN 'trace_context must be a JSON object of 1024 bytes at most'
        WHEN NEW.ref IS NOT NULL
             AND NOT (NEW.workflow_id IS NOT NULL AND char_length(NEW.ref) BETWEEN 1 AND 200)
            THEN 'ref must be 1 to 200 characters, on a job of a workflow'
        ELSE 'its times must be finite, between the years 1900 and 9998'
    END;
    RAISE EXCEPTION 'notifyq.jobs: job %: %', NEW.id, v_broken
        USING ERRCODE = 'check_violation';
END;
$$;

-- A keyed job's lane finds its next job here: one entry per keyed job in the queue, none for
-- a job without a key (whose lane, '', walks the claim index of its level).
CREATE INDEX jobs_fair_idx ON notifyq.jobs (queue, priority, fair_key, run_at, id)
    WHERE status = 'queued' AND NOT group_blocked AND fair_key IS NOT NULL;

-- The keyed jobs running, by task and key: what key_concurrency counts.
CREATE INDEX jobs_key_running_idx ON notifyq.jobs (task, fair_key)
    WHERE status = 'processing' AND fair_key IS NOT NULL;

-- -- Lanes and weights --------------------------------------------------------------------------

CREATE TABLE notifyq.fair_lanes (
    queue text NOT NULL,
    priority integer NOT NULL,
    -- The key; '' is the lane of the level's jobs without one (a key has 1 to 512 characters).
    fair_key text NOT NULL,
    -- The lane's virtual time: the claims serve the lowest first, and move it on by
    -- 1 / weight for each job they take. NULL for a lane new or opened again: it starts level
    -- with the lowest turn of its level's open lanes.
    turn float8,
    -- Set by the claim that found nothing queued in the lane; an insert into it clears it.
    idle_since timestamptz,
    -- When a claim last took a job of it: of two lanes at one turn, the one served longer ago
    -- goes first, so that two keys alternate job by job.
    served_at timestamptz,
    PRIMARY KEY (queue, priority, fair_key)
) WITH (fillfactor = 50);
-- No index has the turn, which every claim moves: its updates stay HOT (on their page, pruned
-- there without a vacuum), and a claim reads its level's open lanes by the primary key and keeps
-- the lowest turns, a top-N sort over the keys with work (tens to thousands; a sort of a
-- thousand costs about what an index's new entries a claim did).

-- A key's share of the claims while it and others have work: a key of weight 4 gets four jobs
-- claimed for each one of a key of weight 1 (the default).
CREATE TABLE notifyq.fair_weights (
    fair_key text PRIMARY KEY CONSTRAINT fair_weights_key_check
        CHECK (char_length(fair_key) BETWEEN 1 AND 512),
    weight float8 NOT NULL CONSTRAINT fair_weights_weight_check
        CHECK (weight >= 1 AND weight <= 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Opens the lanes of these (queue, priority, key) triples ('' for a job without a key): a
-- keyed job's lane, the lane '' of a level that has lanes, and the lane '' of a level that gets
-- its first (for its jobs without a key already there). A lane that is open already is left
-- as it is, without a write or a lock; an idle one is opened, its turn forgotten (its row
-- locked until this transaction ends, which a claim never waits for: it sees the lane idle
-- until then). A lane that another transaction is opening right now (a producer's, which may
-- stay open for long) is left to it, under a transaction advisory lock of the lane that is
-- tried, never waited for: two producers of one key never wait for each other here. Should
-- that transaction roll back, the maintenance leader opens the lane (tend_lanes_v1 at its next
-- pass for an idle one, mend_lanes_v1 within a minute for a missing one).
CREATE FUNCTION notifyq.open_lanes_v1(p_queues text[], p_priorities integer[], p_keys text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    WITH asked AS (
        SELECT DISTINCT k.queue, k.priority, k.fair_key,
               EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                       WHERE l.queue = k.queue AND l.priority = k.priority) AS fair
        FROM unnest(p_queues, p_priorities, p_keys) AS k(queue, priority, fair_key)
    ), wanted AS (
        SELECT a.queue, a.priority, a.fair_key FROM asked AS a
        WHERE a.fair_key <> '' OR a.fair
        UNION
        SELECT a.queue, a.priority, '' FROM asked AS a
        WHERE a.fair_key <> '' AND NOT a.fair
    )
    INSERT INTO notifyq.fair_lanes AS l (queue, priority, fair_key)
    SELECT w.queue, w.priority, w.fair_key FROM wanted AS w
    WHERE CASE WHEN EXISTS (SELECT 1 FROM notifyq.fair_lanes AS o
                            WHERE o.queue = w.queue AND o.priority = w.priority
                              AND o.fair_key = w.fair_key AND o.idle_since IS NULL)
               THEN false
               ELSE pg_try_advisory_xact_lock(hashtextextended(
                        'notifyq.lane' || E'\x1f' || w.queue || E'\x1f' || w.priority
                        || E'\x1f' || w.fair_key, 0)) END
    ORDER BY 1, 2, 3
    ON CONFLICT (queue, priority, fair_key) DO UPDATE
        SET idle_since = NULL, turn = NULL, served_at = NULL;
END;
$$;

-- floors_inserted_v1 (sql/021), which also opens the lanes of what it inserted when a job has a
-- key or any level has lanes: otherwise one more look, at an empty table.
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
    END IF;
    RETURN NULL;
END;
$$;

-- floor_requeued_v1 (sql/021): a job that becomes claimable by an UPDATE opens its lane too.
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
    RETURN NULL;
END;
$$;

-- The floors' row trigger also fires when a queued job's key is changed by hand.
DROP TRIGGER jobs_floor ON notifyq.jobs;
CREATE TRIGGER jobs_floor AFTER UPDATE OF status, queue, priority, run_at, group_blocked, fair_key
    ON notifyq.jobs FOR EACH ROW
    WHEN (NEW.status = 'queued' AND NOT NEW.group_blocked
          AND (OLD.status <> 'queued' OR OLD.group_blocked OR OLD.queue <> NEW.queue
               OR OLD.priority <> NEW.priority OR NEW.run_at < OLD.run_at
               OR OLD.fair_key IS DISTINCT FROM NEW.fair_key))
    EXECUTE FUNCTION notifyq.floor_requeued_v1();

-- -- The claim ----------------------------------------------------------------------------------

-- Takes up to p_limit claimable jobs of one fair level (a queue and priority that has lanes),
-- locked, in turns across its lanes; the caller (claim_v4) starts them. p_skip names the tasks
-- this claim may not take (an open breaker, a limit that the limited claim enforces).
--
-- The lanes in line are the open ones with the lowest turns. This claim holds those of them it
-- can lock (FOR NO KEY UPDATE SKIP LOCKED: another claim holds the rest, and serves them); if
-- another claim holds every one, it waits for the first (claims are short) and looks again.
-- The shares of the jobs are what start-time fair queueing gives the held lanes were every
-- backlog endless: the p_limit lowest of turn + i / weight. A lane in line that another claim
-- holds bounds them: that claim is taking its jobs, as many as this one may take, so this one
-- takes no job whose turn the other lanes do not reach by then (below the (p_limit + 1)-th
-- lowest turn of theirs). So two claims that each hold one of two keys (they raced for the
-- lanes) together take what the keys' weights give them, instead of each filling itself from
-- its one key. Each lane's share is taken in one statement for all lanes (less the jobs this
-- claim locked already: its own locks do not make it skip them), and what a lane could not
-- give (it ran dry) is shared out again among the others, until the claim is full or every
-- lane is dry. Each lane's turn then moves on by what it gave; a lane that gave nothing goes
-- to the back (its jobs are not due, or are another worker's tasks), and one with nothing
-- queued at all becomes idle. Lanes beyond the first p_limit are served when those gave too
-- little.
--
-- A task with key_concurrency is taken per lane with what its key has room for: the jobs of
-- that task and key processing are counted under a transaction-level advisory lock of the pair,
-- tried (never waited for: a claim that holds it is starting jobs of that key right now, and
-- this one leaves them to it), and the jobs this claim takes count too.
CREATE FUNCTION notifyq.claim_fair_v1(
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
    v_waited boolean := false;
    v_horizon float8;
    v_low float8;
    v_keys text[];
    v_starts float8[];
    v_weights float8[];
    v_mine boolean[];
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
        -- The lanes in line and those of them this claim holds, lowest turn first (held ones
        -- first at a tie); a new lane's turn is set below.
        WITH line AS (
            SELECT l.fair_key, l.turn, l.served_at FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
              AND l.fair_key <> ALL(v_tried)
            ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
            LIMIT p_limit
        ), held AS (
            SELECT l.fair_key, l.turn, l.served_at FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.idle_since IS NULL
              AND l.fair_key <> ALL(v_tried)
            ORDER BY l.turn NULLS FIRST, l.served_at NULLS FIRST
            LIMIT p_limit
            FOR NO KEY UPDATE OF l SKIP LOCKED
        ), lanes AS (
            SELECT h.fair_key, h.turn, h.served_at, true AS mine FROM held AS h
            UNION ALL
            SELECT i.fair_key, i.turn, i.served_at, false FROM line AS i
            WHERE i.fair_key NOT IN (SELECT h.fair_key FROM held AS h)
        )
        SELECT array_agg(s.fair_key ORDER BY s.turn NULLS FIRST, s.served_at NULLS FIRST,
                                             s.mine DESC, s.fair_key),
               array_agg(s.turn ORDER BY s.turn NULLS FIRST, s.served_at NULLS FIRST,
                                         s.mine DESC, s.fair_key),
               array_agg(coalesce(w.weight, 1)
                         ORDER BY s.turn NULLS FIRST, s.served_at NULLS FIRST, s.mine DESC,
                                  s.fair_key),
               array_agg(s.mine ORDER BY s.turn NULLS FIRST, s.served_at NULLS FIRST,
                                         s.mine DESC, s.fair_key)
        INTO v_keys, v_starts, v_weights, v_mine
        FROM lanes AS s
        LEFT JOIN notifyq.fair_weights AS w ON w.fair_key = s.fair_key;
        EXIT WHEN v_keys IS NULL;
        IF true <> ALL(v_mine) THEN
            -- Every lane in line is another claim's now: wait for the first, then look again
            -- (once: a claim that still holds none leaves the level to the others).
            EXIT WHEN v_waited OR cardinality(v_tried) > 0;
            PERFORM 1 FROM notifyq.fair_lanes AS l
            WHERE l.queue = p_queue AND l.priority = p_priority AND l.fair_key = v_keys[1]
            FOR NO KEY UPDATE;
            v_waited := true;
            CONTINUE;
        END IF;
        IF array_position(v_starts, NULL) IS NOT NULL THEN
            -- A new lane starts level with the lowest turn of the open lanes: the first of
            -- those in line that has one (they come lowest first), else the level's.
            IF v_low IS NULL THEN
                v_low := (SELECT min(t) FROM unnest(v_starts) AS t);
                IF v_low IS NULL THEN
                    SELECT min(l.turn) INTO v_low FROM notifyq.fair_lanes AS l
                    WHERE l.queue = p_queue AND l.priority = p_priority
                      AND l.idle_since IS NULL;
                END IF;
                v_low := coalesce(v_low, 0);
            END IF;
            v_starts := ARRAY(SELECT coalesce(t, v_low)
                              FROM unnest(v_starts) WITH ORDINALITY AS u(t, o) ORDER BY o);
        END IF;
        IF false = ANY(v_mine) THEN
            -- The turn the lanes other claims hold reach while those claims take their jobs.
            v_horizon := least(v_horizon, (
                SELECT max(s.t) FROM (
                    SELECT l.start + g.i / l.weight AS t
                    FROM unnest(v_starts, v_weights, v_mine) AS l(start, weight, mine)
                    CROSS JOIN LATERAL generate_series(0, p_limit) AS g(i)
                    WHERE NOT l.mine
                    ORDER BY 1
                    LIMIT p_limit + 1) AS s));
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
                FROM unnest(v_keys, v_starts, v_weights, v_took, v_dry, v_mine) WITH ORDINALITY
                     AS l(fair_key, start, weight, took, dry, mine, o)
                WHERE l.mine AND NOT l.dry
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
                      WHERE v_horizon IS NULL
                         OR l.start + (l.took + g.i) / l.weight < v_horizon
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
            EXIT WHEN cardinality(v_ids) >= p_limit
                   OR NOT EXISTS (SELECT 1 FROM unnest(v_mine, v_dry) AS m(mine, dry)
                                  WHERE m.mine AND NOT m.dry);
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
        FROM unnest(v_keys, v_starts, v_weights, v_took, v_dry, v_mine)
             AS k(fair_key, start, weight, took, dry, mine)
        WHERE k.mine AND (k.took > 0 OR k.dry);
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

-- claim_v4 (sql/023), which claims the fair levels in turns (claim_fair_v1). Within a priority,
-- the levels without lanes are claimed as before, in one statement, and each fair level with
-- open lanes takes a share of the claim beside them (what one takes short, the next may have);
-- jobs with a key are claimed only through their lanes.
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
    v_fair boolean := EXISTS (SELECT 1 FROM notifyq.fair_lanes);
    v_skip text[];
    v_fq text[];
    v_frun timestamptz[];
    v_fid uuid[];
    v_share integer;
    v_pass integer;
BEGIN
    -- Suspended jobs whose time has come (a sleep over, a signal's wait timed out) become
    -- queued here, in the statement of the claim that takes them (sql/023).
    IF EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS s
               WHERE s.status = 'suspended' AND s.suspended_until <= now()) THEN
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'queued', run_at = now(), suspended_until = NULL, waiting_for_signal = NULL
        WHERE j.id IN (
            SELECT s.id FROM ONLY notifyq.jobs AS s
            WHERE s.status = 'suspended' AND s.suspended_until <= now()
              AND s.task = ANY(p_tasks)
              AND (p_queues IS NULL OR s.queue = ANY(p_queues))
              AND (s.dedup_key IS NULL
                   OR NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS d
                                  WHERE d.queue = s.queue AND d.dedup_key = s.dedup_key
                                    AND d.status IN ('waiting', 'queued')))
            ORDER BY s.suspended_until
            LIMIT p_limit
            FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    IF v_fair THEN
        v_skip := ARRAY(SELECT t.name FROM notifyq.tasks AS t
                        WHERE (NOT p_probe AND t.breaker_open_until IS NOT NULL)
                           OR t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL);
    END IF;
    FOR v_priority IN
        SELECT DISTINCT f.priority FROM notifyq.claim_floors AS f
        WHERE p_queues IS NULL OR f.queue = ANY(p_queues)
        ORDER BY 1 DESC
    LOOP
        v_fq := NULL;
        IF v_fair THEN
            SELECT array_agg(f.queue ORDER BY f.queue), array_agg(f.run_at ORDER BY f.queue),
                   array_agg(f.id ORDER BY f.queue)
            INTO v_fq, v_frun, v_fid
            FROM notifyq.claim_floors AS f
            WHERE f.priority = v_priority
              AND (p_queues IS NULL OR f.queue = ANY(p_queues))
              AND f.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                  WHERE q.paused OR q.rate_limit IS NOT NULL)
              AND EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                          WHERE l.queue = f.queue AND l.priority = f.priority
                            AND l.idle_since IS NULL);
        END IF;
        -- Two passes when fair levels share the priority: the levels without lanes first take
        -- one share, the fair ones theirs, then the first what the fair ones left.
        FOR v_pass IN 1..CASE WHEN v_fq IS NULL THEN 1 ELSE 2 END LOOP
            v_share := CASE WHEN v_fq IS NULL OR v_pass = 2 THEN v_left
                            ELSE greatest(v_left / (cardinality(v_fq) + 1), 1) END;
            EXIT WHEN v_share <= 0;
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
                      AND j.fair_key IS NULL
                      AND j.id <> ALL(v_ids)
                    ORDER BY j.run_at, j.id
                    LIMIT v_share
                    FOR NO KEY UPDATE SKIP LOCKED) AS c
                WHERE f.priority = v_priority
                  AND (p_queues IS NULL OR f.queue = ANY(p_queues))
                  AND f.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                                      WHERE q.paused OR q.rate_limit IS NOT NULL)
                  AND (NOT v_fair
                       OR NOT EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                                      WHERE l.queue = f.queue AND l.priority = f.priority))
                ORDER BY c.run_at, c.id
                LIMIT v_share);
            v_left := p_limit - cardinality(v_ids);
            EXIT WHEN v_left <= 0 OR v_pass = 2 OR v_fq IS NULL;
            FOR v_i IN 1..cardinality(v_fq) LOOP
                EXIT WHEN v_left <= 0;
                v_ids := v_ids || notifyq.claim_fair_v1(
                    v_fq[v_i], v_priority, v_frun[v_i], v_fid[v_i],
                    p_tasks, v_skip,
                    ceil(v_left::float8 / (cardinality(v_fq) - v_i + 1))::integer);
                v_left := p_limit - cardinality(v_ids);
            END LOOP;
        END LOOP;
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

-- claim_limited_v4 (sql/021): a task that has a concurrency or rate limit and key_concurrency
-- too is held to both here (such a task's jobs are claimed only here, in the order of the
-- queue rather than in turns).
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
    v_key_limits jsonb := coalesce(
        (SELECT jsonb_object_agg(t.name, t.key_concurrency) FROM notifyq.tasks AS t
         WHERE t.name = ANY(p_tasks) AND t.key_concurrency IS NOT NULL), '{}');
    v_key_room jsonb := '{}';
    v_pair text;
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
        SELECT c.id, c.task, c.queue, c.fair_key
        FROM notifyq.claim_floors AS f
        CROSS JOIN LATERAL (
            SELECT j.id, j.task, j.queue, j.priority, j.run_at, j.fair_key
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
        IF r.fair_key IS NOT NULL AND v_key_limits ? r.task THEN
            -- key_concurrency, counted as claim_fair_v1 counts it.
            v_pair := r.task || E'\x1f' || r.fair_key;
            IF NOT v_key_room ? v_pair THEN
                v_key_room := v_key_room || jsonb_build_object(v_pair,
                    CASE WHEN pg_try_advisory_xact_lock(hashtextextended(
                                  'notifyq.key_concurrency' || E'\x1f' || v_pair, 0))
                         THEN (v_key_limits ->> r.task)::integer
                              - (SELECT count(*) FROM ONLY notifyq.jobs AS j
                                 WHERE j.status = 'processing' AND j.task = r.task
                                   AND j.fair_key = r.fair_key)::integer
                         ELSE 0 END);
            END IF;
            CONTINUE WHEN (v_key_room ->> v_pair)::integer <= 0;
            v_key_room := jsonb_set(v_key_room, ARRAY[v_pair],
                                    to_jsonb((v_key_room ->> v_pair)::integer - 1));
        END IF;
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

-- -- Enqueues -----------------------------------------------------------------------------------

-- enqueue_v4 (sql/020) with a job's fair_key, and what a duplicate does (on_conflict): by
-- default, keep_latest, the pending job takes the new payload, priority, run_at and
-- max_attempts (the rule so far); keep_first leaves it as it is. debounce (seconds) runs the job
-- once no newer submission of its dedup_key came for that long: each one replaces the pending
-- job and moves its run_at to now() + debounce. A duplicate must have the pending job's key.
CREATE FUNCTION notifyq.enqueue_v5(
    p_task text,
    p_payload jsonb,
    p_queue text,
    p_priority integer,
    p_run_at timestamptz,
    p_delay float8,
    p_dedup_key text,
    p_max_attempts integer,
    p_fallback integer,
    p_depends_on uuid[],
    p_group_key text,
    p_workflow_id uuid,
    p_id uuid,
    p_trace_context jsonb,
    p_fair_key text,
    p_on_conflict text,
    p_debounce float8
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_new_id uuid := coalesce(p_id, notifyq.uuid_v7());
    v_payload jsonb := coalesce(p_payload, '{}'::jsonb);
    v_asked uuid[] := ARRAY(SELECT DISTINCT a FROM unnest(p_depends_on) AS a ORDER BY a);
    v_job record;
    d record;
BEGIN
    IF p_on_conflict IS NOT NULL AND p_on_conflict NOT IN ('keep_latest', 'keep_first') THEN
        RAISE EXCEPTION 'on_conflict must be keep_latest or keep_first, not %',
                        quote_literal(p_on_conflict)
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_debounce IS NOT NULL
       AND (p_dedup_key IS NULL OR p_run_at IS NOT NULL OR coalesce(p_delay, 0) <> 0
            OR p_on_conflict = 'keep_first' OR NOT p_debounce BETWEEN 0 AND 316224000) THEN
        RAISE EXCEPTION 'debounce needs a dedup_key, no run_at or delay, and keep_latest, '
                        'and is 0 to 316224000 seconds (ten years)'
            USING ERRCODE = 'check_violation',
                  HINT = 'A debounced job runs once no newer job with its dedup_key came '
                         'for that many seconds.';
    END IF;
    SELECT * INTO d
    FROM notifyq.job_defaults_v1(ARRAY[p_task], ARRAY[v_payload], ARRAY[p_queue],
                                 ARRAY[p_priority], ARRAY[p_max_attempts], p_fallback);
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts, depends_on,
             group_key, workflow_id, trace_context, fair_key)
        VALUES (v_new_id, d.task, v_payload, d.queue, d.priority,
                coalesce(p_run_at,
                         now() + make_interval(secs => coalesce(p_debounce, p_delay, 0))),
                p_dedup_key, d.max_attempts, coalesce(p_depends_on, '{}'), p_group_key,
                p_workflow_id, p_trace_context, p_fair_key)
        ON CONFLICT (queue, dedup_key)
            WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL
        -- keep_first changes nothing: the row is written as it was, to lock and answer it.
        DO UPDATE SET payload = CASE WHEN p_on_conflict = 'keep_first' THEN j.payload
                                     ELSE EXCLUDED.payload END,
                      priority = CASE WHEN p_on_conflict = 'keep_first' THEN j.priority
                                      ELSE EXCLUDED.priority END,
                      run_at = CASE WHEN p_on_conflict = 'keep_first' THEN j.run_at
                                    ELSE EXCLUDED.run_at END,
                      max_attempts = CASE WHEN p_on_conflict = 'keep_first' THEN j.max_attempts
                                          ELSE EXCLUDED.max_attempts END,
                      trace_context = CASE WHEN p_on_conflict = 'keep_first' THEN j.trace_context
                                           ELSE coalesce(EXCLUDED.trace_context,
                                                         j.trace_context) END
            WHERE j.status IN ('waiting', 'queued')
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at, j.group_blocked,
                  j.depends_on, j.group_key, j.fair_key INTO v_job;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_job.id <> v_new_id THEN
        -- Raising undoes the replacement above: the pending job stays as it was.
        IF v_job.depends_on <> v_asked THEN
            RAISE EXCEPTION 'job % is pending with dedup_key % and depends_on {%}, not {%}',
                            v_job.id, p_dedup_key, array_to_string(v_job.depends_on, ', '),
                            array_to_string(v_asked, ', ')
                USING ERRCODE = 'unique_violation',
                      HINT = 'Submit it with the same depends_on, or with another dedup_key.';
        END IF;
        IF v_job.group_key IS DISTINCT FROM p_group_key THEN
            RAISE EXCEPTION 'job % is pending with dedup_key % and group_key %, not %',
                            v_job.id, p_dedup_key, coalesce(quote_literal(v_job.group_key), 'none'),
                            coalesce(quote_literal(p_group_key), 'none')
                USING ERRCODE = 'unique_violation',
                      HINT = 'Submit it with the same group_key, or with another dedup_key.';
        END IF;
        IF v_job.fair_key IS DISTINCT FROM p_fair_key THEN
            RAISE EXCEPTION 'job % is pending with dedup_key % and fair_key %, not %',
                            v_job.id, p_dedup_key, coalesce(quote_literal(v_job.fair_key), 'none'),
                            coalesce(quote_literal(p_fair_key), 'none')
                USING ERRCODE = 'unique_violation',
                      HINT = 'Submit it with the same fair_key, or with another dedup_key.';
        END IF;
        -- A replaced job may now be due earlier than the time its workers sleep until.
        IF v_job.status = 'queued' AND NOT v_job.group_blocked THEN
            PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
        END IF;
        PERFORM notifyq.announce_v1(ARRAY[v_job.id]);
    END IF;
    IF v_job.id = v_new_id AND v_job.status = 'waiting'
       AND EXISTS (SELECT 1 FROM notifyq.doom_waiting_v1(ARRAY[v_new_id])) THEN
        -- A parent had failed or was cancelled: it ended at once, cancelled.
        v_job.status := 'cancelled';
    END IF;
    RETURN QUERY SELECT v_job.id, v_job.id <> v_new_id, v_job.status, v_job.run_at,
                        v_job.created_at;
END;
$$;

-- enqueue_many_v5 (sql/018) with each job's fair_key, on_conflict and debounce (see enqueue_v5):
-- the jobs without a dedup_key go in one INSERT, the others one by one through enqueue_v5.
CREATE FUNCTION notifyq.enqueue_many_v6(
    p_tasks text[],
    p_payloads jsonb[],
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[],
    p_delays float8[],
    p_dedup_keys text[],
    p_max_attempts integer[],
    p_fallback integer,
    p_depends_on text[],
    p_group_keys text[],
    p_workflow_ids uuid[],
    p_ids uuid[],
    p_trace_context jsonb,
    p_refs text[],
    p_fair_keys text[],
    p_on_conflicts text[],
    p_debounces float8[]
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_row_by_row boolean := EXISTS (SELECT 1 FROM unnest(p_dedup_keys) AS k WHERE k IS NOT NULL)
                            AND EXISTS (SELECT 1 FROM unnest(p_group_keys) AS k
                                        WHERE k IS NOT NULL);
    v_set record;
BEGIN
    IF EXISTS (SELECT 1
               FROM ROWS FROM (unnest(p_refs), unnest(p_ids), unnest(p_dedup_keys))
                    AS u(ref, id, dedup_key)
               WHERE u.ref IS NOT NULL AND (u.id IS NULL OR u.dedup_key IS NOT NULL)) THEN
        RAISE EXCEPTION 'notifyq.enqueue_many_v6: a job with a ref (a workflow''s) needs an id '
                        'of its own and no dedup key'
            USING ERRCODE = 'check_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM ROWS FROM (unnest(p_dedup_keys), unnest(p_on_conflicts),
                                        unnest(p_debounces)) AS u(dedup_key, on_conflict, debounce)
               WHERE u.dedup_key IS NULL AND (u.on_conflict IS NOT NULL OR u.debounce IS NOT NULL))
    THEN
        RAISE EXCEPTION 'on_conflict and debounce need a dedup_key'
            USING ERRCODE = 'check_violation';
    END IF;
    WITH input AS MATERIALIZED (
        SELECT u.ord, coalesce(u.id, notifyq.uuid_v7()) AS id,
               coalesce(u.payload, '{}'::jsonb) AS payload,
               coalesce(u.run_at, now() + make_interval(secs => coalesce(u.delay, 0))) AS run_at,
               coalesce(u.depends_on::uuid[], '{}') AS depends_on, u.group_key, u.workflow_id,
               u.dedup_key, u.ref, u.fair_key
        FROM ROWS FROM (unnest(p_payloads), unnest(p_run_ats), unnest(p_delays),
                        unnest(p_dedup_keys), unnest(p_depends_on), unnest(p_group_keys),
                        unnest(p_workflow_ids), unnest(p_ids), unnest(p_refs),
                        unnest(p_fair_keys)) WITH ORDINALITY
             AS u(payload, run_at, delay, dedup_key, depends_on, group_key, workflow_id, id, ref,
                  fair_key, ord)
    ), inserted AS (
        INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts,
                                  depends_on, group_key, workflow_id, trace_context, ref,
                                  fair_key)
        SELECT i.id, d.task, i.payload, d.queue, d.priority, i.run_at, d.max_attempts,
               i.depends_on, i.group_key, i.workflow_id, p_trace_context, i.ref, i.fair_key
        FROM input AS i
        JOIN notifyq.job_defaults_v1(p_tasks, p_payloads, p_queues, p_priorities,
                                     p_max_attempts, p_fallback) AS d ON d.ord = i.ord
        WHERE i.dedup_key IS NULL AND NOT v_row_by_row
        ORDER BY i.ord
        RETURNING id, status, created_at
    )
    SELECT array_agg(i.ord::integer) AS ords, array_agg(i.id) AS ids,
           array_agg(x.status) AS statuses, array_agg(i.run_at) AS run_ats,
           array_agg(x.created_at) AS created,
           array_agg(i.id) FILTER (WHERE x.status = 'waiting') AS waiting
    INTO v_set
    FROM input AS i JOIN inserted AS x ON x.id = i.id;
    IF v_set.waiting IS NOT NULL THEN
        -- Jobs whose parent had ended are cancelled now, and those of this batch that depend
        -- on them after them: their statuses are read back.
        PERFORM notifyq.doom_waiting_v1(v_set.waiting);
    END IF;
    RETURN QUERY
    SELECT u.ord, u.id, false,
           CASE WHEN v_set.waiting IS NULL THEN u.status
                ELSE (SELECT j.status FROM notifyq.jobs AS j WHERE j.id = u.id) END,
           u.run_at, u.created_at
    FROM unnest(v_set.ords, v_set.ids, v_set.statuses, v_set.run_ats, v_set.created)
         AS u(ord, id, status, run_at, created_at);

    IF p_dedup_keys IS NOT NULL THEN
        FOR r IN
            SELECT u.*
            FROM ROWS FROM (unnest(p_tasks), unnest(p_payloads), unnest(p_queues),
                            unnest(p_priorities), unnest(p_run_ats), unnest(p_delays),
                            unnest(p_dedup_keys), unnest(p_max_attempts), unnest(p_depends_on),
                            unnest(p_group_keys), unnest(p_workflow_ids), unnest(p_ids),
                            unnest(p_fair_keys), unnest(p_on_conflicts), unnest(p_debounces))
                 WITH ORDINALITY
                 AS u(task, payload, queue, priority, run_at, delay, dedup_key, max_attempts,
                      depends_on, group_key, workflow_id, id, fair_key, on_conflict, debounce,
                      ord)
            WHERE u.dedup_key IS NOT NULL OR v_row_by_row
            ORDER BY u.ord
        LOOP
            RETURN QUERY
            SELECT r.ord::integer, e.job_id, e.duplicate, e.status, e.run_at, e.created_at
            FROM notifyq.enqueue_v5(r.task, r.payload, r.queue, r.priority, r.run_at, r.delay,
                                    r.dedup_key, r.max_attempts, p_fallback,
                                    r.depends_on::uuid[], r.group_key, r.workflow_id, r.id,
                                    p_trace_context, r.fair_key, r.on_conflict,
                                    r.debounce) AS e;
        END LOOP;
        IF v_row_by_row AND p_refs IS NOT NULL THEN
            -- enqueue_v5 takes no ref: the refs of the jobs it inserted are written after.
            UPDATE notifyq.jobs AS j SET ref = u.ref
            FROM ROWS FROM (unnest(p_ids), unnest(p_refs)) AS u(id, ref)
            WHERE j.id = u.id AND u.ref IS NOT NULL;
        END IF;
    END IF;
END;
$$;

-- The SQL face, with a job's key and its duplicate's rule (a new signature: the old one is
-- dropped, and a call by name works as before).
DROP FUNCTION notifyq.enqueue(text, jsonb, text, integer, timestamptz, text, integer, uuid[],
                              text);
CREATE FUNCTION notifyq.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    depends_on uuid[] DEFAULT NULL,
    group_key text DEFAULT NULL,
    fair_key text DEFAULT NULL,
    on_conflict text DEFAULT NULL,
    debounce float8 DEFAULT NULL
) RETURNS uuid
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.job_id FROM notifyq.enqueue_v5(task, payload, queue, priority, run_at, NULL,
                                            dedup_key, max_attempts, NULL, depends_on, group_key,
                                            NULL, NULL, NULL, fair_key, on_conflict,
                                            debounce) AS e;
$$;
GRANT EXECUTE ON FUNCTION notifyq.enqueue(text, jsonb, text, integer, timestamptz, text, integer,
                                          uuid[], text, text, text, float8) TO PUBLIC;

-- register_task_v1 (sql/004) with the task's key_concurrency.
CREATE FUNCTION notifyq.register_task_v2(
    p_name text, p_max_attempts integer, p_options jsonb, p_breaker_threshold integer,
    p_breaker_cooldown float8, p_max_concurrency integer, p_rate_limit float8, p_rate_burst float8,
    p_key_concurrency integer
) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO notifyq.tasks (name, max_attempts, options, breaker_threshold, breaker_cooldown,
                               max_concurrency, rate_limit, rate_burst, rate_tokens, updated_at,
                               key_concurrency)
    VALUES (p_name, p_max_attempts, p_options, p_breaker_threshold, p_breaker_cooldown,
            p_max_concurrency, p_rate_limit, p_rate_burst, coalesce(p_rate_burst, 0), now(),
            p_key_concurrency)
    ON CONFLICT (name) DO UPDATE
    SET max_attempts = EXCLUDED.max_attempts, options = EXCLUDED.options,
        breaker_threshold = EXCLUDED.breaker_threshold,
        breaker_cooldown = EXCLUDED.breaker_cooldown,
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_burst = EXCLUDED.rate_burst,
        key_concurrency = EXCLUDED.key_concurrency,
        updated_at = now();
$$;

-- -- The leader's care of the lanes -------------------------------------------------------------

-- A pass of the maintenance leader (every half second, after the floors'): opens the idle
-- keyed lanes that hold a queued job (a job inserted while a claim found the lane empty and
-- marked it idle, the two unseen by each other), and removes the lanes idle for a minute that
-- hold none. Answers the lanes opened.
CREATE FUNCTION notifyq.tend_lanes_v1() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_opened integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l WHERE l.idle_since IS NOT NULL) THEN
        RETURN 0;
    END IF;
    UPDATE notifyq.fair_lanes AS l SET idle_since = NULL, turn = NULL, served_at = NULL
    FROM (SELECT i.queue, i.priority, i.fair_key FROM notifyq.fair_lanes AS i
          WHERE i.idle_since IS NOT NULL AND i.fair_key <> ''
            AND EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS j
                        WHERE j.queue = i.queue AND j.priority = i.priority
                          AND j.fair_key = i.fair_key
                          AND j.status = 'queued' AND NOT j.group_blocked)
          FOR NO KEY UPDATE SKIP LOCKED) AS o
    WHERE l.queue = o.queue AND l.priority = o.priority AND l.fair_key = o.fair_key;
    GET DIAGNOSTICS v_opened = ROW_COUNT;
    DELETE FROM notifyq.fair_lanes AS l
    USING (SELECT i.queue, i.priority, i.fair_key FROM notifyq.fair_lanes AS i
           WHERE i.idle_since < now() - interval '1 minute'
             AND CASE WHEN i.fair_key = ''
                      THEN NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS j
                                       WHERE j.queue = i.queue AND j.priority = i.priority
                                         AND j.status = 'queued' AND NOT j.group_blocked
                                         AND j.fair_key IS NULL)
                      ELSE NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS j
                                       WHERE j.queue = i.queue AND j.priority = i.priority
                                         AND j.fair_key = i.fair_key
                                         AND j.status = 'queued' AND NOT j.group_blocked) END
           FOR UPDATE SKIP LOCKED) AS g
    WHERE l.queue = g.queue AND l.priority = g.priority AND l.fair_key = g.fair_key;
    RETURN v_opened;
END;
$$;

-- The net under the lanes, which the leader casts every minute with the floors': every key of
-- the queue (a walk of jobs_fair_idx, one step a key) whose lane is missing or idle, and the
-- lane '' of every fair level whose jobs without a key have none open, are opened. Every way a
-- job becomes claimable opens its lane already; this catches the rest (a lane removed while
-- the transaction of a job inserted into it was still open, a trigger switched off by hand).
-- Answers the lanes opened.
CREATE FUNCTION notifyq.mend_lanes_v1() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_found record;
BEGIN
    WITH RECURSIVE keys AS (
        (SELECT j.queue, j.priority, j.fair_key FROM ONLY notifyq.jobs AS j
         WHERE j.status = 'queued' AND NOT j.group_blocked AND j.fair_key IS NOT NULL
         ORDER BY j.queue, j.priority, j.fair_key LIMIT 1)
        UNION ALL
        SELECT n.queue, n.priority, n.fair_key
        FROM keys AS k
        CROSS JOIN LATERAL (
            SELECT j.queue, j.priority, j.fair_key FROM ONLY notifyq.jobs AS j
            WHERE j.status = 'queued' AND NOT j.group_blocked AND j.fair_key IS NOT NULL
              AND (j.queue, j.priority, j.fair_key) > (k.queue, k.priority, k.fair_key)
            ORDER BY j.queue, j.priority, j.fair_key LIMIT 1) AS n
    ), missing AS (
        SELECT k.queue, k.priority, k.fair_key FROM keys AS k
        WHERE NOT EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                          WHERE l.queue = k.queue AND l.priority = k.priority
                            AND l.fair_key = k.fair_key AND l.idle_since IS NULL)
        UNION ALL
        SELECT DISTINCT f.queue, f.priority, '' FROM notifyq.fair_lanes AS f
        WHERE NOT EXISTS (SELECT 1 FROM notifyq.fair_lanes AS l
                          WHERE l.queue = f.queue AND l.priority = f.priority
                            AND l.fair_key = '' AND l.idle_since IS NULL)
          AND EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS j
                      WHERE j.queue = f.queue AND j.priority = f.priority
                        AND j.status = 'queued' AND NOT j.group_blocked AND j.fair_key IS NULL)
    )
    SELECT array_agg(m.queue) AS queues, array_agg(m.priority) AS priorities,
           array_agg(m.fair_key) AS keys
    INTO v_found FROM missing AS m;
    IF v_found.queues IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM notifyq.open_lanes_v1(v_found.queues, v_found.priorities, v_found.keys);
    RETURN cardinality(v_found.queues);
END;
$$;

-- -- A finished job keeps its key ---------------------------------------------------------------

-- end_jobs_v1, write_completions_v1 and revive_v1 (sql/020) and archive_v1 (sql/020) name the
-- columns they move; these name fair_key too, so that a finished job still says whose it was
-- (notifyq.jobs_done inherits the column; the archive gets its own).
ALTER TABLE notifyq.jobs_archive ADD COLUMN fair_key text;

CREATE OR REPLACE FUNCTION notifyq.end_jobs_v1(p_ids uuid[], p_statuses text[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    WITH ended AS (
        DELETE FROM ONLY notifyq.jobs AS j
        WHERE j.id = ANY(p_ids)
        RETURNING j.*, p_statuses[array_position(p_ids, j.id)] AS final
    )
    INSERT INTO notifyq.jobs_done
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
         lease_expires_at, cancel_requested_at, claims, heartbeat_at, lost_count, depends_on,
         workflow_id, group_key, group_seq, group_blocked, progress, trace_context, ref,
         fair_key)
    SELECT id, task, queue, payload, final, priority, run_at, attempt_count, max_attempts,
           dedup_key, result, last_error, errors, created_at, started_at,
           coalesce(finished_at, now()), worker_id, NULL, cancel_requested_at, claims,
           heartbeat_at, lost_count, depends_on, workflow_id, group_key, group_seq, false,
           progress, trace_context, ref, fair_key
    FROM ended;
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.write_completions_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_results jsonb[]
) RETURNS TABLE (ids uuid[], queues text[], group_keys text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH done AS (
        DELETE FROM ONLY notifyq.jobs AS j
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.*, p_results[array_position(p_ids, j.id)] AS outcome
    ), moved AS (
        INSERT INTO notifyq.jobs_done
            (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
             dedup_key, result, last_error, errors, created_at, started_at, finished_at,
             worker_id, lease_expires_at, cancel_requested_at, claims, heartbeat_at, lost_count,
             depends_on, workflow_id, group_key, group_seq, group_blocked, progress,
             trace_context, ref, fair_key)
        SELECT d.id, d.task, d.queue, d.payload, 'completed', d.priority, d.run_at,
               d.attempt_count, d.max_attempts, d.dedup_key, d.outcome, NULL, d.errors,
               d.created_at, d.started_at, now(), d.worker_id, NULL, d.cancel_requested_at,
               d.claims, d.heartbeat_at, d.lost_count, d.depends_on, d.workflow_id, d.group_key,
               d.group_seq, false, d.progress, d.trace_context, d.ref, d.fair_key
        FROM done AS d
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

-- A job retried goes back into its key's lane: the INSERT opens the lane as any insert does.
CREATE OR REPLACE FUNCTION notifyq.revive_v1(p_id uuid)
RETURNS TABLE (status text, queue text, group_blocked boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_old record;
BEGIN
    SELECT d.claims, d.errors, d.last_error, d.group_seq INTO v_old
    FROM notifyq.jobs_done AS d WHERE d.id = p_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM notifyq.jobs_done AS d WHERE d.id = p_id RETURNING d.*
    )
    INSERT INTO notifyq.jobs (id, task, queue, payload, priority, run_at, max_attempts,
                              dedup_key, created_at, depends_on, workflow_id, group_key,
                              trace_context, ref, fair_key)
    SELECT g.id, g.task, g.queue, g.payload, g.priority, now(), g.max_attempts, g.dedup_key,
           g.created_at, g.depends_on, g.workflow_id, g.group_key, g.trace_context, g.ref,
           g.fair_key
    FROM gone AS g;
    RETURN QUERY
    UPDATE ONLY notifyq.jobs AS j
    SET claims = v_old.claims, errors = v_old.errors, last_error = v_old.last_error,
        group_seq = coalesce(v_old.group_seq, j.group_seq)
    WHERE j.id = p_id
    RETURNING j.status, j.queue, j.group_blocked;
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.archive_v1(p_after float8, p_limit integer) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH moved AS (
        DELETE FROM notifyq.jobs_done AS j
        WHERE j.id IN (SELECT c.id FROM notifyq.jobs_done AS c
                       WHERE c.finished_at < now() - make_interval(secs => p_after)
                         AND NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS w
                                         WHERE w.status IN ('waiting', 'queued')
                                           AND w.depends_on <> '{}'
                                           AND w.depends_on @> ARRAY[c.id])
                       ORDER BY c.finished_at
                       LIMIT p_limit
                       FOR UPDATE SKIP LOCKED)
        RETURNING j.id, j.task, j.queue, j.payload, j.status, j.priority, j.run_at,
                  j.attempt_count, j.max_attempts, j.dedup_key, j.result, j.last_error,
                  j.errors, j.created_at, j.started_at, j.finished_at, j.worker_id,
                  j.cancel_requested_at, j.claims, j.lost_count, j.depends_on, j.group_key,
                  j.workflow_id, j.progress, j.trace_context, j.ref, j.fair_key
    )
    INSERT INTO notifyq.jobs_archive
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
         cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
         trace_context, ref, fair_key)
    SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
           dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
           cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
           trace_context, ref, fair_key
    FROM moved;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END;
$$;

-- A job as GET /jobs/{id} reads it (job_v2, sql/023) with its fair_key, wherever it is: the
-- live and finished jobs (notifyq.jobs and what inherits it), else the archive.
CREATE FUNCTION notifyq.job_v3(p_id uuid)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, status text, priority integer,
               run_at timestamptz, attempt_count integer, max_attempts integer, dedup_key text,
               result jsonb, last_error text, errors jsonb, created_at timestamptz,
               started_at timestamptz, finished_at timestamptz, worker_id text,
               lease_expires_at timestamptz, cancel_requested_at timestamptz,
               depends_on uuid[], group_key text, workflow_id uuid, progress jsonb, ref text,
               archived boolean, suspended_until timestamptz, waiting_for_signal text,
               step_names text[], step_times timestamptz[], fair_key text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT v.*,
           CASE WHEN v.archived
                THEN (SELECT a.fair_key FROM notifyq.jobs_archive AS a WHERE a.id = v.id LIMIT 1)
                ELSE (SELECT j.fair_key FROM notifyq.jobs AS j WHERE j.id = v.id) END
    FROM notifyq.job_v2(p_id) AS v;
$$;

-- -- What the dashboard and the metrics show ----------------------------------------------------

-- The keys with the most jobs queued or running, at most p_limit (1 to 100) of them: each
-- key's queue, its jobs queued and processing, and its weight.
CREATE FUNCTION notifyq.fair_keys_v1(p_limit integer)
RETURNS TABLE (queue text, fair_key text, queued bigint, running bigint, weight float8)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.queue, c.fair_key, c.queued, c.running, coalesce(w.weight, 1)
    FROM (SELECT j.queue, j.fair_key,
                 count(*) FILTER (WHERE j.status = 'queued') AS queued,
                 count(*) FILTER (WHERE j.status = 'processing') AS running
          FROM ONLY notifyq.jobs AS j
          WHERE j.fair_key IS NOT NULL AND j.status IN ('queued', 'processing')
          GROUP BY j.queue, j.fair_key) AS c
    LEFT JOIN notifyq.fair_weights AS w ON w.fair_key = c.fair_key
    ORDER BY c.queued + c.running DESC, c.queue, c.fair_key
    LIMIT least(greatest(p_limit, 1), 100);
$$;

-- -- Who may do what ---------------------------------------------------------------------------

-- Every function here is the worker's but the enqueues, which producers call (`notifyq grant`
-- grants them), and notifyq.enqueue, which anyone may (sql/022).
REVOKE EXECUTE ON FUNCTION notifyq.open_lanes_v1(text[], integer[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.claim_fair_v1(text, integer, timestamptz, uuid, text[], text[],
                                                 integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.tend_lanes_v1() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.mend_lanes_v1() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.fair_keys_v1(integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.job_v3(uuid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.register_task_v2(text, integer, jsonb, integer, float8,
                                                    integer, float8, float8, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.enqueue_v5(text, jsonb, text, integer, timestamptz, float8,
    text, integer, integer, uuid[], text, uuid, uuid, jsonb, text, text, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.enqueue_many_v6(text[], jsonb[], text[], integer[],
    timestamptz[], float8[], text[], integer[], integer, text[], text[], uuid[], uuid[], jsonb,
    text[], text[], text[], float8[]) FROM PUBLIC;

-- Roles granted before this version (notifyq grant) keep working: a worker role (it may update
-- jobs) gets the new tables and functions, a producer role (it may insert jobs) the new
-- enqueues, the column fair_key of its INSERT and the read of a job that shows its key.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.rolname, has_table_privilege(a.oid, 'notifyq.jobs', 'UPDATE') AS worker
        FROM pg_roles AS a
        WHERE NOT a.rolsuper AND a.rolname !~ '^pg_'
          AND a.oid <> (SELECT c.relowner FROM pg_class AS c
                        WHERE c.oid = 'notifyq.jobs'::regclass)
          AND has_any_column_privilege(a.oid, 'notifyq.jobs', 'INSERT')
    LOOP
        EXECUTE format('GRANT INSERT (fair_key) ON notifyq.jobs TO %I', r.rolname);
        EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.enqueue_v5(text, jsonb, text, '
                       'integer, timestamptz, float8, text, integer, integer, uuid[], text, '
                       'uuid, uuid, jsonb, text, text, float8), notifyq.enqueue_many_v6('
                       'text[], jsonb[], text[], integer[], timestamptz[], float8[], text[], '
                       'integer[], integer, text[], text[], uuid[], uuid[], jsonb, text[], '
                       'text[], text[], float8[]), notifyq.job_v3(uuid) TO %I', r.rolname);
        IF r.worker THEN
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.fair_lanes, '
                           'notifyq.fair_weights TO %I', r.rolname);
            EXECUTE format('GRANT EXECUTE ON FUNCTION '
                           'notifyq.open_lanes_v1(text[], integer[], text[]), '
                           'notifyq.claim_fair_v1(text, integer, timestamptz, uuid, text[], '
                           'text[], integer), notifyq.tend_lanes_v1(), notifyq.mend_lanes_v1(), '
                           'notifyq.fair_keys_v1(integer), notifyq.register_task_v2(text, '
                           'integer, jsonb, integer, float8, integer, float8, float8, integer) '
                           'TO %I', r.rolname);
        END IF;
    END LOOP;
END;
$$;
