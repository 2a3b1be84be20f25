"""The SQL files: numbered migrations and the named queries of ``sql/queries.sql``.

Every reader of them finds them through :func:`sql_dir`. Files are read when first asked for,
never at import.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
from dataclasses import dataclass
from pathlib import Path

_NAME_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{3,})_(\w+)\.sql$")


@functools.cache
def sql_dir() -> Path:
    """The folder of notifyq's SQL files, for every reader: the migrations, the named queries,
    the schema's dump and the tests.

    They are the package's data: ``notifyq/sql`` in a wheel, where the build puts the top-level
    ``sql/`` of the source (pyproject's ``sources``). An editable install imports the package
    from the source checkout, where the files stay in that top-level folder, beside the package:
    found there, they are the files being edited, never a copy made at install time.
    """
    package = importlib.resources.files("notifyq")
    if not isinstance(package, Path):  # a zip import: nothing to migrate from
        raise FileNotFoundError(f"notifyq is not installed as files ({package!r})")
    package = package.resolve()
    checkout = package.parent
    if (package / "sql" / "queries.sql").is_file():
        return package / "sql"
    if (checkout / "sql" / "queries.sql").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "sql"
    raise FileNotFoundError(
        f"notifyq's SQL files are missing: neither in {package / 'sql'} (a wheel) nor in "
        f"{checkout / 'sql'} beside a pyproject.toml (a source checkout)"
    )


def parse_queries(text: str) -> dict[str, bytes]:
    """Splits a file of ``-- name: x`` sections into {name: query}; comments above a header
    belong to the query after it."""
    queries: dict[str, bytes] = {}
    headers = list(_NAME_HEADER.finditer(text))
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        body = "\n".join(
            line
            for line in text[header.end() : end].splitlines()
            if line.strip() and not line.lstrip().startswith("--")
        ).strip()
        name = header.group(1)
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.encode()
    return queries


@functools.cache
def load_queries() -> dict[str, bytes]:
    """The named queries, parsed once per process."""
    return parse_queries((sql_dir() / "queries.sql").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Migration:
    """One numbered schema file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the file, recorded when applied."""
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(folder: Path | None = None) -> list[Migration]:
    """The migrations in version order."""
    folder = folder or sql_dir()
    found = []
    for path in sorted(folder.iterdir()):
        match = _MIGRATION_FILE.match(path.name)
        if match:
            found.append(
                Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8"))
            )
    versions = [migration.version for migration in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations share a version number in {folder}")
    return found
