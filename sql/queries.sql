-- The queries notifyq runs, each under a `-- name:` header; notifyq/queries.py parses this file
-- once and notifyq/store.py runs each by name. Values are always passed as parameters.

-- name: enqueue
SELECT job_id, duplicate, status, run_at, created_at
FROM notifyq.enqueue_v1(%(task)s, %(payload)s::jsonb, %(queue)s, %(priority)s,
                        coalesce(%(run_at)s::timestamptz,
                                 now() + make_interval(secs => %(delay)s::float8)),
                        %(dedup_key)s, %(max_attempts)s);

-- name: enqueue_many
SELECT ord, job_id, duplicate, status, run_at, created_at
FROM notifyq.enqueue_many_v1(
    %(tasks)s::text[], %(payloads)s::jsonb[], %(queues)s::text[], %(priorities)s::integer[],
    (SELECT array_agg(coalesce(r, now() + make_interval(secs => d)) ORDER BY o)
     FROM unnest(%(run_ats)s::timestamptz[], %(delays)s::float8[]) WITH ORDINALITY AS t(r, d, o)),
    %(dedup_keys)s::text[], %(max_attempts)s::integer[])
ORDER BY ord;

-- name: get_job
SELECT id, task, queue, payload, status, priority, run_at, attempt_count, max_attempts,
       dedup_key, result, last_error, errors, created_at, started_at, finished_at, worker_id,
       lease_expires_at
FROM notifyq.jobs
WHERE id = %(id)s;

-- Claims up to %(limit)s due jobs of the given tasks in one statement, highest priority first.
-- SKIP LOCKED lets concurrent workers take disjoint rows without waiting on each other; the row
-- locks last only for this statement, never while the job runs.
-- name: claim_jobs
WITH picked AS (
    SELECT id
    FROM notifyq.jobs
    WHERE status = 'queued' AND run_at <= now() AND task = ANY(%(tasks)s::text[])
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE notifyq.jobs AS j
SET status = 'processing',
    attempt_count = j.attempt_count + 1,
    started_at = now(),
    finished_at = NULL,
    worker_id = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s::float8)
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
          j.created_at, j.run_at;

-- name: claim_jobs_in_queues
WITH picked AS (
    SELECT id
    FROM notifyq.jobs
    WHERE status = 'queued' AND run_at <= now() AND task = ANY(%(tasks)s::text[])
      AND queue = ANY(%(queues)s::text[])
    ORDER BY priority DESC, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE notifyq.jobs AS j
SET status = 'processing',
    attempt_count = j.attempt_count + 1,
    started_at = now(),
    finished_at = NULL,
    worker_id = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s::float8)
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task, j.queue, j.payload, j.priority, j.attempt_count, j.max_attempts,
          j.created_at, j.run_at;

-- Seconds until the earliest future run_at among the worker's jobs, measured on the database's
-- clock, so an idle worker can sleep exactly until then.
-- name: seconds_to_next_job
SELECT extract(epoch FROM min(run_at) - now())::float8
FROM notifyq.jobs
WHERE status = 'queued' AND run_at > now() AND task = ANY(%(tasks)s::text[])
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]));

-- Records successful attempts, one statement for a whole batch. The (worker_id, attempt_count)
-- check in the same UPDATE discards the result of a worker that lost the job's lease meanwhile.
-- name: complete_jobs
UPDATE notifyq.jobs AS j
SET status = 'completed',
    result = d.result,
    finished_at = now(),
    lease_expires_at = NULL
FROM unnest(%(ids)s::uuid[], %(attempts)s::integer[], %(results)s::jsonb[])
     AS d(id, attempt, result)
WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s
  AND j.attempt_count = d.attempt
RETURNING j.id;

-- Records failed attempts: back to queued at now() + delay while attempts are left (and the error
-- is retryable), else failed. Fenced like complete_jobs.
-- name: fail_jobs
WITH d AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(attempts)s::integer[], %(errors)s::text[],
                %(retryable)s::boolean[], %(delays)s::float8[])
         AS d(id, attempt, error, retryable, delay)
)
UPDATE notifyq.jobs AS j
SET status = CASE WHEN d.retryable AND j.attempt_count < j.max_attempts
                  THEN 'queued' ELSE 'failed' END,
    run_at = CASE WHEN d.retryable AND j.attempt_count < j.max_attempts
                  THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
    finished_at = CASE WHEN d.retryable AND j.attempt_count < j.max_attempts
                       THEN NULL ELSE now() END,
    worker_id = CASE WHEN d.retryable AND j.attempt_count < j.max_attempts
                     THEN NULL ELSE j.worker_id END,
    lease_expires_at = NULL,
    last_error = d.error,
    errors = notifyq.append_error_v1(j.errors, d.attempt, d.error, j.worker_id)
FROM d
WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s
  AND j.attempt_count = d.attempt
RETURNING j.id, j.status, j.run_at;

-- Puts jobs a stopping worker could not finish back in the queue at once, without counting the
-- interrupted attempt, and wakes the other workers.
-- name: release_jobs
WITH released AS (
    UPDATE notifyq.jobs AS j
    SET status = 'queued',
        attempt_count = j.attempt_count - 1,
        run_at = now(),
        worker_id = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::uuid[], %(attempts)s::integer[]) AS d(id, attempt)
    WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s
      AND j.attempt_count = d.attempt
    RETURNING j.id, j.queue
)
SELECT r.id, notifyq.wake_v1(ARRAY[r.queue]) FROM released AS r;

-- Renews the leases of the jobs a worker holds; the ids it answers are the ones still held.
-- name: extend_leases
UPDATE notifyq.jobs AS j
SET lease_expires_at = now() + make_interval(secs => %(lease)s::float8)
FROM unnest(%(ids)s::uuid[], %(attempts)s::integer[]) AS d(id, attempt)
WHERE j.id = d.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s
  AND j.attempt_count = d.attempt
RETURNING j.id;

-- Requeues (or fails, when out of attempts) jobs whose lease ran out: their worker died or hung.
-- SKIP LOCKED keeps rescuers on several workers from blocking each other.
-- name: rescue_expired
WITH expired AS (
    SELECT id
    FROM notifyq.jobs
    WHERE status = 'processing' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE notifyq.jobs AS j
    SET status = CASE WHEN j.attempt_count >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = now(),
        finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN now() END,
        lease_expires_at = NULL,
        worker_id = CASE WHEN j.attempt_count >= j.max_attempts THEN j.worker_id END,
        last_error = format('lease expired: worker %%s stopped renewing attempt %%s of %%s%%s',
                            j.worker_id, j.attempt_count, j.max_attempts,
                            CASE WHEN j.attempt_count >= j.max_attempts
                                 THEN '; no attempts left' ELSE '' END),
        errors = notifyq.append_error_v1(
            j.errors, j.attempt_count,
            format('lease expired: worker %%s stopped renewing the lease', j.worker_id),
            j.worker_id)
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.queue, j.status
)
SELECT r.id, r.status,
       CASE WHEN r.status = 'queued' THEN notifyq.wake_v1(ARRAY[r.queue]) END
FROM rescued AS r;

-- name: register_task
INSERT INTO notifyq.tasks (name, max_attempts, options, updated_at)
VALUES (%(name)s, %(max_attempts)s, %(options)s::jsonb, now())
ON CONFLICT (name) DO UPDATE
SET max_attempts = EXCLUDED.max_attempts, options = EXCLUDED.options, updated_at = now();

-- name: set_setting
INSERT INTO notifyq.settings (key, value) VALUES (%(key)s, %(value)s)
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value;

-- name: ping
SELECT 1;
