"""The functions of schema notifyq are exactly the functions something calls, so that none is
kept that nothing calls and none is called that no migration creates.

A function is called when one of these names it:

- a named query of sql/queries.sql that notifyq's code runs (its name is a string in the code);
- a SQL string of notifyq's Python, or of the bench (it runs notifyq's queries and functions);
- a SQL example of the documentation (a ```sql block of README.md or docs/): what psql users
  are told to call, such as ``notifyq.enqueue``;
- a trigger (its function), or a column default or another object that PostgreSQL records as
  depending on it (``notifyq.uuid_v7``, the default of ``notifyq.jobs.id``);
- the body of a function that is itself called (a function that only uncalled ones call is
  uncalled too).

The rule that retires a function (ARCHITECTURE.md, "The rule for SQL"): once no code of this
version calls it and no worker of the previous version does either, a migration drops it. While
workers of the previous version may still call it (a rolling upgrade runs both), it is listed in
KEPT_FOR_OLDER_WORKERS with the last schema version whose released code calls it; once that
version is older than the previous one, this test fails until a migration drops it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import psycopg

from notifyq.migrations import latest_version
from notifyq.queries import load_queries, sql_dir
from tests.helpers import ROOT

#: Functions that no code of this version names and that workers of the previous version may
#: still call, by their signature (``oid::regprocedure``), with the last schema version whose
#: released code calls them. One may stay here while that version is this one or the one before.
KEPT_FOR_OLDER_WORKERS: dict[str, int] = {}

#: A call of a function of schema notifyq, as SQL writes it (every caller names the schema: each
#: function pins a search_path of pg_catalog only). Relations match too (``INSERT INTO
#: notifyq.jobs (task)``): the names of relations are left out afterwards.
_CALL = re.compile(r"\bnotifyq\.(\w+)\s*\(")
#: A versioned function named anywhere, comments included (``notifyq.claim_v4``).
_VERSIONED = re.compile(r"\bnotifyq\.(\w+_v\d+)\b")
_SQL_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.S)
_SQL_FENCE = re.compile(r"^```sql\n(.*?)^```", re.M | re.S)

#: Where the Python that runs SQL lives: the package and the bench's.
_PYTHON = ("notifyq", "benchmarks/notifyq_bench")


def _python_files() -> Iterator[Path]:
    for folder in _PYTHON:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _strings(path: Path) -> Iterator[str]:
    """The string constants of a Python file, less its docstrings (which are prose)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.value


def _calls(sql: str) -> set[str]:
    return set(_CALL.findall(_SQL_COMMENT.sub(" ", sql)))


def _named_by_code() -> dict[str, set[str]]:
    """{function name: where it is named} for every name outside the database."""
    named: dict[str, set[str]] = {}

    def add(names: Iterable[str], where: str) -> None:
        for name in names:
            named.setdefault(name, set()).add(where)

    strings = {path: list(_strings(path)) for path in _python_files()}
    run = {text for texts in strings.values() for text in texts}
    for name, query in load_queries().items():
        if name in run:
            add(_calls(query.decode()), f"sql/queries.sql ({name})")
    for path, texts in strings.items():
        for text in texts:
            add(_calls(text), str(path.relative_to(ROOT)))
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in _SQL_FENCE.findall(page.read_text(encoding="utf-8")):
            add(_calls(block), str(page.relative_to(ROOT)))
    return named


def _database(url: str) -> tuple[dict[str, list[tuple[str, str]]], set[str], set[str]]:
    """{name: [(signature, body)]} of the functions of schema notifyq, the names of its
    relations, and the names of the functions that a trigger, a default or another object of the
    database (not a function) depends on."""
    with psycopg.connect(url) as conn:
        functions: dict[str, list[tuple[str, str]]] = {}
        for name, signature, body in conn.execute(
            "SELECT p.proname, p.oid::regprocedure::text, p.prosrc FROM pg_proc AS p "
            "WHERE p.pronamespace = 'notifyq'::regnamespace"
        ):
            functions.setdefault(name, []).append((signature, body))
        relations = {
            name
            for (name,) in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'notifyq'::regnamespace"
            )
        }
        # Triggers, defaults, views, checks: PostgreSQL records what they call (a function's
        # body it does not, hence the reading of bodies below).
        depended_on = {
            name
            for (name,) in conn.execute(
                "SELECT DISTINCT p.proname FROM pg_depend AS d "
                "JOIN pg_proc AS p ON p.oid = d.refobjid "
                "WHERE d.refclassid = 'pg_proc'::regclass AND d.classid <> 'pg_proc'::regclass "
                "AND d.deptype = 'n' AND p.pronamespace = 'notifyq'::regnamespace"
            )
        }
    return functions, relations, depended_on


def _called(functions: dict[str, list[tuple[str, str]]], roots: set[str]) -> set[str]:
    """The functions among ``roots`` and those their bodies call, transitively."""
    called: set[str] = set()
    todo = [name for name in roots if name in functions]
    while todo:
        name = todo.pop()
        if name in called:
            continue
        called.add(name)
        for _, body in functions[name]:
            # Relations match too (an INSERT INTO notifyq.x (...)): only functions are followed.
            todo.extend(callee for callee in _calls(body) - called if callee in functions)
    return called


def test_every_function_of_the_schema_is_called_and_every_function_called_exists(
    db_url: str,
) -> None:
    functions, relations, depended_on = _database(db_url)
    named = {name: where for name, where in _named_by_code().items() if name not in relations}
    called = _called(functions, set(named) | depended_on)

    missing = sorted(set(named) - set(functions))
    assert not missing, "\n".join(
        f"notifyq.{name} is called by {', '.join(sorted(named[name]))}, but no migration creates "
        "it: create it in a new migration (sql/0NN_*.sql), or call a function that exists"
        for name in missing
    )

    version = latest_version()
    uncalled = sorted(
        signature
        for name in set(functions) - called
        for signature, _ in functions[name]
        if signature not in KEPT_FOR_OLDER_WORKERS
    )
    assert not uncalled, "\n".join(
        f"nothing calls {signature}: no query that the code runs, no SQL of notifyq's Python or "
        "of the documentation, no trigger, default or called function. If released code still "
        "calls it (this change stopped calling it), list it in KEPT_FOR_OLDER_WORKERS "
        "(tests/test_sql_functions.py) with the last schema version whose released code calls "
        f"it (at most {version}); else drop it in a new migration (sql/{version + 1:03d}_*.sql). "
        "See 'The rule for SQL' in ARCHITECTURE.md"
        for signature in uncalled
    )

    signatures = {signature for versions in functions.values() for signature, _ in versions}
    for signature, last_caller in KEPT_FOR_OLDER_WORKERS.items():
        assert signature in signatures, (
            f"{signature} is gone: take it out of KEPT_FOR_OLDER_WORKERS"
        )
        assert signature.split("(")[0].removeprefix("notifyq.") not in called, (
            f"{signature} is called again: take it out of KEPT_FOR_OLDER_WORKERS"
        )
        assert last_caller >= version - 1, (
            f"{signature} was kept for workers of version {last_caller}, and this is version "
            f"{version}: no worker that may run beside this version calls it any more. Drop it "
            f"in the newest migration (sql/{version:03d}_*.sql) while that one is not released, "
            "else in a new one, and take it out of KEPT_FOR_OLDER_WORKERS"
        )


def test_every_named_query_is_run_by_the_code() -> None:
    # A query that nothing runs would make the functions it calls look called.
    run = {text for path in _python_files() for text in _strings(path)}
    unused = sorted(set(load_queries()) - run)
    assert not unused, (
        f"no code runs the queries {unused} of sql/queries.sql: delete them, or run them"
    )


def test_comments_and_docstrings_name_only_functions_that_exist(db_url: str) -> None:
    functions, _, _ = _database(db_url)
    stale: dict[str, set[str]] = {}
    # The upgrade pages and the changelog are history: they name the functions of their time.
    sources = [*_python_files(), sql_dir() / "queries.sql", ROOT / "ARCHITECTURE.md"]
    sources += [
        page
        for page in sorted((ROOT / "docs").rglob("*.md"))
        if page.parent.name != "upgrading" and page.name != "changelog.md"
    ]
    for path in sources:
        for name in _VERSIONED.findall(path.read_text(encoding="utf-8")):
            if name not in functions:
                stale.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert not stale, "\n".join(
        f"{', '.join(sorted(where))} name notifyq.{name}, which does not exist (any more): "
        "name the version that does"
        for name, where in sorted(stale.items())
    )
