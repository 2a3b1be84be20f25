"""sql/schema.sql is the schema that the migrations make: the same tables, columns, constraints,
indexes, functions and triggers, compared in PostgreSQL's own words (pg_get_*def)."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from notifyq.queries import sql_dir
from tests.helpers import ROOT

SNAPSHOT = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.reloptions::text
        FROM pg_class AS c WHERE c.relnamespace = 'notifyq'::regnamespace
          AND c.relkind IN ('r', 'v', 'm', 'S', 'p')
        ORDER BY 1""",
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'notifyq'::regnamespace AND c.relkind = 'r'
          AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated
        FROM pg_constraint WHERE connamespace = 'notifyq'::regnamespace
        ORDER BY 1, 2""",
    "indexes": """
        SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'notifyq' ORDER BY 1""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
        FROM pg_proc AS p WHERE p.pronamespace = 'notifyq'::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'notifyq'::regnamespace AND NOT t.tgisinternal
        ORDER BY 1""",
}


def snapshot(url: str) -> dict[str, list[Any]]:
    with psycopg.connect(url) as conn:
        found = {part: conn.execute(query).fetchall() for part, query in SNAPSHOT.items()}
    # A CHECK written with BETWEEN keeps its ANDs nested; read back from pg_dump's text, the same
    # condition is one flat AND. Compared without parentheses, the two read the same.
    found["constraints"] = [
        (table, name, re.sub(r"[()\s]", "", text), valid)
        for table, name, text, valid in found["constraints"]
    ]
    # So with a trigger's WHEN clause (sql/020's rules of a job's columns).
    found["triggers"] = [
        (name, re.sub(r"[()\s]", "", text), enabled) for name, text, enabled in found["triggers"]
    ]
    return found


def test_schema_sql_is_what_the_migrations_make(db_url: str, empty_db_url: str) -> None:
    schema = (sql_dir() / "schema.sql").read_text()
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(schema.encode())
    from_migrations, from_file = snapshot(db_url), snapshot(empty_db_url)
    for part in SNAPSHOT:
        assert from_file[part] == from_migrations[part], (
            f"sql/schema.sql differs from the migrations in its {part}: regenerate it with "
            "`python -m tests.dump_schema`"
        )


def test_a_source_checkout_reads_its_own_sql_folder_not_a_copy() -> None:
    # The tests run on an editable install: what they check must be the files being edited.
    # tests/test_wheel.py checks that an installed wheel finds its own.
    assert sql_dir() == ROOT / "sql"
