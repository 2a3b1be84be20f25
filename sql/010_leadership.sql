-- notifyq schema, version 10: one worker of a database leads its maintenance.
--
-- Only adds a table and functions: workers of earlier versions keep rescuing and pruning as
-- before beside these (which is safe: both passes skip what another holds).

-- Who leads each role (today one, 'maintenance': the rescue of lost jobs and retention), until
-- when. Unlogged like the idle marks: after a crash the table is empty, and the next worker to
-- ask takes the lead.
CREATE UNLOGGED TABLE notifyq.leaders (
    role text PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- p_holder takes or keeps the lead of p_role for p_ttl seconds: it is free, or expired, or
-- p_holder's already. Answers whether p_holder leads now. Both functions run as the schema's
-- owner, so worker roles granted before this version need nothing more.
CREATE FUNCTION notifyq.lead_v1(p_role text, p_holder text, p_ttl float8)
RETURNS boolean
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH taken AS (
        INSERT INTO notifyq.leaders AS l (role, holder, expires_at)
        VALUES (p_role, p_holder, now() + make_interval(secs => p_ttl))
        ON CONFLICT (role) DO UPDATE
        SET holder = excluded.holder, expires_at = excluded.expires_at
        WHERE l.holder = excluded.holder OR l.expires_at < now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM taken);
$$;

-- p_holder gives up the lead of p_role (a worker that stops): the next to ask takes it at once.
CREATE FUNCTION notifyq.resign_v1(p_role text, p_holder text)
RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM notifyq.leaders WHERE role = p_role AND holder = p_holder;
$$;
