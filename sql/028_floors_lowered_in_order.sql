-- notifyq schema, version 28: floors are lowered in one order.
--
-- A producer whose transaction began before a floor rose lowers it, in the insert's trigger
-- (lower_floors_v1 for the queues' floors, sql/021; lower_lane_floors_v1 for the lanes', sql/027)
-- or the requeue's, and holds the floor's row until it commits. Two such producers that each
-- lowered several floors could take their rows in different orders (the join with the
-- statement's aggregate had no order) and deadlock: one of the two inserts failed. Each now
-- locks the rows it must lower in the order of their keys, in the statement that lowers them,
-- and makes missing queue floors in that order too. Nothing else changes: the common insert,
-- whose jobs are above every floor, still locks and writes nothing.

CREATE OR REPLACE FUNCTION notifyq.lower_floors_v1(
    p_queues text[],
    p_priorities integer[],
    p_run_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_queues, p_priorities) AS k(queue, priority)
               WHERE NOT EXISTS (SELECT 1 FROM notifyq.claim_floors AS f
                                 WHERE f.queue = k.queue AND f.priority = k.priority)) THEN
        INSERT INTO notifyq.claim_floors (queue, priority, run_at, id)
        SELECT k.queue, k.priority, min(k.run_at), '00000000-0000-0000-0000-000000000000'
        FROM unnest(p_queues, p_priorities, p_run_ats) AS k(queue, priority, run_at)
        GROUP BY k.queue, k.priority
        ORDER BY k.queue, k.priority
        ON CONFLICT (queue, priority) DO NOTHING;
    END IF;
    UPDATE notifyq.claim_floors AS f
    SET run_at = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                      THEN m.run_at ELSE f.run_at END,
        id = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                  THEN '00000000-0000-0000-0000-000000000000' ELSE f.id END,
        next_run_at = CASE WHEN (f.next_run_at, f.next_id)
                                > (m.run_at, '00000000-0000-0000-0000-000000000000')
                           THEN m.run_at ELSE f.next_run_at END,
        next_id = CASE WHEN (f.next_run_at, f.next_id)
                            > (m.run_at, '00000000-0000-0000-0000-000000000000')
                       THEN '00000000-0000-0000-0000-000000000000' ELSE f.next_id END
    FROM (SELECT l.queue, l.priority, k.run_at
          FROM notifyq.claim_floors AS l
          JOIN (SELECT k.queue, k.priority, min(k.run_at) AS run_at
                FROM unnest(p_queues, p_priorities, p_run_ats) AS k(queue, priority, run_at)
                GROUP BY k.queue, k.priority) AS k
            ON k.queue = l.queue AND k.priority = l.priority
          WHERE (l.run_at, l.id) > (k.run_at, '00000000-0000-0000-0000-000000000000')
             OR (l.next_run_at, l.next_id) > (k.run_at, '00000000-0000-0000-0000-000000000000')
          ORDER BY l.queue, l.priority
          FOR NO KEY UPDATE OF l) AS m
    WHERE f.queue = m.queue AND f.priority = m.priority
      AND ((f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
           OR (f.next_run_at, f.next_id) > (m.run_at, '00000000-0000-0000-0000-000000000000'));
END;
$$;

CREATE OR REPLACE FUNCTION notifyq.lower_lane_floors_v1(
    p_queues text[],
    p_priorities integer[],
    p_keys text[],
    p_run_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    UPDATE notifyq.lane_floors AS f
    SET run_at = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                      THEN m.run_at ELSE f.run_at END,
        id = CASE WHEN (f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
                  THEN '00000000-0000-0000-0000-000000000000' ELSE f.id END,
        next_run_at = CASE WHEN (f.next_run_at, f.next_id)
                                > (m.run_at, '00000000-0000-0000-0000-000000000000')
                           THEN m.run_at ELSE f.next_run_at END,
        next_id = CASE WHEN (f.next_run_at, f.next_id)
                            > (m.run_at, '00000000-0000-0000-0000-000000000000')
                       THEN '00000000-0000-0000-0000-000000000000' ELSE f.next_id END
    FROM (SELECT l.queue, l.priority, l.fair_key, k.run_at
          FROM notifyq.lane_floors AS l
          JOIN (SELECT k.queue, k.priority, k.fair_key, min(k.run_at) AS run_at
                FROM unnest(p_queues, p_priorities, p_keys, p_run_ats)
                     AS k(queue, priority, fair_key, run_at)
                GROUP BY k.queue, k.priority, k.fair_key) AS k
            ON k.queue = l.queue AND k.priority = l.priority AND k.fair_key = l.fair_key
          WHERE (l.run_at, l.id) > (k.run_at, '00000000-0000-0000-0000-000000000000')
             OR (l.next_run_at, l.next_id) > (k.run_at, '00000000-0000-0000-0000-000000000000')
          ORDER BY l.queue, l.priority, l.fair_key
          FOR NO KEY UPDATE OF l) AS m
    WHERE f.queue = m.queue AND f.priority = m.priority AND f.fair_key = m.fair_key
      AND ((f.run_at, f.id) > (m.run_at, '00000000-0000-0000-0000-000000000000')
           OR (f.next_run_at, f.next_id) > (m.run_at, '00000000-0000-0000-0000-000000000000'));
END;
$$;
