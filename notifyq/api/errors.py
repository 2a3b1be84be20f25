"""How the API answers what went wrong: the exception handlers, and the one 404 of a job id.

Every 4xx and 5xx is ``{"detail": ...}`` saying what is wrong (:class:`ErrorOut`). Bad input is
a 422, whichever layer found it (FastAPI, pydantic, notifyq's checks, or PostgreSQL refusing a
value); an enqueue past a queue's max_depth a 429 with Retry-After; an unreachable database a
503 with Retry-After; any other database error a 500 whose cause is logged, not shown.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from notifyq.api.schemas import ErrorOut
from notifyq.db import first_line
from notifyq.errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidJob,
    QueueFull,
    RefusedInput,
    SchemaMismatch,
)

logger = logging.getLogger(__name__)

#: The OpenAPI entry of every route that answers :func:`not_found`.
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No job has this id."}
}


def not_found(job_id: UUID) -> JSONResponse:
    """The answer of every route given a job id that no job has."""
    return JSONResponse({"detail": f"no job with id {job_id}"}, status_code=404)


def install(app: FastAPI) -> None:
    """Adds the API's exception handlers to ``app``."""
    app.add_exception_handler(StarletteHTTPException, _unreadable)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(DatabaseUnavailable, _unavailable)
    app.add_exception_handler(InvalidJob, _invalid)
    app.add_exception_handler(QueueFull, _full)
    app.add_exception_handler(RefusedInput, _refused)
    app.add_exception_handler(DatabaseError, _failed)


def _message(error: dict[str, Any]) -> str:
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    reason = (error.get("ctx") or {}).get("error")
    if error.get("type") == "json_invalid" and reason:
        if "recursion limit" in str(reason):
            return f"the body nests too deeply to read ({reason})"
        if str(reason) not in message:
            message = f"{message}: {reason}"  # say what is wrong, not only where
    return message


async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = [
        {
            "loc": list(error.get("loc", ())),
            "msg": _message(error),
            "type": error.get("type"),
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": f"{exc}; retry later"}, status_code=503, headers={"Retry-After": "1"}
    )


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)


#: Seconds a client refused by a full queue is told to wait (Retry-After): workers drain a
#: queue in seconds, and a client that retries sooner only adds load.
FULL_RETRY_AFTER = 5


async def _full(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, QueueFull)
    return JSONResponse(
        {"detail": str(exc), "queue": exc.queue},
        status_code=429,
        headers={"Retry-After": str(FULL_RETRY_AFTER)},
    )


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    # Input the validation let through but PostgreSQL refused: still the client's input.
    return JSONResponse({"detail": f"the database refused the input: {exc}"}, status_code=422)


async def _failed(request: Request, exc: Exception) -> JSONResponse:
    # A statement the database refused for another reason: a bug, or a schema that is not
    # current. Logged with its cause; the client learns only that it is not its fault.
    logger.error("database error: %s", exc, exc_info=exc)
    detail = str(exc) if isinstance(exc, SchemaMismatch) else "internal database error"
    return JSONResponse({"detail": detail}, status_code=500)


async def _unreadable(request: Request, exc: Exception) -> Response:
    # FastAPI answers a bare 400 when json.loads raises something other than a syntax error: a
    # number of more than 4300 digits, or nesting deeper than Python's recursion limit. Both
    # are malformed bodies to us, so say which and answer 422.
    assert isinstance(exc, StarletteHTTPException)
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, (ValueError, RecursionError)):
        reason = "it nests too deeply" if isinstance(cause, RecursionError) else first_line(cause)
        return JSONResponse(
            {"detail": f"the body is not JSON that notifyq can read: {reason}"},
            status_code=422,
        )
    return await http_exception_handler(request, exc)
