-- notifyq schema: time-ordered job ids (UUID version 7), made in SQL on every enqueue path.
--
-- Job ids were random (version 4): each insert landed on a random leaf of the primary key, so a
-- bulk INSERT of 100,000 jobs dirtied pages all over the index, and every claim and completion
-- read its row's key from a cold page. A version 7 id starts with the time in milliseconds: new
-- keys append at the right edge of the index, where the pages are already in memory. The rest
-- of the id stays random (74 bits), so ids are as hard to guess as before. Workflows already made
-- their ids this way in Python (notifyq/workflows.py: ordered_ids); now the column default, the
-- plain INSERT of psql users, enqueue_v4 and enqueue_many_v4 do too. Existing rows keep their ids.
--
-- uuid_v7 is a SQL expression with no SET clause, so that the planner inlines it into the
-- column default (a SET clause would make it a function call per row, four times its cost). It
-- runs as the inserting role with that role's search_path, so every name in it is qualified by
-- its schema, operators included (tests/test_privileges.py plants overloads of each one).

CREATE FUNCTION notifyq.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
SELECT pg_catalog.encode(
    pg_catalog.set_bit(
        pg_catalog.set_bit(
            pg_catalog.overlay(
                pg_catalog.uuid_send(pg_catalog.gen_random_uuid()),
                pg_catalog.substr(
                    pg_catalog.int8send(
                        pg_catalog.floor(
                            pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())
                            OPERATOR(pg_catalog.*) 1000
                        )::pg_catalog.int8
                    ),
                    3
                ),
                1,
                6
            ),
            -- version 4 (0100) becomes version 7 (0111): the two low bits of the version field
            52, 1
        ),
        53, 1
    ),
    'hex'
)::pg_catalog.uuid
$$;

ALTER TABLE notifyq.jobs ALTER COLUMN id SET DEFAULT notifyq.uuid_v7();

-- enqueue_v4 and enqueue_many_v4 (sql/007), unchanged but for the id they make.
CREATE OR REPLACE FUNCTION notifyq.enqueue_v4(
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
    p_trace_context jsonb
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
    SELECT * INTO d
    FROM notifyq.job_defaults_v1(ARRAY[p_task], ARRAY[v_payload], ARRAY[p_queue],
                                 ARRAY[p_priority], ARRAY[p_max_attempts], p_fallback);
    LOOP
        INSERT INTO notifyq.jobs AS j
            (id, task, payload, queue, priority, run_at, dedup_key, max_attempts, depends_on,
             group_key, workflow_id, trace_context)
        VALUES (v_new_id, d.task, v_payload, d.queue, d.priority,
                coalesce(p_run_at, now() + make_interval(secs => coalesce(p_delay, 0))),
                p_dedup_key, d.max_attempts, coalesce(p_depends_on, '{}'), p_group_key,
                p_workflow_id, p_trace_context)
        ON CONFLICT (queue, dedup_key)
            WHERE status IN ('waiting', 'queued') AND dedup_key IS NOT NULL
        DO UPDATE SET payload = EXCLUDED.payload,
                      priority = EXCLUDED.priority,
                      run_at = EXCLUDED.run_at,
                      max_attempts = EXCLUDED.max_attempts,
                      trace_context = coalesce(EXCLUDED.trace_context, j.trace_context)
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


-- enqueue_many_v3 (sql/005) and one trace context for the whole batch (the context of the span
-- that sent it).
CREATE OR REPLACE FUNCTION notifyq.enqueue_many_v4(
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
    p_trace_context jsonb
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
        SELECT u.ord, coalesce(u.id, notifyq.uuid_v7()) AS id,
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
                                  depends_on, group_key, workflow_id, trace_context)
        SELECT i.id, d.task, i.payload, d.queue, d.priority, i.run_at, d.max_attempts,
               i.depends_on, i.group_key, i.workflow_id, p_trace_context
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
            FROM notifyq.enqueue_v4(r.task, r.payload, r.queue, r.priority, r.run_at, r.delay,
                                    r.dedup_key, r.max_attempts, p_fallback,
                                    r.depends_on::uuid[], r.group_key, r.workflow_id, r.id,
                                    p_trace_context) AS e;
        END LOOP;
    END IF;
END;
$$;
