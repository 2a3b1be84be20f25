-- notifyq schema, version 5: dependencies, workflows, groups, progress and pushed waits.
--
-- - depends_on: a job waits (status 'waiting') until every job it names is completed, then it is
--   queued by the statement that completed the last of them, and its queue is woken by the same
--   gated notification as an insert; a job it names that fails or is cancelled cancels it (and
--   its own dependents), naming the job that ended.
-- - group_key: the jobs of one (queue, group_key) run one at a time, in submission order, across
--   every worker. Only the group's head is claimable: the others are group_blocked and stay out
--   of the claim index, so a busy group costs other work nothing, and the claim needs no check of
--   its own. Whatever ends a head unblocks the next member (settle_v1).
-- - workflow_id ties the jobs of one workflow together; progress holds a running job's progress.
-- - Changes of a job that someone watches (GET /jobs/{id}/events, Queue.wait) are announced on the
--   channel notifyq_job; nothing is sent while nobody watches, so a queue that nobody watches pays
--   one lookup of an empty table per statement.
--
-- Every function that changed gets a new version; the ones an earlier worker calls still work,
-- but an earlier worker knows neither groups nor dependencies: stop them before starting these.

-- -- the jobs table ------------------------------------------------------------------------

ALTER TABLE notifyq.jobs
    DROP CONSTRAINT jobs_status_check,
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('waiting', 'queued', 'processing', 'completed', 'failed', 'cancelled')),
    -- The jobs this one waits for (a producer's column, at most 1,000 of them).
    ADD COLUMN depends_on uuid[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(depends_on) <= 1000),
    ADD COLUMN workflow_id uuid,
    ADD COLUMN group_key text CHECK (length(group_key) BETWEEN 1 AND 512),
    -- The engine's: submission order within a group, and whether an earlier member holds it back.
    ADD COLUMN group_seq bigint,
    ADD COLUMN group_blocked boolean NOT NULL DEFAULT false,
    -- A running job's progress: {"fraction": 0..1 or null, "message": text or null}.
    ADD COLUMN progress jsonb CHECK (progress IS NULL OR jsonb_typeof(progress) = 'object');

CREATE SEQUENCE notifyq.group_seq;

-- The claim index and the index of the next due job leave out the members a group holds back.
DROP INDEX notifyq.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON notifyq.jobs (priority DESC, run_at, id)
    WHERE status = 'queued' AND NOT group_blocked;
DROP INDEX notifyq.jobs_due_idx;
CREATE INDEX jobs_due_idx ON notifyq.jobs (run_at) WHERE status = 'queued' AND NOT group_blocked;
-- At most one job per (queue, dedup_key) that has not started, waiting or queued: a duplicate
-- replaces a waiting job as it replaces a queued one, and a waiting job that becomes queued can
-- never meet a twin.
CREATE UNIQUE INDEX jobs_pending_dedup_idx ON notifyq.jobs (queue, dedup_key)
    WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL;
DROP INDEX notifyq.jobs_dedup_idx;
-- The dependents that have not started, of jobs that just ended (or that retention would
-- delete). Jobs without dependencies stay out of it.
CREATE INDEX jobs_dependents_idx ON notifyq.jobs USING gin (depends_on)
    WHERE status IN ('waiting', 'queued') AND depends_on <> '{}';
-- The pending members of a group, in order.
CREATE INDEX jobs_group_idx ON notifyq.jobs (queue, group_key, group_seq)
    WHERE group_key IS NOT NULL AND status IN ('waiting', 'queued', 'processing');
CREATE INDEX jobs_workflow_idx ON notifyq.jobs (workflow_id) WHERE workflow_id IS NOT NULL;

-- Jobs someone waits on (an event stream, Queue.wait): their changes are announced. UNLOGGED, like
-- waiting_workers: after a crash the watchers register again.
CREATE UNLOGGED TABLE notifyq.watched_jobs (
    job_id     uuid NOT NULL,
    watcher    text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, watcher)
);

-- -- notifications ---------------------------------------------------------------------------

-- Wakes the workers of these queues, but only those that wait (see mark_waiting_v1 for the lock
-- that closes the race with a worker going idle), and never for a queue whose notify switch is
-- off. Inserts, and every job that becomes queued by another job's end, go through here.
CREATE FUNCTION notifyq.notify_queues_v1(p_queues text[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF cardinality(p_queues) IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1852899330);
    -- The common case under load: every worker is busy (and claims as its slots free).
    IF NOT EXISTS (SELECT 1 FROM notifyq.waiting_workers WHERE expires_at > now()) THEN
        RETURN;
    END IF;
    PERFORM pg_notify('notifyq', s.q)
    FROM (SELECT DISTINCT unnest(p_queues) AS q) AS s
    WHERE EXISTS (SELECT 1 FROM notifyq.waiting_workers AS w
                  WHERE w.expires_at > now() AND (w.queues IS NULL OR s.q = ANY(w.queues)))
      AND NOT EXISTS (SELECT 1 FROM notifyq.queues AS x WHERE x.name = s.q AND NOT x.notify);
END;
$$;

-- Statement-level: one look per INSERT, however many rows; only rows a worker may claim now.
CREATE FUNCTION notifyq.notify_inserted_v2() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The common case under load first: every worker is busy. Only then the rows are read.
    PERFORM pg_advisory_xact_lock_shared(1852899330);
    IF NOT EXISTS (SELECT 1 FROM notifyq.waiting_workers WHERE expires_at > now()) THEN
        RETURN NULL;
    END IF;
    PERFORM notifyq.notify_queues_v1(ARRAY(
        SELECT DISTINCT i.queue FROM inserted AS i
        WHERE i.status = 'queued' AND NOT i.group_blocked));
    RETURN NULL;
END;
$$;

-- Tells the watchers of these jobs that they changed (channel notifyq_job, payload the job id),
-- at commit; nothing at all while nobody watches.
CREATE FUNCTION notifyq.announce_v1(p_ids uuid[])
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM notifyq.watched_jobs) THEN
        RETURN;
    END IF;
    PERFORM pg_notify('notifyq_job', w.job_id::text)
    FROM (SELECT DISTINCT job_id FROM notifyq.watched_jobs
          WHERE job_id = ANY(p_ids) AND expires_at > now()) AS w;
END;
$$;

-- Registers (or refreshes) a watch of p_watcher on a job for p_ttl seconds. The race this closes:
-- a statement that changes the job looks for its watchers before this row is committed, and the
-- watcher reads the job before that change is committed. The job's row is locked FOR SHARE here,
-- until this commit: a change in flight is waited for, so that the watcher's next read sees it;
-- a change that comes after waits for this commit, and then sees the watch. A claim may have
-- skipped a queued job while it was locked here: its queue is woken. Answers whether the job
-- exists.
CREATE FUNCTION notifyq.watch_v1(p_job_id uuid, p_watcher text, p_ttl float8)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job record;
BEGIN
    INSERT INTO notifyq.watched_jobs (job_id, watcher, expires_at)
    VALUES (p_job_id, p_watcher, now() + make_interval(secs => p_ttl))
    ON CONFLICT (job_id, watcher) DO UPDATE SET expires_at = EXCLUDED.expires_at;
    SELECT j.status, j.queue, j.group_blocked INTO v_job
    FROM notifyq.jobs AS j WHERE j.id = p_job_id FOR SHARE;
    IF NOT FOUND THEN
        DELETE FROM notifyq.watched_jobs WHERE job_id = p_job_id AND watcher = p_watcher;
        RETURN false;
    END IF;
    IF v_job.status = 'queued' AND NOT v_job.group_blocked THEN
        PERFORM notifyq.notify_queues_v1(ARRAY[v_job.queue]);
    END IF;
    RETURN true;
END;
$$;

-- Keeps the watches of p_watcher on these jobs alive (registering them again if a crash emptied
-- the table).
CREATE FUNCTION notifyq.refresh_watches_v1(p_watcher text, p_ids uuid[], p_ttl float8)
RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO notifyq.watched_jobs (job_id, watcher, expires_at)
    SELECT DISTINCT id, p_watcher, now() + make_interval(secs => p_ttl) FROM unnest(p_ids) AS id
    ON CONFLICT (job_id, watcher) DO UPDATE SET expires_at = EXCLUDED.expires_at;
$$;

CREATE FUNCTION notifyq.unwatch_v1(p_job_id uuid, p_watcher text)
RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM notifyq.watched_jobs WHERE job_id = p_job_id AND watcher = p_watcher;
$$;

-- Deletes what dead processes left: idle marks and watches that expired.
CREATE FUNCTION notifyq.prune_marks_v1()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM notifyq.waiting_workers WHERE expires_at < now();
    DELETE FROM notifyq.watched_jobs WHERE expires_at < now();
END;
$$;

-- -- groups ----------------------------------------------------------------------------------

-- The lock that serialises the changes of one group's membership: an insert that decides whether
-- the new member is blocked, and the end of a head that unblocks the next one, take it, so
-- neither can miss the other. Keys are (nq + 3, hash of the group).
CREATE FUNCTION notifyq.lock_group_v1(p_queue text, p_group_key text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_advisory_xact_lock(1852899331, hashtext(p_queue || chr(31) || p_group_key));
$$;

-- After members of these groups ended: where a group has no unblocked member left that has not
-- ended, its earliest pending member becomes its head. Answers the heads that can be claimed now
-- (queued), for waking their queues.
CREATE FUNCTION notifyq.advance_groups_v1(p_queues text[], p_group_keys text[])
RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    r record;
    v_head uuid;
BEGIN
    FOR r IN
        SELECT DISTINCT g.queue, g.group_key
        FROM unnest(p_queues, p_group_keys) AS g(queue, group_key)
        WHERE g.group_key IS NOT NULL
        ORDER BY 1, 2
    LOOP
        PERFORM notifyq.lock_group_v1(r.queue, r.group_key);
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM notifyq.jobs AS j
            WHERE j.queue = r.queue AND j.group_key = r.group_key
              AND j.status IN ('waiting', 'queued', 'processing') AND NOT j.group_blocked);
        SELECT j.id INTO v_head FROM notifyq.jobs AS j
        WHERE j.queue = r.queue AND j.group_key = r.group_key
          AND j.status IN ('waiting', 'queued') AND j.group_blocked
        ORDER BY j.group_seq
        LIMIT 1;
        CONTINUE WHEN v_head IS NULL;
        RETURN QUERY
        UPDATE notifyq.jobs AS j SET group_blocked = false
        WHERE j.id = v_head
        RETURNING j.id, CASE WHEN j.status = 'queued' THEN j.queue END;
    END LOOP;
END;
$$;

-- -- what an INSERT may say --------------------------------------------------------------------

-- accept_job_v1 (sql/003) and what this version adds: the engine's new columns are refused too;
-- depends_on is checked (every job it names exists, and is locked FOR KEY SHARE until this insert
-- commits, so that none is deleted meanwhile: that lock holds back neither its claim, nor its
-- heartbeats, nor its end) and decides the status (waiting, queued, or cancelled when one of them
-- already failed or was cancelled; recheck_waiting_v1 looks again at commit); a grouped job takes its
-- place in its group, held back while an earlier member has not ended.
CREATE FUNCTION notifyq.accept_job_v2() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
        SELECT count(*) AS found,
               count(*) FILTER (WHERE p.status = 'completed') AS completed,
               (array_agg(p.id ORDER BY p.id)
                    FILTER (WHERE p.status IN ('failed', 'cancelled')))[1] AS ended,
               (array_agg(p.status ORDER BY p.id)
                    FILTER (WHERE p.status IN ('failed', 'cancelled')))[1] AS ended_status
        INTO v_parents
        FROM (SELECT j.id, j.status FROM notifyq.jobs AS j
              WHERE j.id = ANY(NEW.depends_on) ORDER BY j.id FOR KEY SHARE) AS p;
        IF v_parents.found < cardinality(NEW.depends_on) THEN
            RAISE EXCEPTION 'notifyq.jobs: depends_on names job(s) that do not exist: %',
                array_to_string(ARRAY(
                    SELECT d FROM unnest(NEW.depends_on) AS d
                    WHERE NOT EXISTS (SELECT 1 FROM notifyq.jobs AS j WHERE j.id = d)), ', ')
                USING ERRCODE = 'foreign_key_violation';
        END IF;
        IF v_parents.ended IS NOT NULL THEN
            NEW.status := 'cancelled';
            NEW.finished_at := now();
            NEW.last_error := format('cancelled: job %s, which it depends on, %s', v_parents.ended,
                                     CASE WHEN v_parents.ended_status = 'failed' THEN 'failed'
                                          ELSE 'was cancelled' END);
        ELSIF v_parents.completed < v_parents.found THEN
            NEW.status := 'waiting';
        END IF;
    END IF;
    IF NEW.group_key IS NOT NULL THEN
        PERFORM notifyq.lock_group_v1(NEW.queue, NEW.group_key);
        NEW.group_seq := nextval('notifyq.group_seq');
        NEW.group_blocked := NEW.status <> 'cancelled' AND EXISTS (
            SELECT 1 FROM notifyq.jobs AS g
            WHERE g.queue = NEW.queue AND g.group_key = NEW.group_key
              AND g.status IN ('waiting', 'queued', 'processing'));
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER jobs_accept ON notifyq.jobs;
CREATE TRIGGER jobs_accept
    BEFORE INSERT ON notifyq.jobs
    FOR EACH ROW
    WHEN (NEW.task IS NULL OR NEW.queue IS NULL OR NEW.priority IS NULL
          OR NEW.max_attempts IS NULL
          OR NEW.status IS DISTINCT FROM 'queued' OR NEW.attempt_count <> 0 OR NEW.claims <> 0
          OR NEW.lost_count <> 0 OR NEW.worker_id IS NOT NULL
          OR NEW.lease_expires_at IS NOT NULL OR NEW.heartbeat_at IS NOT NULL
          OR NEW.started_at IS NOT NULL OR NEW.finished_at IS NOT NULL
          OR NEW.result IS NOT NULL OR NEW.last_error IS NOT NULL
          OR NEW.errors IS DISTINCT FROM '[]'::jsonb OR NEW.cancel_requested_at IS NOT NULL
          OR NOT NEW.run_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
          OR NOT NEW.created_at BETWEEN '1900-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00'
          OR cardinality(NEW.depends_on) > 0 OR NEW.group_key IS NOT NULL
          OR NEW.group_seq IS NOT NULL OR NEW.group_blocked OR NEW.progress IS NOT NULL)
    EXECUTE FUNCTION notifyq.accept_job_v2();

DROP TRIGGER jobs_notify_inserted ON notifyq.jobs;
CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON notifyq.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION notifyq.notify_inserted_v2();

-- At the commit of an insert of a waiting job: its parents again, each locked FOR SHARE for that
-- moment. The race this closes: a parent ends while the child is being inserted, and neither
-- sees the other (the end looks for waiting children before the child commits; the insert read
-- the parent before the end committed). Here, an end in flight is waited for and then seen (the
-- child is queued, or cancelled, at once); an end that comes after waits for this commit, and
-- then sees the child. A parent still queued may have been skipped by a claim while this insert
-- held it: its queue is woken.
CREATE FUNCTION notifyq.recheck_waiting_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parents record;
    v_child record;
BEGIN
    SELECT count(*) AS found,
           count(*) FILTER (WHERE p.status = 'completed') AS completed,
           (array_agg(p.id ORDER BY p.id)
                FILTER (WHERE p.status IN ('failed', 'cancelled')))[1] AS ended,
           (array_agg(p.status ORDER BY p.id)
                FILTER (WHERE p.status IN ('failed', 'cancelled')))[1] AS ended_status,
           array_agg(DISTINCT p.queue) FILTER (WHERE p.status = 'queued'
                                               AND NOT p.group_blocked) AS queued
    INTO v_parents
    FROM (SELECT j.id, j.status, j.queue, j.group_blocked FROM notifyq.jobs AS j
          WHERE j.id = ANY(NEW.depends_on) ORDER BY j.id FOR SHARE) AS p;
    PERFORM notifyq.notify_queues_v1(v_parents.queued);
    IF v_parents.ended IS NOT NULL THEN
        UPDATE notifyq.jobs AS j
        SET status = 'cancelled', finished_at = now(),
            last_error = format('cancelled: job %s, which it depends on, %s', v_parents.ended,
                                CASE WHEN v_parents.ended_status = 'failed' THEN 'failed'
                                     ELSE 'was cancelled' END)
        WHERE j.id = NEW.id AND j.status = 'waiting'
        RETURNING j.queue, j.group_key INTO v_child;
        IF FOUND THEN
            PERFORM notifyq.settle_v1(ARRAY[NEW.id], ARRAY[v_child.queue],
                                      ARRAY[v_child.group_key]);
        END IF;
    ELSIF v_parents.completed = v_parents.found THEN
        UPDATE notifyq.jobs AS j SET status = 'queued'
        WHERE j.id = NEW.id AND j.status = 'waiting'
        RETURNING j.queue, j.group_blocked INTO v_child;
        IF FOUND THEN
            IF NOT v_child.group_blocked THEN
                PERFORM notifyq.notify_queues_v1(ARRAY[v_child.queue]);
            END IF;
            PERFORM notifyq.announce_v1(ARRAY[NEW.id]);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER jobs_recheck_waiting
    AFTER INSERT ON notifyq.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status = 'waiting')
    EXECUTE FUNCTION notifyq.recheck_waiting_v1();

-- -- the end of a job ------------------------------------------------------------------------

-- What follows the end of these jobs (each now completed, failed or cancelled): their groups move
-- on to the next member; their waiting dependents that now have every job they need completed are
-- queued; those with a job that failed or was cancelled are cancelled, naming it, and so on down
-- (a dependent cancelled here ends too). The queues of every job that became claimable are woken;
-- the watchers of every job changed are told. Called by every statement that ends a job, in the
-- same transaction.
--
-- A child's parents may end at once in two transactions: each locks the waiting children first
-- (in id order), then looks at their parents in a statement of its own, so the second sees what
-- the first committed and queues the child. A child whose insert commits while its parent ends is
-- seen by one of the two: see recheck_waiting_v1.
CREATE FUNCTION notifyq.settle_v1(p_ids uuid[], p_queues text[], p_group_keys text[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = on
AS $$
DECLARE
    v_ended uuid[] := p_ids;
    -- The groups of the jobs that ended (pairs of queue and group_key; jobs without a group
    -- are left out), as the caller's own UPDATE answered them.
    v_queues text[] := p_queues;
    v_keys text[] := p_group_keys;
    v_woken text[] := ARRAY[]::text[];
    v_told uuid[] := ARRAY[]::uuid[];
BEGIN
    WHILE cardinality(v_ended) > 0 LOOP
        v_told := v_told || v_ended;
        -- Groups: the next member becomes the head.
        IF cardinality(v_keys) > 0 THEN
            SELECT v_woken || coalesce(array_agg(a.queue) FILTER (WHERE a.queue IS NOT NULL),
                                       '{}')
            INTO v_woken
            FROM notifyq.advance_groups_v1(v_queues, v_keys) AS a;
        END IF;
        EXIT WHEN NOT EXISTS (SELECT 1 FROM notifyq.jobs AS c
                              WHERE c.status = 'waiting' AND c.depends_on <> '{}'
                                AND c.depends_on && v_ended);
        PERFORM 1 FROM notifyq.jobs AS c
        WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
        ORDER BY c.id FOR NO KEY UPDATE;
        -- Dependents with every job they need completed: queued.
        WITH ready AS (
            UPDATE notifyq.jobs AS c SET status = 'queued'
            WHERE c.status = 'waiting' AND c.depends_on <> '{}' AND c.depends_on && v_ended
              AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS p
                              WHERE p.id = ANY(c.depends_on) AND p.status <> 'completed')
            RETURNING c.id, c.queue, c.group_blocked
        )
        SELECT v_woken || coalesce(array_agg(r.queue) FILTER (WHERE NOT r.group_blocked), '{}'),
               v_told || coalesce(array_agg(r.id), '{}')
        INTO v_woken, v_told
        FROM ready AS r;
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
    PERFORM notifyq.notify_queues_v1(v_woken);
    PERFORM notifyq.announce_v1(v_told);
END;
$$;

-- -- enqueueing ------------------------------------------------------------------------------

-- A job that has not started (waiting or queued) with this (queue, dedup_key), if any: the newer
-- submission, which replaces a job going back to the queue with the same key.
CREATE FUNCTION notifyq.pending_duplicate_v1(p_queue text, p_dedup_key text) RETURNS uuid
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT id FROM notifyq.jobs
    WHERE p_dedup_key IS NOT NULL AND queue = p_queue AND dedup_key = p_dedup_key
      AND status IN ('waiting', 'queued');
$$;

-- enqueue_v2 (sql/003) and: depends_on, group_key and workflow_id, and the job's own id when the
-- caller chose it (a workflow's jobs name each other). The duplicate rule covers waiting jobs too.
CREATE FUNCTION notifyq.enqueue_v3(
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
    p_id uuid
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_new_id uuid := coalesce(p_id, gen_random_uuid());
    v_payload jsonb := coalesce(p_payload, '{}'::jsonb);
    v_job record;
    d record;
BEGIN
    SELECT * INTO d
    FROM notifyq.job_defaults_v1(ARRAY[p_task], ARRAY[v_payload], ARRAY[p_queue],
                                 ARRAY[p_priority], ARRAY[p_max_attempts], p_fallback);
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts, depends_on,
             group_key, workflow_id)
        VALUES (v_new_id, d.task, v_payload, d.queue, d.priority,
                coalesce(p_run_at, now() + make_interval(secs => coalesce(p_delay, 0))),
                p_dedup_key, d.max_attempts, coalesce(p_depends_on, '{}'), p_group_key,
                p_workflow_id)
        ON CONFLICT (queue, dedup_key)
            WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL
        DO UPDATE SET payload = EXCLUDED.payload,
                      priority = EXCLUDED.priority,
                      run_at = EXCLUDED.run_at,
                      max_attempts = EXCLUDED.max_attempts
            WHERE j.status IN ('waiting', 'queued')
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at, j.group_blocked INTO v_job;
        EXIT WHEN FOUND;
    END LOOP;
    IF v_job.id <> v_new_id THEN
        -- A replaced job may now be due earlier than the time its workers sleep until.
        IF v_job.status = 'queued' AND NOT v_job.group_blocked THEN
            PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
        END IF;
        PERFORM notifyq.announce_v1(ARRAY[v_job.id]);
    END IF;
    RETURN QUERY SELECT v_job.id, v_job.id <> v_new_id, v_job.status, v_job.run_at,
                        v_job.created_at;
END;
$$;

-- Earlier versions, for callers of theirs: now the same as enqueue_v3 (their duplicate rule
-- would loop for ever on a waiting duplicate, which the unique index now covers).
CREATE OR REPLACE FUNCTION notifyq.enqueue_v2(
    p_task text, p_payload jsonb, p_queue text, p_priority integer, p_run_at timestamptz,
    p_delay float8, p_dedup_key text, p_max_attempts integer, p_fallback integer
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM notifyq.enqueue_v3(p_task, p_payload, p_queue, p_priority, p_run_at, p_delay,
                                     p_dedup_key, p_max_attempts, p_fallback, NULL, NULL, NULL,
                                     NULL);
$$;

CREATE OR REPLACE FUNCTION notifyq.enqueue_v1(
    p_task text, p_payload jsonb, p_queue text, p_priority integer, p_run_at timestamptz,
    p_dedup_key text, p_max_attempts integer
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM notifyq.enqueue_v3(p_task, p_payload, p_queue, p_priority, p_run_at, NULL,
                                     p_dedup_key, p_max_attempts, NULL, NULL, NULL, NULL, NULL);
$$;

-- enqueue_many_v2 (sql/003) with the columns of enqueue_v3: p_depends_on holds each job's list as
-- an array literal ('{}' or NULL for none: arrays of arrays must be rectangular), and p_ids each
-- job's own id or NULL. Rows without a dedup_key go in as one INSERT ... SELECT, in input order
-- (so that a job may name an earlier one of the same batch); rows with one go through
-- enqueue_v3, in input order. A batch with both dedup keys and group keys goes row by row, so
-- that its jobs take their places in their groups in the batch's order.
CREATE FUNCTION notifyq.enqueue_many_v3(
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
    p_ids uuid[]
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
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT u.ord, coalesce(u.id, gen_random_uuid()) AS id,
               coalesce(u.payload, '{}'::jsonb) AS payload,
               coalesce(u.run_at, now() + make_interval(secs => coalesce(u.delay, 0))) AS run_at,
               coalesce(u.depends_on::uuid[], '{}') AS depends_on, u.group_key, u.workflow_id,
               u.dedup_key
        FROM ROWS FROM (unnest(p_payloads), unnest(p_run_ats), unnest(p_delays),
                        unnest(p_dedup_keys), unnest(p_depends_on), unnest(p_group_keys),
                        unnest(p_workflow_ids), unnest(p_ids)) WITH ORDINALITY
             AS u(payload, run_at, delay, dedup_key, depends_on, group_key, workflow_id, id, ord)
    ), inserted AS (
        INSERT INTO notifyq.jobs (id, task, payload, queue, priority, run_at, max_attempts,
                                  depends_on, group_key, workflow_id)
        SELECT i.id, d.task, i.payload, d.queue, d.priority, i.run_at, d.max_attempts,
               i.depends_on, i.group_key, i.workflow_id
        FROM input AS i
        JOIN notifyq.job_defaults_v1(p_tasks, p_payloads, p_queues, p_priorities,
                                     p_max_attempts, p_fallback) AS d ON d.ord = i.ord
        WHERE i.dedup_key IS NULL AND NOT v_row_by_row
        ORDER BY i.ord
        RETURNING id, status, created_at
    )
    SELECT i.ord::integer, i.id, false, x.status, i.run_at, x.created_at
    FROM input AS i JOIN inserted AS x ON x.id = i.id;

    IF p_dedup_keys IS NOT NULL THEN
        FOR r IN
            SELECT u.*
            FROM ROWS FROM (unnest(p_tasks), unnest(p_payloads), unnest(p_queues),
                            unnest(p_priorities), unnest(p_run_ats), unnest(p_delays),
                            unnest(p_dedup_keys), unnest(p_max_attempts), unnest(p_depends_on),
                            unnest(p_group_keys), unnest(p_workflow_ids), unnest(p_ids))
                 WITH ORDINALITY
                 AS u(task, payload, queue, priority, run_at, delay, dedup_key, max_attempts,
                      depends_on, group_key, workflow_id, id, ord)
            WHERE u.dedup_key IS NOT NULL OR v_row_by_row
            ORDER BY u.ord
        LOOP
            RETURN QUERY
            SELECT r.ord::integer, e.job_id, e.duplicate, e.status, e.run_at, e.created_at
            FROM notifyq.enqueue_v3(r.task, r.payload, r.queue, r.priority, r.run_at, r.delay,
                                    r.dedup_key, r.max_attempts, p_fallback,
                                    r.depends_on::uuid[], r.group_key, r.workflow_id, r.id) AS e;
        END LOOP;
    END IF;
END;
$$;

-- The SQL face, with the new arguments (a new signature: the old one is dropped, and a call by
-- name, such as notifyq.enqueue('echo', '{}', queue => 'mail'), works as before).
DROP FUNCTION notifyq.enqueue(text, jsonb, text, integer, timestamptz, text, integer);
CREATE FUNCTION notifyq.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    depends_on uuid[] DEFAULT NULL,
    group_key text DEFAULT NULL
) RETURNS uuid
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.job_id FROM notifyq.enqueue_v3(task, payload, queue, priority, run_at, NULL,
                                            dedup_key, max_attempts, NULL, depends_on, group_key,
                                            NULL, NULL) AS e;
$$;

CREATE OR REPLACE FUNCTION notifyq.enqueue_tick_v2(p_task text, p_tick timestamptz, p_payload jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job_id uuid;
BEGIN
    INSERT INTO notifyq.periodic_ticks (name, tick) VALUES (p_task, p_tick)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT e.job_id INTO v_job_id
    FROM notifyq.enqueue_v3(p_task, p_payload, NULL, NULL, p_tick, NULL, NULL, NULL, NULL, NULL,
                            NULL, NULL, NULL) AS e;
    UPDATE notifyq.periodic_ticks SET job_id = v_job_id WHERE name = p_task AND tick = p_tick;
    RETURN v_job_id;
END;
$$;

-- -- claiming ----------------------------------------------------------------------------------

-- start_jobs_v1 (sql/003) and: the claimed job's progress starts empty, its watchers are told,
-- and it answers the results of the jobs it depended on (a handler's ctx.dependencies), in the
-- same statement.
CREATE FUNCTION notifyq.start_jobs_v2(p_worker_id text, p_ids uuid[], p_lease float8)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
               attempt_count integer, max_attempts integer, claims integer,
               created_at float8, run_at float8, dependencies jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE notifyq.jobs AS j
    SET status = 'processing',
        attempt_count = j.attempt_count + 1,
        claims = j.claims + 1,
        started_at = now(),
        finished_at = NULL,
        heartbeat_at = NULL,
        progress = NULL,
        worker_id = p_worker_id,
        lease_expires_at = now() + make_interval(secs => p_lease)
    WHERE j.id = ANY(p_ids)
    RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
              j.claims, extract(epoch FROM j.created_at)::float8,
              extract(epoch FROM j.run_at)::float8,
              CASE WHEN cardinality(j.depends_on) > 0 THEN
                  (SELECT jsonb_object_agg(p.id::text, p.result) FROM notifyq.jobs AS p
                   WHERE p.id = ANY(j.depends_on))
              END;
    PERFORM notifyq.announce_v1(p_ids);
END;
$$;

-- claim_v2 (sql/003), on the claim index that leaves out the members a group holds back: a group
-- costs the claim nothing, and its head is claimed like any other job.
CREATE FUNCTION notifyq.claim_v3(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET enable_bitmapscan = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_ids uuid[];
BEGIN
    v_ids := ARRAY(
        SELECT j.id
        FROM notifyq.jobs AS j
        WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
          AND j.task = ANY(p_tasks)
          AND (p_queues IS NULL OR j.queue = ANY(p_queues))
          AND (p_probe OR j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                                         WHERE t.breaker_open_until IS NOT NULL))
          AND j.queue NOT IN (SELECT q.name FROM notifyq.queues AS q
                              WHERE q.paused OR q.rate_limit IS NOT NULL)
          AND j.task NOT IN (SELECT t.name FROM notifyq.tasks AS t
                             WHERE t.max_concurrency IS NOT NULL OR t.rate_limit IS NOT NULL)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT p_limit
        FOR NO KEY UPDATE SKIP LOCKED);
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM notifyq.start_jobs_v2(p_worker_id, v_ids, p_lease);
END;
$$;

-- claim_limited_v2 (sql/003), with the group rule of claim_v3 and the start of start_jobs_v2.
CREATE FUNCTION notifyq.claim_limited_v3(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
                SELECT count(*) FROM notifyq.jobs AS j
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
        SELECT j.id, j.task, j.queue
        FROM notifyq.jobs AS j
        WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at <= now()
          AND j.task = ANY(p_tasks)
          AND (p_queues IS NULL OR j.queue = ANY(p_queues))
          AND (v_task_room ? j.task OR v_queue_room ? j.queue)
          AND j.queue NOT IN (SELECT name FROM notifyq.queues WHERE paused)
          AND j.task NOT IN (SELECT name FROM notifyq.tasks
                             WHERE breaker_open_until IS NOT NULL
                                OR ((max_concurrency IS NOT NULL OR rate_limit IS NOT NULL)
                                    AND NOT v_task_room ? name))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT greatest(p_limit * 4, 100)
        FOR NO KEY UPDATE SKIP LOCKED
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
        SELECT * FROM notifyq.start_jobs_v2(p_worker_id, v_ids, p_lease)
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

-- -- writing what happened -------------------------------------------------------------------

-- complete_v2 (sql/003), and what follows the end of the jobs completed (settle_v1): their
-- dependents and groups move on in the same transaction.
CREATE FUNCTION notifyq.complete_v3(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_results jsonb[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_done record;
BEGIN
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
    SELECT array_agg(done.id) AS ids,
           array_agg(done.queue) FILTER (WHERE done.group_key IS NOT NULL) AS queues,
           array_agg(done.group_key) FILTER (WHERE done.group_key IS NOT NULL) AS group_keys
    INTO v_done FROM done;
    IF v_done.ids IS NOT NULL THEN
        PERFORM notifyq.settle_v1(v_done.ids, v_done.queues, v_done.group_keys);
        RETURN QUERY SELECT unnest(v_done.ids);
    END IF;
END;
$$;

-- fail_v2 (sql/003); a job that failed for good ends (settle_v1); one that goes back keeps its
-- place at the head of its group.
CREATE FUNCTION notifyq.fail_v3(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_errors text[],
    p_retryable boolean[], p_delays float8[]
) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_rows record;
BEGIN
    WITH d AS (
        SELECT d.*,
               j.attempt_count < j.max_attempts AND d.retryable
                   AND j.cancel_requested_at IS NULL AS wants_retry,
               notifyq.pending_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM unnest(p_ids, p_claims, p_errors, p_retryable, p_delays)
             AS d(id, claim, error, retryable, delay)
        JOIN notifyq.jobs AS j ON j.id = d.id
    ), failed AS (
        UPDATE notifyq.jobs AS j
        SET status = CASE WHEN d.wants_retry AND d.newer IS NULL THEN 'queued' ELSE 'failed' END,
            run_at = CASE WHEN d.wants_retry AND d.newer IS NULL
                          THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.wants_retry AND d.newer IS NULL THEN NULL ELSE now() END,
            worker_id = CASE WHEN d.wants_retry AND d.newer IS NULL THEN NULL ELSE j.worker_id END,
            lease_expires_at = NULL,
            last_error = CASE WHEN d.wants_retry AND d.newer IS NOT NULL
                              THEN d.error || format(E'\nnot retried: job %s with the same '
                                                     'dedup_key is queued and replaces it',
                                                     d.newer)
                              ELSE d.error END,
            errors = notifyq.append_error_v1(j.errors, j.attempt_count, d.error, j.worker_id)
        FROM d
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.status, j.task, d.retryable, j.queue, j.group_key
    ), counted AS (
        UPDATE notifyq.tasks AS t
        SET consecutive_failures = t.consecutive_failures + f.n,
            breaker_open_until = CASE
                WHEN t.consecutive_failures + f.n >= t.breaker_threshold
                THEN now() + make_interval(secs => t.breaker_cooldown)
                ELSE t.breaker_open_until END
        FROM (SELECT failed.task, count(*) AS n FROM failed WHERE failed.retryable
              GROUP BY failed.task) AS f
        WHERE t.name = f.task AND t.breaker_threshold IS NOT NULL
    )
    SELECT array_agg(failed.id) FILTER (WHERE failed.status = 'failed') AS ended,
           array_agg(failed.queue) FILTER (WHERE failed.status = 'failed'
                                           AND failed.group_key IS NOT NULL) AS queues,
           array_agg(failed.group_key) FILTER (WHERE failed.status = 'failed'
                                               AND failed.group_key IS NOT NULL) AS group_keys,
           array_agg(failed.id) FILTER (WHERE failed.status = 'queued') AS again,
           array_agg(failed.id) AS ids, array_agg(failed.status) AS statuses
    INTO v_rows FROM failed;
    IF v_rows.ended IS NOT NULL THEN
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.queues, v_rows.group_keys);
    END IF;
    IF v_rows.again IS NOT NULL THEN
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses);
END;
$$;


-- release_v2 (sql/003); a job cancelled instead of released ends (settle_v1).
CREATE FUNCTION notifyq.release_v3(p_worker_id text, p_ids uuid[], p_claims integer[])
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_rows record;
BEGIN
    WITH d AS (
        SELECT d.*,
               notifyq.pending_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM unnest(p_ids, p_claims) AS d(id, claim)
        JOIN notifyq.jobs AS j ON j.id = d.id
    ), released AS (
        UPDATE notifyq.jobs AS j
        SET status = CASE WHEN d.newer IS NULL AND j.cancel_requested_at IS NULL
                          THEN 'queued' ELSE 'cancelled' END,
            attempt_count = j.attempt_count - 1,
            run_at = now(),
            finished_at = CASE WHEN d.newer IS NULL AND j.cancel_requested_at IS NULL
                               THEN NULL ELSE now() END,
            worker_id = NULL,
            lease_expires_at = NULL,
            last_error = CASE WHEN j.cancel_requested_at IS NOT NULL
                              THEN 'cancelled while running (its worker was stopping)'
                              WHEN d.newer IS NOT NULL
                              THEN format('interrupted by a stopping worker; not requeued: job %s '
                                          'with the same dedup_key is queued', d.newer)
                              ELSE j.last_error END
        FROM d
        WHERE j.id = d.id AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id,
                                               d.claim)
        RETURNING j.id, j.queue, j.status, j.group_key
    )
    SELECT array_agg(r.id) AS ids,
           array_agg(r.id) FILTER (WHERE r.status = 'cancelled') AS ended,
           array_agg(r.queue) FILTER (WHERE r.status = 'cancelled'
                                      AND r.group_key IS NOT NULL) AS ended_queues,
           array_agg(r.group_key) FILTER (WHERE r.status = 'cancelled'
                                          AND r.group_key IS NOT NULL) AS ended_keys,
           array_agg(r.id) FILTER (WHERE r.status = 'queued') AS again,
           array_agg(DISTINCT r.queue) FILTER (WHERE r.status = 'queued') AS queues
    INTO v_rows FROM released AS r;
    IF v_rows.queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    IF v_rows.ended IS NOT NULL THEN
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.ended_queues, v_rows.ended_keys);
    END IF;
    RETURN QUERY SELECT unnest(v_rows.ids);
END;
$$;


-- Records attempts stopped by a cancel request; fenced by notifyq.holds_v1; they end.
CREATE FUNCTION notifyq.cancel_running_v3(p_worker_id text, p_ids uuid[], p_claims integer[])
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_ended record;
BEGIN
    WITH stopped AS (
        UPDATE notifyq.jobs AS j
        SET status = 'cancelled',
            finished_at = now(),
            lease_expires_at = NULL,
            last_error = format('cancelled while running attempt %s', j.attempt_count)
        FROM unnest(p_ids, p_claims) AS d(id, claim)
        WHERE j.id = d.id
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
        RETURNING j.id, j.queue, j.group_key
    )
    SELECT array_agg(x.id) AS ids,
           array_agg(x.queue) FILTER (WHERE x.group_key IS NOT NULL) AS queues,
           array_agg(x.group_key) FILTER (WHERE x.group_key IS NOT NULL) AS group_keys
    INTO v_ended FROM stopped AS x;
    IF v_ended.ids IS NOT NULL THEN
        PERFORM notifyq.settle_v1(v_ended.ids, v_ended.queues, v_ended.group_keys);
        RETURN QUERY SELECT unnest(v_ended.ids);
    END IF;
END;
$$;

-- A handler that raised Snooze: the job goes back to the queue to run again in p_delays seconds,
-- the attempt not counted, the lease released; fenced by notifyq.holds_v1. It keeps its place at
-- the head of its group.
CREATE FUNCTION notifyq.snooze_v1(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_delays float8[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_rows record;
BEGIN
    WITH snoozed AS (
        UPDATE notifyq.jobs AS j
        SET status = 'queued',
            run_at = now() + make_interval(secs => d.delay),
            attempt_count = greatest(j.attempt_count - 1, 0),
            worker_id = NULL,
            lease_expires_at = NULL,
            heartbeat_at = NULL
        FROM unnest(p_ids, p_claims, p_delays) AS d(id, claim, delay)
        WHERE j.id = d.id
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
        RETURNING j.id, j.queue
    )
    SELECT array_agg(x.id) AS ids, array_agg(DISTINCT x.queue) AS queues INTO v_rows
    FROM snoozed AS x;
    IF v_rows.ids IS NOT NULL THEN
        -- Idle workers sleep until the next run_at they know: it may be later than this one.
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.ids);
        RETURN QUERY SELECT unnest(v_rows.ids);
    END IF;
END;
$$;

-- Records the progress of running jobs ({"fraction", "message"}); fenced by notifyq.holds_v1.
-- Workers send it at most a few times a second per job, however often a handler reports.
CREATE FUNCTION notifyq.progress_v1(
    p_worker_id text, p_ids uuid[], p_claims integer[], p_fractions float8[], p_messages text[]
) RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    v_ids uuid[];
BEGIN
    WITH reported AS (
        UPDATE notifyq.jobs AS j
        SET progress = jsonb_build_object('fraction', d.fraction, 'message', d.message)
        FROM unnest(p_ids, p_claims, p_fractions, p_messages) AS d(id, claim, fraction, message)
        WHERE j.id = d.id
          AND notifyq.holds_v1(j.status, j.worker_id, j.claims, p_worker_id, d.claim)
        RETURNING j.id
    )
    SELECT array_agg(x.id) INTO v_ids FROM reported AS x;
    IF v_ids IS NOT NULL THEN
        PERFORM notifyq.announce_v1(v_ids);
        RETURN QUERY SELECT unnest(v_ids);
    END IF;
END;
$$;

-- -- rescuing and cancelling -----------------------------------------------------------------

-- rescue_v2 (sql/003); jobs that end in the rescue (failed, cancelled) end (settle_v1).
CREATE FUNCTION notifyq.rescue_v3(p_limit integer)
RETURNS TABLE (id uuid, status text, counted boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_rows record;
BEGIN
    WITH expired AS (
        SELECT j.id,
               j.heartbeat_at IS NOT NULL OR j.lost_count >= j.max_attempts AS counted,
               notifyq.pending_duplicate_v1(j.queue, j.dedup_key) AS newer
        FROM notifyq.jobs AS j
        WHERE j.status = 'processing'
          AND (j.lease_expires_at < now() OR j.lease_expires_at IS NULL)
        ORDER BY j.lease_expires_at NULLS FIRST
        LIMIT p_limit
        FOR NO KEY UPDATE SKIP LOCKED
    ), judged AS (
        SELECT e.id, e.counted, e.newer,
               CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                    WHEN e.newer IS NOT NULL THEN 'failed'
                    WHEN e.counted AND j.attempt_count >= j.max_attempts THEN 'failed'
                    ELSE 'queued' END AS next
        FROM expired AS e JOIN notifyq.jobs AS j ON j.id = e.id
    ), rescued AS (
        UPDATE notifyq.jobs AS j
        SET status = x.next,
            attempt_count = CASE WHEN x.counted THEN j.attempt_count
                                 ELSE greatest(j.attempt_count - 1, 0) END,
            lost_count = CASE WHEN x.counted THEN j.lost_count ELSE j.lost_count + 1 END,
            run_at = now(),
            finished_at = CASE WHEN x.next = 'queued' THEN NULL ELSE now() END,
            lease_expires_at = NULL,
            worker_id = CASE WHEN x.next = 'queued' THEN NULL ELSE j.worker_id END,
            last_error = format('lease expired: worker %s stopped renewing attempt %s of %s%s',
                                coalesce(j.worker_id, '(none)'), j.attempt_count, j.max_attempts,
                                CASE WHEN x.newer IS NOT NULL
                                     THEN format('; not retried: job %s with the same dedup_key '
                                                 'is queued', x.newer)
                                     WHEN NOT x.counted
                                     THEN '; its handler was never confirmed running, so the '
                                          'attempt was not counted'
                                     WHEN x.next = 'failed' THEN '; no attempts left'
                                     ELSE '' END),
            errors = notifyq.append_error_v1(
                j.errors, j.attempt_count,
                format('lease expired: worker %s stopped renewing the lease%s',
                       coalesce(j.worker_id, '(none)'),
                       CASE WHEN x.counted THEN ''
                            ELSE ' before its handler was confirmed running (not counted)' END),
                j.worker_id)
        FROM judged AS x
        WHERE j.id = x.id
        RETURNING j.id, j.queue, j.status, x.counted, j.group_key
    )
    SELECT array_agg(r.id) AS ids, array_agg(r.status) AS statuses, array_agg(r.counted) AS counted,
           array_agg(r.id) FILTER (WHERE r.status <> 'queued') AS ended,
           array_agg(r.queue) FILTER (WHERE r.status <> 'queued'
                                      AND r.group_key IS NOT NULL) AS ended_queues,
           array_agg(r.group_key) FILTER (WHERE r.status <> 'queued'
                                          AND r.group_key IS NOT NULL) AS ended_keys,
           array_agg(r.id) FILTER (WHERE r.status = 'queued') AS again,
           array_agg(DISTINCT r.queue) FILTER (WHERE r.status = 'queued') AS queues
    INTO v_rows FROM rescued AS r;
    IF v_rows.queues IS NOT NULL THEN
        PERFORM notifyq.wake_v1(v_rows.queues);
        PERFORM notifyq.announce_v1(v_rows.again);
    END IF;
    IF v_rows.ended IS NOT NULL THEN
        PERFORM notifyq.settle_v1(v_rows.ended, v_rows.ended_queues, v_rows.ended_keys);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows.ids, v_rows.statuses, v_rows.counted);
END;
$$;


-- cancel_job_v1 (sql/003); a waiting job is cancelled at once like a queued one, and a job that
-- ends here ends (settle_v1: its dependents are cancelled too, its group moves on).
CREATE FUNCTION notifyq.cancel_job_v2(p_id uuid)
RETURNS TABLE (was text, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_held boolean;
BEGIN
    SELECT j.status, j.lease_expires_at, j.cancel_requested_at, j.queue, j.group_key INTO v_job
    FROM notifyq.jobs AS j WHERE j.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_held := v_job.status = 'processing'
              AND coalesce(v_job.lease_expires_at > now(), false);
    IF v_job.status IN ('queued', 'waiting') OR (v_job.status = 'processing' AND NOT v_held) THEN
        UPDATE notifyq.jobs AS j
        SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
            cancel_requested_at = coalesce(j.cancel_requested_at, now()),
            last_error = CASE WHEN v_job.status IN ('queued', 'waiting')
                              THEN 'cancelled before it ran'
                              ELSE 'cancelled while no live worker held it (its lease had '
                                   'run out)' END
        WHERE j.id = p_id;
        PERFORM notifyq.settle_v1(ARRAY[p_id], ARRAY[v_job.queue], ARRAY[v_job.group_key]);
        RETURN QUERY SELECT v_job.status, 'cancelled'::text;
    ELSIF v_held THEN
        IF v_job.cancel_requested_at IS NULL THEN
            UPDATE notifyq.jobs AS j SET cancel_requested_at = now() WHERE j.id = p_id;
        END IF;
        PERFORM pg_notify('notifyq_cancel', p_id::text);
        PERFORM notifyq.announce_v1(ARRAY[p_id]);
        RETURN QUERY SELECT v_job.status, v_job.status;
    ELSE
        RETURN QUERY SELECT v_job.status, v_job.status;
    END IF;
END;
$$;


-- Requeues a failed or cancelled job with its attempts reset (its error history stays): queued
-- when every job it depends on is completed, waiting while some have not ended; in its group,
-- held back while another member has not ended. Answers the status it has now and, when it was
-- not requeued, why: it is not failed or cancelled; a newer job with its dedup_key has not
-- started (that one replaces it); a job it depends on failed or was cancelled (retry that one
-- first). Nothing for an unknown id.
CREATE FUNCTION notifyq.retry_v1(p_id uuid)
RETURNS TABLE (status text, refused text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_newer uuid;
    v_ended uuid;
    v_next text;
    v_blocked boolean := false;
BEGIN
    SELECT j.status, j.queue, j.dedup_key, j.depends_on, j.group_key INTO v_job
    FROM notifyq.jobs AS j WHERE j.id = p_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_job.status NOT IN ('failed', 'cancelled') THEN
        RETURN QUERY SELECT v_job.status,
            format('it is %s; only failed or cancelled jobs go back', v_job.status);
        RETURN;
    END IF;
    v_newer := notifyq.pending_duplicate_v1(v_job.queue, v_job.dedup_key);
    IF v_newer IS NOT NULL THEN
        RETURN QUERY SELECT v_job.status,
            format('job %s with the same queue and dedup_key %L has not started and replaces it',
                   v_newer, v_job.dedup_key);
        RETURN;
    END IF;
    SELECT p.id INTO v_ended FROM notifyq.jobs AS p
    WHERE p.id = ANY(v_job.depends_on) AND p.status IN ('failed', 'cancelled')
    ORDER BY p.id LIMIT 1;
    IF v_ended IS NOT NULL THEN
        RETURN QUERY SELECT v_job.status,
            format('job %s, which it depends on, failed or was cancelled: retry it first',
                   v_ended);
        RETURN;
    END IF;
    v_next := CASE WHEN EXISTS (SELECT 1 FROM notifyq.jobs AS p
                                WHERE p.id = ANY(v_job.depends_on) AND p.status <> 'completed')
                   THEN 'waiting' ELSE 'queued' END;
    IF v_job.group_key IS NOT NULL THEN
        PERFORM notifyq.lock_group_v1(v_job.queue, v_job.group_key);
        v_blocked := EXISTS (SELECT 1 FROM notifyq.jobs AS g
                             WHERE g.queue = v_job.queue AND g.group_key = v_job.group_key
                               AND g.status IN ('waiting', 'queued', 'processing')
                               AND g.id <> p_id);
    END IF;
    UPDATE notifyq.jobs AS j
    SET status = v_next, attempt_count = 0, lost_count = 0, run_at = now(), started_at = NULL,
        finished_at = NULL, heartbeat_at = NULL, worker_id = NULL, lease_expires_at = NULL,
        result = NULL, cancel_requested_at = NULL, progress = NULL, group_blocked = v_blocked
    WHERE j.id = p_id;
    IF v_next = 'queued' AND NOT v_blocked THEN
        PERFORM notifyq.wake_v1(ARRAY[v_job.queue]);
    END IF;
    PERFORM notifyq.announce_v1(ARRAY[p_id]);
    RETURN QUERY SELECT v_next, NULL::text;
END;
$$;

-- -- the worker's other statements -----------------------------------------------------------

-- next_due_v1 (sql/004), leaving out the members a group holds back.
CREATE FUNCTION notifyq.next_due_v2(p_tasks text[], p_queues text[])
RETURNS float8
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT extract(epoch FROM min(j.run_at) - now())::float8
    FROM notifyq.jobs AS j
    WHERE j.status = 'queued' AND NOT j.group_blocked AND j.run_at > now()
      AND j.task = ANY(p_tasks)
      AND (p_queues IS NULL OR j.queue = ANY(p_queues));
$$;

-- prune_v1 (sql/004), never deleting a job that a job which has not started yet depends on (a
-- completed one's result becomes that job's ctx.dependencies).
CREATE FUNCTION notifyq.prune_v2(p_status text, p_keep float8, p_limit integer)
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
                   AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS c
                                   WHERE c.status IN ('waiting', 'queued')
                                     AND c.depends_on <> '{}' AND c.depends_on @> ARRAY[j.id])
                 ORDER BY j.finished_at
                 LIMIT p_limit
                 FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END;
$$;
