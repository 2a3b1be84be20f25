-- notifyq schema, version 8: jobs finished per minute, kept for the dashboard's last-hour
-- throughput and failure charts, so that every API process shows the same figures.
--
-- A minute is counted once, from the finished jobs (jobs_finished_idx), by the first API
-- process that is asked for it after it ended, and stored; the minute under way is counted on
-- each read and not stored. Nothing on the path of a job writes here.

CREATE TABLE notifyq.minute_stats (
    minute     timestamptz PRIMARY KEY,
    completed  integer NOT NULL,
    failed     integer NOT NULL,
    cancelled  integer NOT NULL,
    counted_at timestamptz NOT NULL DEFAULT now()
);

-- The last p_minutes whole minutes and the one under way, oldest first. Up to p_fill of the
-- whole minutes not stored yet are counted and stored (newest first) by this call, so one call
-- costs at most p_fill + 1 minutes of finished jobs; the rest answer NULL counts until a later
-- call fills them in. A minute counts as whole 5 seconds after it ended (an outcome's
-- finished_at is its transaction's start). Stored minutes older than a day are deleted.
CREATE FUNCTION notifyq.minute_stats_v1(p_minutes integer, p_fill integer)
RETURNS TABLE (minute timestamptz, completed integer, failed integer, cancelled integer,
               partial boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_current timestamptz := date_trunc('minute', now() - interval '5 seconds');
    v_minutes integer := least(greatest(p_minutes, 1), 1440);
BEGIN
    INSERT INTO notifyq.minute_stats (minute, completed, failed, cancelled)
    SELECT m.minute, c.completed, c.failed, c.cancelled
    FROM (SELECT g.minute
          FROM generate_series(v_current - make_interval(mins => v_minutes),
                               v_current - interval '1 minute', interval '1 minute') AS g(minute)
          WHERE NOT EXISTS (SELECT 1 FROM notifyq.minute_stats AS s WHERE s.minute = g.minute)
          ORDER BY g.minute DESC
          LIMIT greatest(p_fill, 0)) AS m
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE j.status = 'completed')::integer AS completed,
               count(*) FILTER (WHERE j.status = 'failed')::integer AS failed,
               count(*) FILTER (WHERE j.status = 'cancelled')::integer AS cancelled
        FROM notifyq.jobs AS j
        WHERE j.status IN ('completed', 'failed', 'cancelled')
          AND j.finished_at >= m.minute AND j.finished_at < m.minute + interval '1 minute'
    ) AS c
    ON CONFLICT (minute) DO NOTHING;
    DELETE FROM notifyq.minute_stats AS s WHERE s.minute < now() - interval '1 day';
    RETURN QUERY
    SELECT g.minute, s.completed, s.failed, s.cancelled, false
    FROM generate_series(v_current - make_interval(mins => v_minutes),
                         v_current - interval '1 minute', interval '1 minute') AS g(minute)
    LEFT JOIN notifyq.minute_stats AS s ON s.minute = g.minute
    UNION ALL
    SELECT v_current,
           (count(*) FILTER (WHERE j.status = 'completed'))::integer,
           (count(*) FILTER (WHERE j.status = 'failed'))::integer,
           (count(*) FILTER (WHERE j.status = 'cancelled'))::integer,
           true
    FROM notifyq.jobs AS j
    WHERE j.status IN ('completed', 'failed', 'cancelled') AND j.finished_at >= v_current
    ORDER BY 1;
END;
$$;
