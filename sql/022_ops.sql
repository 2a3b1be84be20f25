-- notifyq schema, version 22: no role oversteps, and a queue may refuse jobs past a depth.
--
-- PostgreSQL grants EXECUTE on every new function to PUBLIC. notifyq's functions that run as
-- the schema's owner (SECURITY DEFINER) were therefore callable by any role with USAGE on the
-- schema: a producer could resign the maintenance leader and take its lease for thirty years
-- (rescue and retention then stopped for every worker), drop another client's watch or wake
-- every listener. Now:
--   - EXECUTE on every function of the schema is revoked from PUBLIC, but on notifyq.enqueue,
--     the one function the contract gives psql users; functions made by later migrations are
--     not PUBLIC's either (default privileges of the schema's owner);
--   - `notifyq grant ROLE --as worker` grants EXECUTE on them all to a worker role (and on those
--     of later migrations, by default privileges); `--as producer` on the few its enqueues and
--     reads call. Roles granted before this version get the same here;
--   - the lead's lease is bounded (a day at most, as NOTIFYQ_LEASE_SECONDS).
--
-- A producer no longer reads the jobs table (every client's payloads, results and errors): it
-- reads a job by its id through notifyq.job_v1, so it sees the jobs whose ids it was given. And
-- a job joins a workflow only in the transaction that made the workflow's first job: nobody
-- attaches a job to another client's workflow (and fails it) afterwards.
--
-- Backpressure: notifyq.queues.max_depth, when set, bounds the jobs of a queue that have not
-- started (waiting or queued); an insert past it is refused, whichever path it came by (a plain
-- INSERT, notifyq.enqueue, the API, the Python client), with SQLSTATE NQ429 naming the queue.
-- While no queue sets one, an insert pays one look at notifyq.queues a statement, nothing a row.

-- -- The lead's lease, bounded -----------------------------------------------------------------

-- lead_v1 (sql/010), refusing a lease that is not a positive number of seconds up to a day.
CREATE OR REPLACE FUNCTION notifyq.lead_v1(p_role text, p_holder text, p_ttl float8)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_taken boolean;
BEGIN
    IF p_ttl IS NULL OR NOT (p_ttl > 0 AND p_ttl <= 86400) THEN
        RAISE EXCEPTION 'notifyq.lead_v1: the lease must be from 0 to 86400 seconds, not %',
            p_ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO notifyq.leaders AS l (role, holder, expires_at)
    VALUES (p_role, p_holder, now() + make_interval(secs => p_ttl))
    ON CONFLICT (role) DO UPDATE
    SET holder = excluded.holder, expires_at = excluded.expires_at
    WHERE l.holder = excluded.holder OR l.expires_at < now()
    RETURNING true INTO v_taken;
    RETURN coalesce(v_taken, false);
END;
$$;

-- -- A producer reads a job by its id ----------------------------------------------------------

-- The job p_id, live, finished or archived, with the columns of the query get_job: the one read
-- of a job a producer may make (it has no SELECT on the tables). Its id is what it holds.
CREATE FUNCTION notifyq.job_v1(p_id uuid)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, status text, priority integer,
               run_at timestamptz, attempt_count integer, max_attempts integer, dedup_key text,
               result jsonb, last_error text, errors jsonb, created_at timestamptz,
               started_at timestamptz, finished_at timestamptz, worker_id text,
               lease_expires_at timestamptz, cancel_requested_at timestamptz,
               depends_on uuid[], group_key text, workflow_id uuid, progress jsonb, ref text,
               archived boolean)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    (SELECT j.id, j.task, j.queue, j.payload, j.status, j.priority, j.run_at, j.attempt_count,
            j.max_attempts, j.dedup_key, j.result, j.last_error, j.errors, j.created_at,
            j.started_at, j.finished_at, j.worker_id, j.lease_expires_at,
            j.cancel_requested_at, j.depends_on, j.group_key, j.workflow_id, j.progress, j.ref,
            false
     FROM notifyq.jobs AS j WHERE j.id = p_id)
    UNION ALL
    (SELECT a.id, a.task, a.queue, a.payload, a.status, a.priority, a.run_at, a.attempt_count,
            a.max_attempts, a.dedup_key, a.result, a.last_error, a.errors, a.created_at,
            a.started_at, a.finished_at, a.worker_id, NULL, a.cancel_requested_at,
            a.depends_on, a.group_key, a.workflow_id, a.progress, a.ref, true
     FROM notifyq.jobs_archive AS a WHERE a.id = p_id)
    LIMIT 1;
$$;

-- -- A workflow is made by one transaction -----------------------------------------------------

-- A job that names a workflow: the first such job of this transaction finds no job of that
-- workflow (else it is another client's, made earlier: refused), and the transaction remembers
-- the workflow (a transaction-local setting), so that its other jobs join it. Runs only for
-- rows with a workflow_id (the trigger's WHEN).
CREATE FUNCTION notifyq.join_workflow_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_mine text := coalesce(current_setting('notifyq.new_workflows', true), '');
BEGIN
    IF position(NEW.workflow_id::text IN v_mine) > 0 THEN
        RETURN NEW;
    END IF;
    IF EXISTS (SELECT 1 FROM notifyq.jobs WHERE workflow_id = NEW.workflow_id)
       OR EXISTS (SELECT 1 FROM notifyq.jobs_archive WHERE workflow_id = NEW.workflow_id) THEN
        RAISE EXCEPTION 'notifyq: workflow % was made by another transaction: a job joins a '
                        'workflow only in the transaction that makes it', NEW.workflow_id
            USING ERRCODE = 'check_violation';
    END IF;
    PERFORM set_config('notifyq.new_workflows', v_mine || NEW.workflow_id::text || ',', true);
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_join_workflow BEFORE INSERT ON notifyq.jobs
FOR EACH ROW WHEN (NEW.workflow_id IS NOT NULL)
EXECUTE FUNCTION notifyq.join_workflow_v1();

-- -- Backpressure: a queue's max_depth ---------------------------------------------------------

ALTER TABLE notifyq.queues ADD COLUMN max_depth bigint CHECK (max_depth >= 0);

-- After each INSERT statement: if some queue has a max_depth and this statement added jobs to
-- it, its jobs not yet started (waiting or queued, this statement's included) must be at most
-- max_depth, or the statement is refused (SQLSTATE NQ429, the queue named in the message as a
-- JSON string). The count runs under a lock of the queue's, held to commit, and sees what the
-- transactions that held it before committed: concurrent inserts never pass it together (in
-- READ COMMITTED; a REPEATABLE READ transaction counts with its own snapshot).
CREATE FUNCTION notifyq.refuse_overflow_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
    v_depth bigint;
BEGIN
    -- The common case: no queue is bounded; one look at a small table, nothing per row.
    IF NOT EXISTS (SELECT 1 FROM notifyq.queues WHERE max_depth IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    FOR v IN
        SELECT q.name, q.max_depth
        FROM notifyq.queues AS q
        WHERE q.max_depth IS NOT NULL
          AND q.name IN (SELECT i.queue FROM inserted AS i
                         WHERE i.status IN ('waiting', 'queued'))
        ORDER BY q.name
    LOOP
        PERFORM pg_advisory_xact_lock(1852899334, hashtext(v.name));
        SELECT count(*) INTO v_depth
        FROM ONLY notifyq.jobs AS j
        WHERE j.queue = v.name AND j.status IN ('waiting', 'queued');
        IF v_depth > v.max_depth THEN
            RAISE EXCEPTION 'notifyq: queue % is full: % jobs not yet started, max_depth %',
                to_json(v.name)::text, v_depth, v.max_depth
                USING ERRCODE = 'NQ429',
                      HINT = 'Retry later, or raise the bound: notifyq queue NAME --max-depth N.';
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_max_depth AFTER INSERT ON notifyq.jobs
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT EXECUTE FUNCTION notifyq.refuse_overflow_v1();

-- -- EXECUTE: the worker's, a producer's, and PUBLIC's only notifyq.enqueue ---------------------

DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure FROM pg_proc AS p
        WHERE p.pronamespace = 'notifyq'::regnamespace AND p.proname <> 'enqueue'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_function);
    END LOOP;
END;
$$;

ALTER DEFAULT PRIVILEGES IN SCHEMA notifyq REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Roles granted before this version, known by their privileges on notifyq.jobs: a worker's
-- UPDATE, a producer's INSERT without UPDATE. They get what `notifyq grant` gives now (the list
-- of a producer's functions is notifyq.grants.PRODUCER_FUNCTIONS; a test holds both the same).
-- A producer keeps its SELECT on the tables until it is granted again (a revoke here could
-- stop a running application); the upgrade page says so.
DO $$
DECLARE
    v record;
    v_function text;
BEGIN
    FOR v IN
        SELECT a.grantee::regrole AS who, bool_or(a.privilege_type = 'UPDATE') AS worker
        FROM pg_class AS c, aclexplode(c.relacl) AS a
        WHERE c.oid = 'notifyq.jobs'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
          AND a.privilege_type IN ('INSERT', 'UPDATE')
        GROUP BY a.grantee
    LOOP
        IF v.worker THEN
            EXECUTE format('GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA notifyq TO %s', v.who);
            EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA notifyq '
                           'GRANT EXECUTE ON FUNCTIONS TO %s', v.who);
        ELSE
            FOREACH v_function IN ARRAY ARRAY[
                'uuid_v7()',
                'keep_task_defaults_v2(text)',
                'job_defaults_v1(text[], jsonb[], text[], integer[], integer[], integer)',
                'enqueue_v4(text, jsonb, text, integer, timestamptz, float8, text, integer, '
                    'integer, uuid[], text, uuid, uuid, jsonb)',
                'enqueue_many_v5(text[], jsonb[], text[], integer[], timestamptz[], float8[], '
                    'text[], integer[], integer, text[], text[], uuid[], uuid[], jsonb, text[])',
                'job_v1(uuid)',
                'watch_v1(uuid, text, float8)',
                'refresh_watches_v1(text, uuid[], float8)',
                'unwatch_v1(uuid, text)'
            ] LOOP
                EXECUTE format('GRANT EXECUTE ON FUNCTION notifyq.%s TO %s', v_function, v.who);
            END LOOP;
        END IF;
    END LOOP;
END;
$$;
