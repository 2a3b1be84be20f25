-- notifyq schema, version 13: a bulk INSERT ... SELECT looks a task's defaults up once per
-- statement, not once per row.
--
-- fill_defaults_v1 (sql/011) read notifyq.tasks, and for max_attempts notifyq.settings, for every
-- inserted row: one executor start-up per row, about half of the time of a 100,000-row
-- INSERT ... SELECT that names neither queue nor priority. A row trigger has nowhere of its own to
-- keep what it read, so fill_defaults_v2 keeps the last task's defaults in transaction-local
-- settings (set_config(..., true)), keyed by the transaction, the client statement
-- (statement_timestamp()) and the task's name. Rows of one statement that name the same task
-- read the tables once; a new statement, or another task, reads them again, so a task whose
-- defaults a worker registers between two statements is seen by the second, as before.
--
-- The keys are the caller's to set too (any session may set a custom setting). That gives a
-- producer nothing it could not have by naming the columns: the values only fill the queue,
-- priority and max_attempts of the producer's own rows, which the table's checks still bound.
--
-- Only adds two functions and points jobs_a_defaults at the trigger's: the answers are those of
-- version 12.

-- Looks the task's defaults up and keeps them for the rest of the statement (the caller's
-- key). The rule of fill_defaults_v1: the queue and priority the task registered, else 'default'
-- and 0; its max_attempts, else the database's setting, else 3. Runs as the schema's owner: a
-- producer has no privilege on notifyq.tasks or notifyq.settings.
CREATE FUNCTION notifyq.keep_task_defaults_v1(p_task text, p_key text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_task record;
BEGIN
    SELECT coalesce(t.options ->> 'queue', 'default') AS queue,
           coalesce((t.options ->> 'priority')::integer, 0) AS priority,
           coalesce(t.max_attempts,
                    (SELECT s.value::integer FROM notifyq.settings AS s
                     WHERE s.key = 'max_attempts'),
                    3) AS max_attempts
    INTO v_task
    FROM (SELECT p_task AS name) AS n
    LEFT JOIN notifyq.tasks AS t ON t.name = n.name;
    -- Transaction-local: set inside this function (which has a SET clause of its own), they
    -- still outlive the call, until the transaction ends.
    PERFORM set_config('notifyq.defaults_queue', v_task.queue, true),
            set_config('notifyq.defaults_priority', v_task.priority::text, true),
            set_config('notifyq.defaults_max_attempts', v_task.max_attempts::text, true),
            set_config('notifyq.defaults_of', p_key, true);
END;
$$;

-- The row trigger. It runs as the inserting role and reads only settings, so it needs no SET
-- clause, whose cost at every row was as large as the rest of the trigger's: instead every name
-- in it is schema-qualified, so no search_path can put another function or operator in its way.
CREATE FUNCTION notifyq.fill_defaults_v2() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    -- Which statement and task the kept defaults are of. txid_current() is assigned already:
    -- this row is being inserted.
    v_key pg_catalog.text := pg_catalog.concat_ws(
        ' ', pg_catalog.txid_current(), pg_catalog.statement_timestamp(), NEW.task);
BEGIN
    IF (pg_catalog.current_setting('notifyq.defaults_of', true) OPERATOR(pg_catalog.=) v_key)
       IS NOT TRUE THEN
        PERFORM notifyq.keep_task_defaults_v1(NEW.task, v_key);
    END IF;
    NEW.queue := coalesce(NEW.queue, pg_catalog.current_setting('notifyq.defaults_queue'));
    NEW.priority := coalesce(
        NEW.priority, pg_catalog.current_setting('notifyq.defaults_priority')::pg_catalog.int4);
    NEW.max_attempts := coalesce(
        NEW.max_attempts,
        pg_catalog.current_setting('notifyq.defaults_max_attempts')::pg_catalog.int4);
    RETURN NEW;
END;
$$;

-- Same name, so the order of the row triggers stays: jobs_a_defaults before jobs_accept.
DROP TRIGGER jobs_a_defaults ON notifyq.jobs;
CREATE TRIGGER jobs_a_defaults
    BEFORE INSERT ON notifyq.jobs
    FOR EACH ROW
    WHEN (NEW.task IS NOT NULL
          AND (NEW.queue IS NULL OR NEW.priority IS NULL OR NEW.max_attempts IS NULL))
    EXECUTE FUNCTION notifyq.fill_defaults_v2();
