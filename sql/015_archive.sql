-- notifyq schema, version 15: an optional archive of finished jobs, partitioned by day.
--
-- With NOTIFYQ_ARCHIVE_AFTER set, the worker that leads the maintenance moves finished jobs
-- older than it out of notifyq.jobs into notifyq.jobs_archive, in small batches (archive_v1),
-- and retention of archived jobs drops whole days (archive_drop_v1) instead of deleting rows
-- one batch at a time. Off (the default), nothing here is used and nothing changes.
--
-- Only adds a table and functions: workers and API processes of earlier versions keep working
-- beside these (they neither read nor write the archive; an archived job is unknown to them, as
-- a pruned one is).

-- Finished jobs, one partition per UTC day of finished_at (notifyq.jobs_archive_YYYYMMDD). A
-- day: retention is a DROP of a whole partition, so the period is what retention can be exact
-- to, and a keep of a week spans 8 of them; an hour would make a read by id (which probes every
-- partition: the id is not the partition key) look at 24 times as many. Only the columns a read
-- answers and the ones that say how the job went are kept: the lease, group order and heartbeat
-- columns mean nothing once a job has finished.
CREATE TABLE notifyq.jobs_archive (
    id uuid NOT NULL,
    task text NOT NULL,
    queue text NOT NULL,
    payload jsonb NOT NULL,
    status text NOT NULL CHECK (status IN ('completed', 'failed', 'cancelled')),
    priority integer NOT NULL,
    run_at timestamptz NOT NULL,
    attempt_count integer NOT NULL,
    max_attempts integer NOT NULL,
    dedup_key text,
    result jsonb,
    last_error text,
    errors jsonb NOT NULL,
    created_at timestamptz NOT NULL,
    started_at timestamptz,
    finished_at timestamptz NOT NULL,
    worker_id text,
    cancel_requested_at timestamptz,
    claims integer NOT NULL,
    lost_count integer NOT NULL,
    depends_on uuid[] NOT NULL,
    group_key text,
    workflow_id uuid,
    progress jsonb,
    trace_context jsonb,
    archived_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (finished_at);

-- Reads by id (GET /jobs/{id}, Queue.get, a wait on a finished job) and by workflow. An id is
-- unique across the archive because it was in notifyq.jobs, and a job moves once; a unique
-- index here would have to include finished_at.
CREATE INDEX jobs_archive_id_idx ON notifyq.jobs_archive (id);
CREATE INDEX jobs_archive_workflow_idx ON notifyq.jobs_archive (workflow_id)
    WHERE workflow_id IS NOT NULL;

-- The archived job p_id, or the archived jobs of workflow p_workflow_id: how every read reaches
-- the archive. It runs as its caller, and answers nothing to a role that may not read the
-- archive (one granted before this version, until `notifyq grant` runs again): for it, archived
-- jobs are unknown, as pruned ones are, where a plain SELECT would fail every read of an id that
-- is not in notifyq.jobs (a 404 turned 500), archive on or off. A read by id looks at every
-- partition (the id is not the partition key): planning that took longer than the reads (24 ms
-- against 6 ms for 368 days of 550 jobs), so the plan is made once per connection.
CREATE FUNCTION notifyq.archived_jobs_v1(p_id uuid, p_workflow_id uuid)
RETURNS SETOF notifyq.jobs_archive
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF NOT has_table_privilege('notifyq.jobs_archive', 'SELECT') THEN
        RETURN;
    END IF;
    IF p_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM notifyq.jobs_archive AS a WHERE a.id = p_id LIMIT 1;
    ELSIF p_workflow_id IS NOT NULL THEN
        RETURN QUERY SELECT * FROM notifyq.jobs_archive AS a WHERE a.workflow_id = p_workflow_id;
    END IF;
END;
$$;

-- retry_v1 (sql/005), refusing a job that depends on an archived one. retry_v1 takes a parent
-- that is not in notifyq.jobs for completed: the job would go back and run without the parent's
-- result (ctx.dependencies is read from notifyq.jobs), or after a parent that failed. Without the
-- archive that is a parent deleted by hand or by a keep, rare; with it, a failed parent moves an
-- hour (say) after its end, and its cancelled dependents stay retriable in notifyq.jobs. A role
-- that may not read the archive (granted before this version) gets retry_v1's answer.
CREATE FUNCTION notifyq.retry_v2(p_id uuid)
RETURNS TABLE (status text, refused text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_job record;
    v_gone uuid;
BEGIN
    SELECT j.status, j.depends_on INTO v_job FROM notifyq.jobs AS j WHERE j.id = p_id;
    IF FOUND AND v_job.status IN ('failed', 'cancelled') AND v_job.depends_on <> '{}'
       AND has_table_privilege('notifyq.jobs_archive', 'SELECT') THEN
        SELECT a.id INTO v_gone FROM notifyq.jobs_archive AS a
        WHERE a.id = ANY(v_job.depends_on) ORDER BY a.id LIMIT 1;
        IF v_gone IS NOT NULL THEN
            RETURN QUERY SELECT v_job.status,
                format('job %s, which it depends on, is archived: its result is no longer this '
                       'job''s input; enqueue it again', v_gone);
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT r.status, r.refused FROM notifyq.retry_v1(p_id) AS r;
END;
$$;

-- The UTC days of the finished jobs that archive_v1(p_after) may move, oldest first (one probe
-- of jobs_finished_idx per day, not a scan of the rows: on the first pass over a large history
-- they are millions), and then today and p_ahead days after it: the partitions a move needs.
-- Creates at most 8 of those missing per call, oldest first, and answers how many it created;
-- the caller calls again while it answers 8, each call its own short transaction: 8 take a
-- tenth of a second, inside the shortest default statement timeout (one second), where 31
-- took up to 1.2 s on a loaded machine, and a pass that always times out never gets further.
-- It and archive_drop_v1 take one advisory lock (0x6E710004; 0x6E710001 to _03 are the
-- migrations', the idle marks' and the groups'), so two leaders for a moment make and drop each
-- partition once. Runs as the schema's owner (a partition is DDL); only roles given it by
-- `notifyq grant --as worker` may call it. lock_timeout: creating a partition locks the archive
-- against reads for a moment; waiting behind a long read would queue every read behind it, so
-- it gives up and the next pass tries again.
CREATE FUNCTION notifyq.archive_prepare_v1(p_after float8, p_ahead integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
DECLARE
    v_today date := (now() AT TIME ZONE 'UTC')::date;
    v_cutoff timestamptz := now() - make_interval(secs => greatest(p_after, 0));
    v_day date;
    v_name text;
    v_made integer := 0;
BEGIN
    -- Two leaders for a moment: the second waits for the first's partitions, then sees them.
    PERFORM pg_advisory_xact_lock(1852899332);
    FOR v_day IN
        WITH RECURSIVE days (day) AS (
            SELECT (min(j.finished_at) AT TIME ZONE 'UTC')::date
            FROM notifyq.jobs AS j
            WHERE j.status IN ('completed', 'failed', 'cancelled') AND j.finished_at < v_cutoff
          UNION ALL
            SELECT (SELECT (min(j.finished_at) AT TIME ZONE 'UTC')::date
                    FROM notifyq.jobs AS j
                    WHERE j.status IN ('completed', 'failed', 'cancelled')
                      AND j.finished_at >= ((d.day + 1)::timestamp AT TIME ZONE 'UTC')
                      AND j.finished_at < v_cutoff)
            FROM days AS d
            WHERE d.day IS NOT NULL
        )
        SELECT d.day FROM days AS d WHERE d.day IS NOT NULL AND d.day < v_today
        UNION
        SELECT v_today + n FROM generate_series(0, least(greatest(p_ahead, 0), 31)) AS n
        ORDER BY 1
    LOOP
        v_name := 'jobs_archive_' || to_char(v_day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('notifyq.%I', v_name)) IS NOT NULL;
        EXIT WHEN v_made >= 8;
        EXECUTE format(
            'CREATE TABLE notifyq.%I PARTITION OF notifyq.jobs_archive '
            'FOR VALUES FROM (%L) TO (%L)',
            v_name, v_day::timestamp AT TIME ZONE 'UTC', (v_day + 1)::timestamp AT TIME ZONE 'UTC');
        v_made := v_made + 1;
    END LOOP;
    RETURN v_made;
END;
$$;

-- Moves up to p_limit finished jobs older than p_after seconds into the archive, oldest first,
-- in one statement: the DELETE and the INSERT commit together, so a read sees a job in one table
-- or the other, never both or neither. Never a job that a job not started yet depends on (its
-- result is that job's input, read from notifyq.jobs when it is claimed: the rule of
-- notifyq.prune_v2), nor one locked elsewhere (a retry, a delete, another leader's move: SKIP
-- LOCKED, so two movers share the rows). The partition of every row must exist:
-- archive_prepare_v1 first. Answers how many moved; the caller repeats while it answers p_limit.
CREATE FUNCTION notifyq.archive_v1(p_after float8, p_limit integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_moved integer;
BEGIN
    WITH moved AS (
        DELETE FROM notifyq.jobs AS j
        WHERE j.id IN (SELECT c.id FROM notifyq.jobs AS c
                       WHERE c.status IN ('completed', 'failed', 'cancelled')
                         AND c.finished_at < now() - make_interval(secs => p_after)
                         AND NOT EXISTS (SELECT 1 FROM notifyq.jobs AS w
                                         WHERE w.status IN ('waiting', 'queued')
                                           AND w.depends_on <> '{}'
                                           AND w.depends_on @> ARRAY[c.id])
                       ORDER BY c.finished_at
                       LIMIT p_limit
                       FOR UPDATE SKIP LOCKED)
          AND j.status IN ('completed', 'failed', 'cancelled')
        RETURNING j.id, j.task, j.queue, j.payload, j.status, j.priority, j.run_at,
                  j.attempt_count, j.max_attempts, j.dedup_key, j.result, j.last_error,
                  j.errors, j.created_at, j.started_at, j.finished_at, j.worker_id,
                  j.cancel_requested_at, j.claims, j.lost_count, j.depends_on, j.group_key,
                  j.workflow_id, j.progress, j.trace_context
    )
    INSERT INTO notifyq.jobs_archive
        (id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
         dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
         cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
         trace_context)
    SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
           dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
           cancel_requested_at, claims, lost_count, depends_on, group_key, workflow_id, progress,
           trace_context
    FROM moved;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    RETURN v_moved;
END;
$$;

-- Drops the archive's days that ended more than p_keep seconds ago (the longest keep of the
-- statuses: every row in them is past its own keep), at most 8 per call, oldest first; answers
-- how many. Only the partitions archive_prepare_v1 makes (by their name) are dropped. Runs as the
-- schema's owner (a DROP needs it); only roles given it by `notifyq grant --as worker` may call
-- it. lock_timeout: see archive_prepare_v1.
CREATE FUNCTION notifyq.archive_drop_v1(p_keep float8)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '2s'
AS $$
DECLARE
    v_name text;
    v_dropped integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(1852899332);  -- as archive_prepare_v1
    FOR v_name IN
        SELECT c.relname
        FROM pg_inherits AS i
        JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'notifyq.jobs_archive'::regclass
          AND c.relname ~ '^jobs_archive_[0-9]{8}$'
          AND ((to_date(substr(c.relname, 14), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC')
              <= now() - make_interval(secs => greatest(p_keep, 0))
        ORDER BY c.relname
        LIMIT 8
    LOOP
        EXECUTE format('DROP TABLE notifyq.%I', v_name);
        v_dropped := v_dropped + 1;
    END LOOP;
    RETURN v_dropped;
END;
$$;

-- Partitions are the maintenance leader's business: a role with only USAGE on the schema (a
-- producer) must not create or drop them through these owner's functions.
REVOKE ALL ON FUNCTION notifyq.archive_prepare_v1(float8, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION notifyq.archive_drop_v1(float8) FROM PUBLIC;
