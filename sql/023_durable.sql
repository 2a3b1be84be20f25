-- notifyq schema, version 23: durable jobs. A handler may record steps (ctx.step), whose results
-- later attempts and resumptions of the same job reuse without running them again, and may
-- suspend its job (ctx.sleep, ctx.wait_for_signal) without holding a worker slot.
--
-- A suspended job is a live row of notifyq.jobs with status 'suspended': no worker, no lease,
-- its attempt given back (as a snooze), outside the claim index, so it holds no slot and counts
-- in no concurrency limit (those count 'processing' rows). It becomes 'queued' again in one of
-- two ways, and then the rules of any queued job apply (the floors' trigger, the claim):
--   - a signal it waits for commits (notifyq.signal_v1): that statement requeues it and wakes
--     the idle workers of its queue, as an insert does;
--   - its time comes (suspended_until, a sleep's end or a wait's timeout): the claim of a
--     worker serving its task requeues it in the claim's own statement (claim_v4), and a
--     worker's sleep ends at the earliest suspended_until of its tasks (next_due_v3).
-- Nothing polls: a suspended job costs a claim one probe of an index of suspended jobs.
--
-- Steps (and the marks of sleeps and waits) are rows of notifyq.job_steps, signals rows of
-- notifyq.job_signals, both keyed by (job_id, name) and removed with their job from the
-- history (retention, archive).

-- -- The new status and its columns ------------------------------------------------------------

ALTER TABLE notifyq.jobs
    -- When a suspended job is due again (NULL: when its signal comes, and only then).
    ADD COLUMN suspended_until timestamptz,
    -- The signal a suspended job waits for.
    ADD COLUMN waiting_for_signal text;

ALTER TABLE notifyq.jobs DROP CONSTRAINT jobs_live_statuses;
ALTER TABLE notifyq.jobs ADD CONSTRAINT jobs_live_statuses
    CHECK (status IN ('waiting', 'queued', 'processing', 'suspended')) NO INHERIT;
-- Only a suspended job says what it waits for; an INSERT cannot set either column (it starts
-- queued, and this refuses the row).
ALTER TABLE notifyq.jobs ADD CONSTRAINT jobs_suspension
    CHECK ((status = 'suspended' OR (suspended_until IS NULL AND waiting_for_signal IS NULL))
           AND (waiting_for_signal IS NULL OR char_length(waiting_for_signal) BETWEEN 1 AND 200)
           AND (suspended_until IS NULL
                OR suspended_until BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'))
    NO INHERIT;

-- The suspended jobs by the time they are due: the claim's probe, the worker's look for its
-- next wake-up, and the dashboard's list of them read this.
CREATE INDEX jobs_suspended_idx ON notifyq.jobs (suspended_until)
    WHERE status = 'suspended';

-- A suspended job is still its group's head: the next member waits until it ends.
DROP INDEX notifyq.jobs_group_idx;
CREATE INDEX jobs_group_idx ON notifyq.jobs (queue, group_key, group_seq)
    WHERE group_key IS NOT NULL AND status IN ('waiting', 'queued', 'processing', 'suspended');

-- The rules of a job's columns know the new status (refuse_row_v1 below says which was broken).
DROP TRIGGER jobs_check ON notifyq.jobs;
CREATE TRIGGER jobs_check BEFORE INSERT OR UPDATE OF task, queue, payload, priority, run_at, max_attempts, dedup_key, created_at, depends_on, workflow_id, group_key, trace_context, ref ON notifyq.jobs FOR EACH ROW WHEN ((NOT (((length(new.task) >= 1) AND (length(new.task) <= 200)) AND ((length(new.queue) >= 1) AND (length(new.queue) <= 200)) AND (jsonb_typeof(new.payload) = 'object'::text) AND (new.status = ANY (ARRAY['waiting'::text, 'queued'::text, 'processing'::text, 'completed'::text, 'failed'::text, 'cancelled'::text, 'suspended'::text])) AND (new.attempt_count >= 0) AND (new.max_attempts >= 1) AND (new.claims >= 0) AND (new.lost_count >= 0) AND (cardinality(new.depends_on) <= 1000) AND ((new.group_key IS NULL) OR ((length(new.group_key) >= 1) AND (length(new.group_key) <= 512))) AND ((new.progress IS NULL) OR (jsonb_typeof(new.progress) = 'object'::text)) AND ((new.trace_context IS NULL) OR ((jsonb_typeof(new.trace_context) = 'object'::text) AND (octet_length((new.trace_context)::text) <= 1024))) AND ((new.ref IS NULL) OR ((new.workflow_id IS NOT NULL) AND ((char_length(new.ref) >= 1) AND (char_length(new.ref) <= 200)))) AND ((new.run_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.run_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)) AND ((new.created_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.created_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)) AND ((new.started_at IS NULL) OR ((new.started_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.started_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.finished_at IS NULL) OR ((new.finished_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.finished_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.lease_expires_at IS NULL) OR ((new.lease_expires_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.lease_expires_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.heartbeat_at IS NULL) OR ((new.heartbeat_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.heartbeat_at <= '9999-01-01 00:00:00+00'::timestamp with time zone))) AND ((new.cancel_requested_at IS NULL) OR ((new.cancel_requested_at >= '1900-01-01 00:00:00+00'::timestamp with time zone) AND (new.cancel_requested_at <= '9999-01-01 00:00:00+00'::timestamp with time zone)))))) EXECUTE FUNCTION notifyq.refuse_row_v1();

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

-- accept_job_v2 (sql/020): a suspended member of a group still blocks the members inserted after it.
CREATE OR REPLACE FUNCTION notifyq.accept_job_v2() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_owned text[] := ARRAY[]::text[];
    v_defaults record;
    v_parents record;
BEGIN
    IF NEW.status IS DISTINCT FROM 'queued' THEN v_owned := v_owned || 'status'::text; END IF;
    IF NEW.attempt_count <> 0 THEN v_owned := v_owned || 'attempt_count'::text; END IF;
    IF NEW.claims <> 0 THEN v_owned := v_owned || 'claims'::text; END IF;
    IF NEW.lost_count <> 0 THEN v_owned := v_owned || 'lost_count'::text; END IF;
    IF NEW.worker_id IS NOT NULL THEN v_owned := v_owned || 'worker_id'::text; END IF;
    IF NEW.lease_expires_at IS NOT NULL THEN
        v_owned := v_owned || 'lease_expires_at'::text;
    END IF;
    IF NEW.heartbeat_at IS NOT NULL THEN v_owned := v_owned || 'heartbeat_at'::text; END IF;
    IF NEW.started_at IS NOT NULL THEN v_owned := v_owned || 'started_at'::text; END IF;
    IF NEW.finished_at IS NOT NULL THEN v_owned := v_owned || 'finished_at'::text; END IF;
    IF NEW.result IS NOT NULL THEN v_owned := v_owned || 'result'::text; END IF;
    IF NEW.last_error IS NOT NULL THEN v_owned := v_owned || 'last_error'::text; END IF;
    IF NEW.errors IS DISTINCT FROM '[]'::jsonb THEN v_owned := v_owned || 'errors'::text; END IF;
    IF NEW.cancel_requested_at IS NOT NULL THEN
        v_owned := v_owned || 'cancel_requested_at'::text;
    END IF;
    IF NEW.group_seq IS NOT NULL THEN v_owned := v_owned || 'group_seq'::text; END IF;
    IF NEW.group_blocked THEN v_owned := v_owned || 'group_blocked'::text; END IF;
    IF NEW.progress IS NOT NULL THEN v_owned := v_owned || 'progress'::text; END IF;
    IF cardinality(v_owned) > 0 THEN
        RAISE EXCEPTION 'notifyq.jobs: % % set by notifyq''s workers, not by an INSERT',
                        array_to_string(v_owned, ', '),
                        CASE WHEN cardinality(v_owned) = 1 THEN 'is' ELSE 'are' END
            USING ERRCODE = 'check_violation',
                  HINT = 'Insert the task and payload (and queue, priority, run_at, dedup_key, '
                         'max_attempts, depends_on, group_key, workflow_id) only.';
    END IF;
    IF NOT NEW.run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'notifyq.jobs: run_at must be a finite time between the years 1900 and '
                        '9998, not %', NEW.run_at
            USING ERRCODE = 'datetime_field_overflow';
    END IF;
    IF NOT NEW.created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'notifyq.jobs: created_at must be a finite time between the years 1900 '
                        'and 9998, not %', NEW.created_at
            USING ERRCODE = 'datetime_field_overflow';
    END IF;
    IF NEW.task IS NULL OR NEW.queue IS NULL OR NEW.priority IS NULL
       OR NEW.max_attempts IS NULL THEN
        SELECT d.task, d.queue, d.priority, d.max_attempts INTO v_defaults
        FROM notifyq.job_defaults_v1(ARRAY[NEW.task], ARRAY[NEW.payload], ARRAY[NEW.queue],
                                     ARRAY[NEW.priority], ARRAY[NEW.max_attempts], NULL) AS d;
        NEW.task := v_defaults.task;
        NEW.queue := v_defaults.queue;
        NEW.priority := v_defaults.priority;
        NEW.max_attempts := v_defaults.max_attempts;
    END IF;
    IF cardinality(NEW.depends_on) > 0 THEN
        NEW.depends_on := ARRAY(SELECT DISTINCT d FROM unnest(NEW.depends_on) AS d ORDER BY d);
        IF NEW.id = ANY(NEW.depends_on) THEN
            RAISE EXCEPTION 'notifyq.jobs: job % cannot depend on itself', NEW.id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        -- Parents that have finished are locked (FOR KEY SHARE) so that retention cannot delete
        -- them before this insert commits; live ones cannot be deleted, and are looked at again
        -- at commit (recheck_waiting_v1). Both tables in one statement, so a parent that
        -- finishes meanwhile is counted once; one that a statement waited for (a retry moving
        -- it back) is read again by the next.
        FOR v_try IN 1..2 LOOP
            SELECT count(*) AS found,
                   count(*) FILTER (WHERE p.status = 'completed') AS completed,
                   bool_or(p.status IN ('failed', 'cancelled')) AS ended
            INTO v_parents
            FROM (SELECT d.id, d.status
                  FROM (SELECT d.id, d.status FROM notifyq.jobs_done AS d
                        WHERE d.id = ANY(NEW.depends_on) ORDER BY d.id FOR KEY SHARE) AS d
                  UNION ALL
                  SELECT j.id, j.status FROM ONLY notifyq.jobs AS j
                  WHERE j.id = ANY(NEW.depends_on)) AS p;
            EXIT WHEN v_parents.found >= cardinality(NEW.depends_on);
        END LOOP;
        IF v_parents.found < cardinality(NEW.depends_on) THEN
            RAISE EXCEPTION 'notifyq.jobs: depends_on names job(s) that do not exist: %',
                array_to_string(ARRAY(
                    SELECT d FROM unnest(NEW.depends_on) AS d
                    WHERE NOT EXISTS (SELECT 1 FROM notifyq.jobs AS j WHERE j.id = d)), ', ')
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        -- A job whose parent failed or was cancelled waits too: an INSERT cannot put it among
        -- the finished jobs. The enqueue functions cancel it at once (doom_waiting_v1), the
        -- check at commit otherwise.
        IF v_parents.ended OR v_parents.completed < v_parents.found THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.group_key IS NOT NULL THEN
        PERFORM notifyq.lock_group_v1(NEW.queue, NEW.group_key);
        NEW.group_seq := nextval('notifyq.group_seq');
        NEW.group_blocked := EXISTS (
            SELECT 1 FROM ONLY notifyq.jobs AS g
            WHERE g.queue = NEW.queue AND g.group_key = NEW.group_key
              AND g.status IN ('waiting', 'queued', 'processing', 'suspended'));
    END IF;
    RETURN NEW;
END;
$$;

-- advance_groups_v1 (sql/020): a suspended head keeps its group's next member blocked.
CREATE OR REPLACE FUNCTION notifyq.advance_groups_v1(p_queues text[], p_group_keys text[]) RETURNS TABLE(id uuid, queue text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM notifyq.lock_group_v1(g.queue, g.group_key)
    FROM (SELECT DISTINCT u.queue, u.group_key
          FROM unnest(p_queues, p_group_keys) AS u(queue, group_key)
          WHERE u.group_key IS NOT NULL
          ORDER BY 1, 2) AS g;
    RETURN QUERY
    WITH groups AS (
        SELECT DISTINCT u.queue, u.group_key
        FROM unnest(p_queues, p_group_keys) AS u(queue, group_key)
        WHERE u.group_key IS NOT NULL
    ), heads AS (
        SELECT (SELECT j.id FROM ONLY notifyq.jobs AS j
                WHERE j.queue = g.queue AND j.group_key = g.group_key
                  AND j.status IN ('waiting', 'queued') AND j.group_blocked
                ORDER BY j.group_seq
                LIMIT 1) AS id
        FROM groups AS g
        WHERE (SELECT true FROM ONLY notifyq.jobs AS j
               WHERE j.queue = g.queue AND j.group_key = g.group_key
                 AND j.status IN ('waiting', 'queued', 'processing', 'suspended')
                 AND NOT j.group_blocked
               LIMIT 1) IS NULL
    )
    UPDATE ONLY notifyq.jobs AS j SET group_blocked = false
    FROM heads AS h
    WHERE j.id = h.id
    RETURNING j.id, CASE WHEN j.status = 'queued' THEN j.queue END;
END;
$$;

-- cancel_job_v2 (sql/020): a suspended job is cancelled at once, as a queued one is.
CREATE OR REPLACE FUNCTION notifyq.cancel_job_v2(p_id uuid) RETURNS TABLE(was text, status text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_found boolean := false;
    v_held boolean;
BEGIN
    FOR v_try IN 1..2 LOOP
        SELECT j.status, j.lease_expires_at, j.cancel_requested_at, j.queue, j.group_key
        INTO v_job
        FROM notifyq.jobs AS j WHERE j.id = p_id FOR NO KEY UPDATE;
        v_found := FOUND;
        EXIT WHEN v_found;
    END LOOP;
    IF NOT v_found THEN
        RETURN;
    END IF;
    v_held := v_job.status = 'processing'
              AND coalesce(v_job.lease_expires_at > now(), false);
    IF v_job.status IN ('queued', 'waiting', 'suspended')
       OR (v_job.status = 'processing' AND NOT v_held) THEN
        UPDATE ONLY notifyq.jobs AS j
        SET finished_at = now(), lease_expires_at = NULL,
            cancel_requested_at = coalesce(j.cancel_requested_at, now()),
            suspended_until = NULL, waiting_for_signal = NULL,
            last_error = CASE WHEN v_job.status IN ('queued', 'waiting')
                              THEN 'cancelled before it ran'
                              WHEN v_job.status = 'suspended'
                              THEN 'cancelled while suspended'
                              ELSE 'cancelled while no live worker held it (its lease had '
                                   'run out)' END
        WHERE j.id = p_id;
        PERFORM notifyq.end_jobs_v1(ARRAY[p_id], ARRAY['cancelled']);
        PERFORM notifyq.settle_v1(ARRAY[p_id], ARRAY[v_job.queue], ARRAY[v_job.group_key]);
        RETURN QUERY SELECT v_job.status, 'cancelled'::text;
    ELSIF v_held THEN
        IF v_job.cancel_requested_at IS NULL THEN
            UPDATE ONLY notifyq.jobs AS j SET cancel_requested_at = now() WHERE j.id = p_id;
        END IF;
        PERFORM pg_notify('notifyq_cancel', p_id::text);
        PERFORM notifyq.announce_v1(ARRAY[p_id]);
        RETURN QUERY SELECT v_job.status, v_job.status;
    ELSE
        RETURN QUERY SELECT v_job.status, v_job.status;
    END IF;
END;
$$;


-- -- Steps and signals -----------------------------------------------------------------------

-- kind: 'step' (ctx.step: its result), 'sleep' (the n-th ctx.sleep of a run: {"until": epoch}),
-- 'wait' (a ctx.wait_for_signal: {"until": epoch or null}). Written only by the worker that
-- holds the job (record_step_v1, suspend_v1), fenced by its claim.
CREATE TABLE notifyq.job_steps (
    job_id uuid NOT NULL,
    name text NOT NULL,
    kind text NOT NULL DEFAULT 'step',
    result jsonb,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, name, kind),
    CONSTRAINT job_steps_kind CHECK (kind IN ('step', 'sleep', 'wait')),
    CONSTRAINT job_steps_name CHECK (char_length(name) BETWEEN 1 AND 200),
    -- The bound of notifyq.context.MAX_STEP_RESULT_BYTES, for rows written by hand too.
    CONSTRAINT job_steps_result CHECK (octet_length(result::text) <= 1048576)
);

-- The first signal of each name sent to a job; a later one of the same name changes nothing.
CREATE TABLE notifyq.job_signals (
    job_id uuid NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name),
    CONSTRAINT job_signals_name CHECK (char_length(name) BETWEEN 1 AND 200),
    CONSTRAINT job_signals_payload CHECK (jsonb_typeof(payload) = 'object'
                                          AND octet_length(payload::text) <= 65536)
);

-- A job's steps and signals go when it leaves the history (retention's delete, the archive's
-- move). A retry by hand moves a job out of notifyq.jobs_done and back in one statement: it
-- keeps them, so its steps still run once.
CREATE FUNCTION notifyq.forget_durable_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM notifyq.job_steps) OR EXISTS (SELECT 1 FROM notifyq.job_signals) THEN
        DELETE FROM notifyq.job_steps AS s USING deleted AS d
        WHERE s.job_id = d.id AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS j WHERE j.id = d.id);
        DELETE FROM notifyq.job_signals AS s USING deleted AS d
        WHERE s.job_id = d.id AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS j WHERE j.id = d.id);
    END IF;
    RETURN NULL;
END;
$$;
REVOKE EXECUTE ON FUNCTION notifyq.forget_durable_v1() FROM PUBLIC;

CREATE TRIGGER jobs_done_forget_durable AFTER DELETE ON notifyq.jobs_done
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION notifyq.forget_durable_v1();

-- What a job's handler finds when it first asks (ctx.step, ctx.sleep, ctx.wait_for_signal): its
-- steps and marks, the signals sent to it, and the database's time (marks are in its clock).
CREATE FUNCTION notifyq.durable_state_v1(p_job_id uuid)
RETURNS TABLE (kind text, name text, value jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.kind, s.name, s.result FROM notifyq.job_steps AS s WHERE s.job_id = p_job_id
    UNION ALL
    SELECT 'signal', g.name, g.payload FROM notifyq.job_signals AS g WHERE g.job_id = p_job_id
    UNION ALL
    SELECT 'now', '', to_jsonb(extract(epoch FROM clock_timestamp())::float8);
$$;

-- Stores a step's result, only while p_worker_id holds the job with claim p_claim: 'written',
-- 'exists' (the first result of that name stays), or 'refused' (the lease was lost). The job's
-- row is locked FOR SHARE meanwhile, so no rescue requeues it before the step commits: a worker
-- that claims it afterwards reads the step.
CREATE FUNCTION notifyq.record_step_v1(
    p_worker_id text,
    p_job_id uuid,
    p_claim integer,
    p_name text,
    p_result jsonb
) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM ONLY notifyq.jobs AS j
    WHERE j.id = p_job_id
      AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, p_claim)
    FOR SHARE;
    IF NOT FOUND THEN
        RETURN 'refused';
    END IF;
    INSERT INTO notifyq.job_steps (job_id, name, kind, result)
    VALUES (p_job_id, p_name, 'step', p_result)
    ON CONFLICT DO NOTHING;
    RETURN CASE WHEN FOUND THEN 'written' ELSE 'exists' END;
END;
$$;

-- Suspends jobs their worker holds (fenced like every outcome): each until p_delays[i] seconds
-- from now (NULL: no time), waiting for signal p_signals[i] (or none), its mark p_marks[i]
-- (kind p_kinds[i]: 'sleep' or 'wait') written with the time it is due. The attempt is given
-- back, as a snooze does. A job whose signal committed while this waited for its row (a signal
-- locks the row first) goes back to the queue at once, and so does one due already; one whose
-- cancel was asked while it ran ends cancelled. Answers each job written with its status.
CREATE FUNCTION notifyq.suspend_v1(
    p_worker_id text,
    p_ids uuid[],
    p_claims integer[],
    p_delays float8[],
    p_signals text[],
    p_marks text[],
    p_kinds text[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
    v_doomed record;
    v_woken record;
BEGIN
    WITH suspended AS (
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'suspended',
            suspended_until = now() + make_interval(
                secs => p_delays[array_position(p_ids, j.id)]),
            waiting_for_signal = p_signals[array_position(p_ids, j.id)],
            attempt_count = greatest(j.attempt_count - 1, 0),
            worker_id = NULL,
            lease_expires_at = NULL,
            heartbeat_at = NULL
        WHERE j.id = ANY(p_ids)
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                               p_claims[array_position(p_ids, j.id)])
        RETURNING j.id, j.suspended_until
    ), marked AS (
        INSERT INTO notifyq.job_steps (job_id, name, kind, result)
        SELECT s.id, p_marks[array_position(p_ids, s.id)], p_kinds[array_position(p_ids, s.id)],
               jsonb_build_object('until', extract(epoch FROM s.suspended_until))
        FROM suspended AS s
        WHERE p_marks[array_position(p_ids, s.id)] IS NOT NULL
        ON CONFLICT DO NOTHING
    )
    SELECT array_agg(s.id) INTO v_ids FROM suspended AS s;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    -- A cancel asked while the handler ran (and its worker had not stopped it yet) reaches the
    -- job here: it ends cancelled, as a suspended job that is cancelled does.
    WITH doomed AS (
        UPDATE ONLY notifyq.jobs AS j
        SET finished_at = now(), suspended_until = NULL, waiting_for_signal = NULL,
            last_error = 'cancelled while suspended'
        WHERE j.id = ANY(v_ids) AND j.cancel_requested_at IS NOT NULL
        RETURNING j.id, j.queue, j.group_key
    )
    SELECT array_agg(d.id) AS ids, array_agg(d.queue) AS queues,
           array_agg(d.group_key) AS group_keys
    INTO v_doomed FROM doomed AS d;
    IF v_doomed.ids IS NOT NULL THEN
        PERFORM notifyq.end_jobs_v1(v_doomed.ids,
                                    array_fill('cancelled'::text,
                                               ARRAY[cardinality(v_doomed.ids)]));
        PERFORM notifyq.settle_v1(v_doomed.ids, v_doomed.queues, v_doomed.group_keys);
    END IF;
    WITH woken AS (
        UPDATE ONLY notifyq.jobs AS j
        SET status = 'queued', run_at = now(), suspended_until = NULL, waiting_for_signal = NULL
        WHERE j.id = ANY(v_ids) AND j.status = 'suspended'
          AND (j.suspended_until <= now()
               OR EXISTS (SELECT 1 FROM notifyq.job_signals AS g
                          WHERE g.job_id = j.id AND g.name = j.waiting_for_signal))
          AND (j.dedup_key IS NULL
               OR NOT EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS d
                              WHERE d.queue = j.queue AND d.dedup_key = j.dedup_key
                                AND d.status IN ('waiting', 'queued')))
        RETURNING j.queue
    )
    SELECT array_agg(DISTINCT w.queue) AS queues INTO v_woken FROM woken AS w;
    IF v_woken.queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_woken.queues);
    END IF;
    PERFORM notifyq.announce_v1(v_ids);
    RETURN QUERY SELECT j.id, j.status FROM notifyq.jobs AS j WHERE j.id = ANY(v_ids);
END;
$$;

-- Sends signal p_name with p_payload to job p_job_id: 'sent'; 'duplicate' when one of that
-- name came first (it stays, this changes nothing; also once the job has ended); 'unknown' for
-- no such job; 'final' for a job that has ended (and got no signal of that name); 'too_many' when the job holds MAX_SIGNALS (100) names already. A job
-- suspended waiting for it goes back to the queue in this transaction, and the idle workers of
-- its queue are woken at its commit. The job's row is locked first, so that a suspension in
-- flight either commits before (and is undone here) or waits for this commit (and sees it).
CREATE FUNCTION notifyq.signal_v1(p_job_id uuid, p_name text, p_payload jsonb)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job record;
BEGIN
    IF p_name IS NULL OR char_length(p_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'notifyq.signal: a signal''s name must be 1 to 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_payload IS NOT NULL AND (jsonb_typeof(p_payload) <> 'object'
                                  OR octet_length(p_payload::text) > 65536) THEN
        RAISE EXCEPTION 'notifyq.signal: the payload must be a JSON object of 64 KiB at most'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT j.status, j.waiting_for_signal, j.queue, j.dedup_key INTO v_job
    FROM ONLY notifyq.jobs AS j WHERE j.id = p_job_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        -- Ended (or ending while this waited for its row: a new statement sees it done). A
        -- repeat of a signal it got is still a duplicate (a webhook's retry is not an error).
        IF EXISTS (SELECT 1 FROM notifyq.job_signals AS g
                   WHERE g.job_id = p_job_id AND g.name = p_name) THEN
            RETURN 'duplicate';
        END IF;
        IF EXISTS (SELECT 1 FROM notifyq.jobs_done AS d WHERE d.id = p_job_id)
           OR EXISTS (SELECT 1 FROM notifyq.jobs_archive AS a WHERE a.id = p_job_id) THEN
            RETURN 'final';
        END IF;
        RETURN 'unknown';
    END IF;
    IF EXISTS (SELECT 1 FROM notifyq.job_signals AS g
               WHERE g.job_id = p_job_id AND g.name = p_name) THEN
        RETURN 'duplicate';
    END IF;
    IF (SELECT count(*) FROM notifyq.job_signals AS g WHERE g.job_id = p_job_id) >= 100 THEN
        RETURN 'too_many';
    END IF;
    INSERT INTO notifyq.job_signals (job_id, name, payload)
    VALUES (p_job_id, p_name, coalesce(p_payload, '{}'::jsonb));
    IF v_job.status = 'suspended' AND v_job.waiting_for_signal = p_name THEN
        IF v_job.dedup_key IS NOT NULL
           AND EXISTS (SELECT 1 FROM ONLY notifyq.jobs AS d
                       WHERE d.queue = v_job.queue AND d.dedup_key = v_job.dedup_key
                         AND d.status IN ('waiting', 'queued')) THEN
            -- A queued job took its dedup_key: it resumes at the first claim after that one
            -- started.
            UPDATE ONLY notifyq.jobs AS j SET suspended_until = now() WHERE j.id = p_job_id;
        ELSE
            UPDATE ONLY notifyq.jobs AS j
            SET status = 'queued', run_at = now(), suspended_until = NULL,
                waiting_for_signal = NULL
            WHERE j.id = p_job_id;
            PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
        END IF;
        PERFORM notifyq.announce_v1(ARRAY[p_job_id]);
    END IF;
    RETURN 'sent';
END;
$$;

-- For psql users: SELECT notifyq.signal(job_id, 'name', '{"k": 1}'::jsonb). True when sent,
-- false when a signal of that name came first; an error for a job that does not exist or has
-- ended.
CREATE FUNCTION notifyq.signal(job_id uuid, name text, payload jsonb DEFAULT '{}')
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_outcome text := notifyq.signal_v1(job_id, name, payload);
BEGIN
    IF v_outcome = 'unknown' THEN
        RAISE EXCEPTION 'notifyq.signal: no job %', job_id USING ERRCODE = 'no_data_found';
    ELSIF v_outcome = 'final' THEN
        RAISE EXCEPTION 'notifyq.signal: job % has ended', job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    ELSIF v_outcome = 'too_many' THEN
        RAISE EXCEPTION 'notifyq.signal: job % has received 100 signals, the most it may', job_id
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN v_outcome = 'sent';
END;
$$;
-- psql users send signals (the contract's function, as notifyq.enqueue is: PUBLIC's); the
-- definer writes for them, only what a signal writes. Queue.signal calls signal_v1, which
-- `notifyq grant` gives producers and workers.
GRANT EXECUTE ON FUNCTION notifyq.signal(uuid, text, jsonb) TO PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.signal_v1(uuid, text, jsonb) FROM PUBLIC;

-- A job by its id (job_v1, sql/022) with what a suspended job waits for and the names and
-- times of its steps in the order they finished: the read GET /jobs/{id}, Queue.get and a
-- producer (which may not read the tables) make.
CREATE FUNCTION notifyq.job_v2(p_id uuid)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, status text, priority integer,
               run_at timestamptz, attempt_count integer, max_attempts integer, dedup_key text,
               result jsonb, last_error text, errors jsonb, created_at timestamptz,
               started_at timestamptz, finished_at timestamptz, worker_id text,
               lease_expires_at timestamptz, cancel_requested_at timestamptz,
               depends_on uuid[], group_key text, workflow_id uuid, progress jsonb, ref text,
               archived boolean, suspended_until timestamptz, waiting_for_signal text,
               step_names text[], step_times timestamptz[])
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT v.*, j.suspended_until, j.waiting_for_signal, s.names, s.times
    FROM notifyq.job_v1(p_id) AS v
    LEFT JOIN ONLY notifyq.jobs AS j ON j.id = v.id
    CROSS JOIN LATERAL (
        SELECT array_agg(k.name ORDER BY k.finished_at, k.name) AS names,
               array_agg(k.finished_at ORDER BY k.finished_at, k.name) AS times
        FROM notifyq.job_steps AS k
        WHERE k.job_id = v.id AND k.kind = 'step') AS s;
$$;

-- -- Finding suspended jobs due ----------------------------------------------------------------

-- next_due_v3 (sql/020) also counts the suspended jobs of these tasks that have a time: a
-- worker's sleep ends when the first of them is due, and its claim then requeues it.
CREATE OR REPLACE FUNCTION notifyq.next_due_v3(p_tasks text[], p_queues text[])
RETURNS float8
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN extract(epoch FROM least(
        (SELECT min(j.run_at)
         FROM ONLY notifyq.jobs AS j
         WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at > j.created_at
           AND j.run_at > now()
           AND j.task = ANY(p_tasks)
           AND (p_queues IS NULL OR j.queue = ANY(p_queues))),
        (SELECT min(s.suspended_until)
         FROM ONLY notifyq.jobs AS s
         WHERE s.status = 'suspended' AND s.suspended_until > now()
           AND s.task = ANY(p_tasks)
           AND (p_queues IS NULL OR s.queue = ANY(p_queues)))) - now())::float8;
END;
$$;

-- claim_v4 (sql/021), which first requeues the suspended jobs of its tasks that are due.
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
    -- Suspended jobs whose time has come (a sleep over, a signal's wait timed out) become
    -- queued here, in the statement of the claim that takes them: nothing else polls for them,
    -- and the worker's sleep ends at the earliest of them (next_due_v3). The look for one is a
    -- probe of an index that holds suspended jobs only. A resumed job whose dedup_key a queued
    -- job took meanwhile waits for that one to start (the unique index would refuse it).
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

-- -- Who may do what ---------------------------------------------------------------------------

-- The worker's functions are the worker's (`notifyq grant ROLE --as worker` grants them).
REVOKE EXECUTE ON FUNCTION notifyq.durable_state_v1(uuid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.record_step_v1(text, uuid, integer, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.suspend_v1(text, uuid[], integer[], float8[], text[], text[],
                                               text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.forget_durable_v1() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION notifyq.job_v2(uuid) FROM PUBLIC;

-- Roles granted before this version (notifyq grant) keep working: a worker role (it may update
-- jobs) gets the new tables and functions, a producer role (it may insert jobs) the read of a
-- job that shows its steps (job_v2; a producer reads jobs only through these, sql/022).
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
        IF r.worker THEN
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON notifyq.job_steps, '
                           'notifyq.job_signals TO %I', r.rolname);
            EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.durable_state_v1(uuid), '
                           'notifyq.record_step_v1(text, uuid, integer, text, jsonb), '
                           'notifyq.suspend_v1(text, uuid[], integer[], float8[], text[], '
                           'text[], text[]) TO %I', r.rolname);
            EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.job_v2(uuid), '
                           'notifyq.signal_v1(uuid, text, jsonb) TO %I', r.rolname);
        ELSE
            EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.job_v2(uuid), '
                           'notifyq.signal_v1(uuid, text, jsonb) TO %I', r.rolname);
        END IF;
    END LOOP;
END;
$$;
