"""The SQL files: numbered migrations and the named queries of ``sql/queries.sql``.

The folder is ``notifyq/sql`` inside an installed wheel and ``sql/`` at the top of a source
checkout. Files are read when first asked for, never at import.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

_NAME_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{3,})_(\w+)\.sql$")


def sql_dir() -> Path:
    """The folder holding notifyq's SQL files."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "queries.sql").is_file():
            return candidate
    raise FileNotFoundError(f"notifyq's sql/ folder is missing next to {here}")


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
