-- notifyq schema, version 7: the trace context of the code that enqueued a job, kept on the job
-- and handed to the worker that claims it (OpenTelemetry, the `otel` extra).
--
-- Workers and API processes of version 6 keep working beside these: every function they call
-- keeps its signature and its answers, and now runs the version 7 function that holds its rule
-- (enqueue_v3 -> enqueue_v4, enqueue_many_v3 -> enqueue_many_v4, start_jobs_v2 -> start_jobs_v3,
-- claim_v3 -> claim_v4, claim_limited_v3 -> claim_limited_v4), so each rule is written once.

-- -- the column --------------------------------------------------------------------------------

-- The W3C trace context of the enqueuing code, as a propagator writes it into a carrier:
-- {"traceparent": "00-<trace id>-<span id>-<flags>", "tracestate": "..."} (tracestate optional).
-- NULL when the job was enqueued outside a trace or with tracing off. Only an object of at most
-- 1024 bytes of text is stored: anything else is refused with the insert. What it holds is still
-- checked by the worker, which treats a context it cannot read as absent (the job runs, untraced).
-- NOT VALID: every existing row is NULL, and the table need not be read under its lock to say so.
ALTER TABLE notifyq.jobs ADD COLUMN trace_context jsonb;
ALTER TABLE notifyq.jobs ADD CONSTRAINT jobs_trace_context_bounded CHECK (
    trace_context IS NULL
    OR (jsonb_typeof(trace_context) = 'object' AND octet_length(trace_context::text) <= 1024)
) NOT VALID;

-- -- enqueueing --------------------------------------------------------------------------------

-- enqueue_v3 (sql/006) and the trace context of the submission. A duplicate that replaces a
-- pending job's payload also takes its trace context, when it has one: the job now runs for it.
CREATE FUNCTION notifyq.enqueue_v4(
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
CREATE FUNCTION notifyq.enqueue_many_v4(
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


-- The earlier versions, for callers of theirs: the same, without a trace context.
CREATE OR REPLACE FUNCTION notifyq.enqueue_v3(
    p_task text, p_payload jsonb, p_queue text, p_priority integer, p_run_at timestamptz,
    p_delay float8, p_dedup_key text, p_max_attempts integer, p_fallback integer,
    p_depends_on uuid[], p_group_key text, p_workflow_id uuid, p_id uuid
) RETURNS TABLE (job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM notifyq.enqueue_v4(p_task, p_payload, p_queue, p_priority, p_run_at, p_delay,
                                     p_dedup_key, p_max_attempts, p_fallback, p_depends_on,
                                     p_group_key, p_workflow_id, p_id, NULL);
$$;

CREATE OR REPLACE FUNCTION notifyq.enqueue_many_v3(
    p_tasks text[], p_payloads jsonb[], p_queues text[], p_priorities integer[],
    p_run_ats timestamptz[], p_delays float8[], p_dedup_keys text[], p_max_attempts integer[],
    p_fallback integer, p_depends_on text[], p_group_keys text[], p_workflow_ids uuid[],
    p_ids uuid[]
) RETURNS TABLE (ord integer, job_id uuid, duplicate boolean, status text, run_at timestamptz,
                 created_at timestamptz)
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM notifyq.enqueue_many_v4(p_tasks, p_payloads, p_queues, p_priorities,
                                          p_run_ats, p_delays, p_dedup_keys, p_max_attempts,
                                          p_fallback, p_depends_on, p_group_keys,
                                          p_workflow_ids, p_ids, NULL);
$$;

-- -- claiming ----------------------------------------------------------------------------------

-- start_jobs_v2 (sql/005) and each job's trace context. The claim's hot path gains one column
-- read from the row it already updates (NULL for a job enqueued outside a trace).
CREATE FUNCTION notifyq.start_jobs_v3(p_worker_id text, p_ids uuid[], p_lease float8)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
               attempt_count integer, max_attempts integer, claims integer,
               created_at float8, run_at float8, dependencies jsonb,
               trace_context jsonb)
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
              END,
              j.trace_context;
    PERFORM notifyq.announce_v1(p_ids);
END;
$$;


-- claim_v3 (sql/005), answering the trace context (through start_jobs_v3).
CREATE FUNCTION notifyq.claim_v4(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb,
                 trace_context jsonb)
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
    RETURN QUERY SELECT * FROM notifyq.start_jobs_v3(p_worker_id, v_ids, p_lease);
END;
$$;


-- claim_limited_v3 (sql/005), answering the trace context (through start_jobs_v3).
CREATE FUNCTION notifyq.claim_limited_v4(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb,
                 trace_context jsonb)
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


-- The claims of version 6 workers: the same rows, without the trace context.
CREATE OR REPLACE FUNCTION notifyq.start_jobs_v2(p_worker_id text, p_ids uuid[], p_lease float8)
RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
               attempt_count integer, max_attempts integer, claims integer,
               created_at float8, run_at float8, dependencies jsonb)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.id, s.task, s.queue, s.payload, s.priority, s.attempt_count, s.max_attempts,
           s.claims, s.created_at, s.run_at, s.dependencies
    FROM notifyq.start_jobs_v3(p_worker_id, p_ids, p_lease) AS s;
$$;

CREATE OR REPLACE FUNCTION notifyq.claim_v3(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8,
    p_probe boolean
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.id, c.task, c.queue, c.payload, c.priority, c.attempt_count, c.max_attempts,
           c.claims, c.created_at, c.run_at, c.dependencies
    FROM notifyq.claim_v4(p_worker_id, p_tasks, p_queues, p_limit, p_lease, p_probe) AS c;
$$;

CREATE OR REPLACE FUNCTION notifyq.claim_limited_v3(
    p_worker_id text, p_tasks text[], p_queues text[], p_limit integer, p_lease float8
) RETURNS TABLE (id uuid, task text, queue text, payload jsonb, priority integer,
                 attempt_count integer, max_attempts integer, claims integer,
                 created_at float8, run_at float8, dependencies jsonb)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.id, c.task, c.queue, c.payload, c.priority, c.attempt_count, c.max_attempts,
           c.claims, c.created_at, c.run_at, c.dependencies
    FROM notifyq.claim_limited_v4(p_worker_id, p_tasks, p_queues, p_limit, p_lease) AS c;
$$;
