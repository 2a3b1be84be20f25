-- notifyq schema, version 6: groups that move on in one statement, dependents found without a
-- pending list, and duplicates that cannot drop what they were submitted with.
--
-- Same signatures and the same answers as version 5, so workers and API processes of version 5
-- keep working beside these.

-- -- groups ----------------------------------------------------------------------------------

-- advance_groups_v1 (sql/005), set-based: a completion of 50 grouped jobs took three statements
-- per group, one group after another, and grouped claims ran at half the speed of ungrouped
-- ones. Now: every group's lock, in one order (so two completions cannot deadlock), then one
-- statement that unblocks the earliest pending member of each group that has no unblocked
-- member left. It runs after the locks are held, so it sees what the last holder committed.
CREATE OR REPLACE FUNCTION notifyq.advance_groups_v1(p_queues text[], p_group_keys text[])
RETURNS TABLE (id uuid, queue text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
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
        SELECT (SELECT j.id FROM notifyq.jobs AS j
                WHERE j.queue = g.queue AND j.group_key = g.group_key
                  AND j.status IN ('waiting', 'queued') AND j.group_blocked
                ORDER BY j.group_seq
                LIMIT 1) AS id
        FROM groups AS g
        WHERE NOT EXISTS (
            SELECT 1 FROM notifyq.jobs AS j
            WHERE j.queue = g.queue AND j.group_key = g.group_key
              AND j.status IN ('waiting', 'queued', 'processing') AND NOT j.group_blocked)
    )
    UPDATE notifyq.jobs AS j SET group_blocked = false
    FROM heads AS h
    WHERE j.id = h.id
    RETURNING j.id, CASE WHEN j.status = 'queued' THEN j.queue END;
END;
$$;

-- -- dependents ------------------------------------------------------------------------------

-- Every statement that ends jobs asks this index for their dependents (settle_v1). With GIN's
-- pending list, each of those lookups also read every entry inserted since the last cleanup:
-- after a burst of dependents, every completion slowed down until autovacuum came. Entries go
-- straight into the index now (an insert of a dependent pays a little more, once).
ALTER INDEX notifyq.jobs_dependents_idx SET (fastupdate = off);
SELECT pg_catalog.gin_clean_pending_list('notifyq.jobs_dependents_idx'::pg_catalog.regclass);

-- -- duplicates ------------------------------------------------------------------------------

-- enqueue_v3 (sql/005), and: a duplicate of a pending job (same queue and dedup_key) must ask
-- for the same depends_on (as a set) and the same group_key, or it is refused. Until now it
-- replaced the payload and kept the pending job's dependencies and group, so a job submitted to
-- wait for another could run before it, and one submitted into a group could run beside its
-- members. Taking the submission's over instead would move a job between groups and between
-- waiting and queued behind the back of whatever decided them; a refusal says what differs.
CREATE OR REPLACE FUNCTION notifyq.enqueue_v3(
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
    v_asked uuid[] := ARRAY(SELECT DISTINCT a FROM unnest(p_depends_on) AS a ORDER BY a);
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
        RETURNING j.id, j.queue, j.status, j.run_at, j.created_at, j.group_blocked,
                  j.depends_on, j.group_key INTO v_job;
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
