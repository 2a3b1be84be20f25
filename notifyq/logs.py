"""Logging set-up for the command line: human-readable lines, or one JSON object per line.

``NOTIFYQ_LOG_FORMAT=json`` gives objects with ``ts``, ``level``, ``logger``, ``message`` and, on
job events, ``job_id``, ``task``, ``queue``, ``attempt``, ``duration_ms`` and ``event``. Payloads
are never logged at INFO.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone

#: Fields a log call may pass in ``extra=`` that the JSON format carries.
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "duration_ms", "event", "worker_id")


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in JOB_FIELDS:
            value = record.__dict__.get(field)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _plain_uvicorn_name(record: logging.LogRecord) -> bool:
    # uvicorn logs its ordinary messages as "uvicorn.error"; an operator reads that as errors.
    if record.name == "uvicorn.error":
        record.name = "uvicorn"
    return True


def configure(level: str, fmt: str) -> None:
    """Sends notifyq's and uvicorn's logs to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(_plain_uvicorn_name)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # uvicorn installs its own handlers; route them through ours.
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers[:] = []
        uvicorn_logger.propagate = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # The embedded server's progress lines are printed as they happen by the CLI.
    logging.getLogger("notifyq.embedded").setLevel(logging.WARNING)
