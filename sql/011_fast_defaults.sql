-- notifyq schema, version 11: a plain INSERT that leaves a job's queue, priority or max_attempts
-- to the task's defaults no longer costs a call of the batch defaults function per row.
--
-- Only adds a function and a trigger: the answers are those of version 10.

-- The defaults of a named task for one inserted row, the rule of notifyq.job_defaults_v1
-- (sql/003) for a row whose task is given (that function's p_fallback is null for a plain
-- INSERT): the queue and priority the task registered, else 'default' and 0; its max_attempts,
-- else the database's setting, else 3. job_defaults_v1 took an array of one row, a set-returning
-- call and two lookups of the settings per row: four fifths of the time of a bulk INSERT ...
-- SELECT that named neither queue nor priority. A row whose task is not given (the task comes
-- from its payload, or the database's default task) still goes through jobs_accept and that
-- function.
CREATE FUNCTION notifyq.fill_defaults_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task record;
BEGIN
    SELECT t.options ->> 'queue' AS queue, t.options ->> 'priority' AS priority, t.max_attempts
    INTO v_task
    FROM notifyq.tasks AS t WHERE t.name = NEW.task;
    NEW.queue := coalesce(NEW.queue, v_task.queue, 'default');
    NEW.priority := coalesce(NEW.priority, v_task.priority::integer, 0);
    IF NEW.max_attempts IS NULL THEN
        NEW.max_attempts := coalesce(
            v_task.max_attempts,
            (SELECT s.value::integer FROM notifyq.settings AS s WHERE s.key = 'max_attempts'),
            3);
    END IF;
    RETURN NEW;
END;
$$;

-- Row triggers of one timing fire in the order of their names: jobs_a_defaults before
-- jobs_accept, whose WHEN then sees the defaults filled, and whose function runs only for rows
-- that need more (a column only the engine writes, a time out of range, dependencies, a group).
CREATE TRIGGER jobs_a_defaults
    BEFORE INSERT ON notifyq.jobs
    FOR EACH ROW
    WHEN (NEW.task IS NOT NULL
          AND (NEW.queue IS NULL OR NEW.priority IS NULL OR NEW.max_attempts IS NULL))
    EXECUTE FUNCTION notifyq.fill_defaults_v1();
