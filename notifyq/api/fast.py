"""The submission routes, ``POST /jobs`` and ``POST /jobs/batch``, on a path of their own.

They are the hottest routes, so they skip what costs most in FastAPI and gives them nothing:
dependency solving and response serialisation (:class:`_DirectRoute`), json.loads before
validation (:func:`_read_json` parses and validates in one pass), and building the answer as a
model (:func:`enqueued_json` writes it directly). They are still declared and documented like
any other route, their errors still reach the app's handlers, and the token is checked by
TokenGuard before any route runs. ``tests/test_api_schemas.py`` checks that what they write is
what :class:`EnqueuedOut` and :class:`BatchOut` say.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response, params, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from notifyq.api.deps import metrics_of, settings_of, store_of
from notifyq.api.schemas import BatchIn, BatchOut, EnqueuedOut, ErrorOut, JobIn
from notifyq.errors import InvalidJob
from notifyq.jobspec import JobSpec
from notifyq.models import EnqueueResult

Body = TypeVar("Body", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
Endpoint = TypeVar("Endpoint", bound=Handler)


class _DirectRoute(APIRoute):
    """A route whose endpoint takes the Request and answers a Response itself: documented
    from its declaration like any other, but called without FastAPI's dependency solving and
    response serialisation (a fifth of the time of POST /jobs in the app)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint: Callable[[Request], Coroutine[Any, Any, Response]] = self.endpoint
        return endpoint


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads ``model`` with :func:`_read_json` (its
    schema is added to the document's components by :func:`document_bodies`)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


#: The routes of this module, as (path, endpoint, route options), for :func:`add_routes`.
_ROUTES: list[tuple[str, Handler, dict[str, Any]]] = []


def _post(path: str, **options: Any) -> Callable[[Endpoint], Endpoint]:
    """Declares ``endpoint`` as the POST route at ``path``, added to each app by
    :func:`add_routes`."""

    def declare(endpoint: Endpoint) -> Endpoint:
        _ROUTES.append((path, endpoint, options))
        return endpoint

    return declare


def add_routes(app: FastAPI, dependencies: Sequence[params.Depends]) -> None:
    """Adds the submission routes to ``app``'s own router, ahead of the included routers: a
    route of an included router is matched twice per request (once to choose the router, once
    inside it), which these, the hottest routes, should not pay."""
    for path, endpoint, options in _ROUTES:
        app.router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            route_class_override=_DirectRoute,
            dependencies=dependencies,
            **options,
        )


@_post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=EnqueuedOut,
    openapi_extra=_json_body(JobIn),
    responses={
        200: {"model": EnqueuedOut, "description": "A queued duplicate was replaced."},
        413: {"model": ErrorOut, "description": "The body is over the size limit."},
        422: {"model": ErrorOut, "description": "The body is malformed."},
        429: {"model": ErrorOut, "description": "The queue is at its max_depth; see Retry-After."},
    },
    summary="Enqueue a job",
)
async def post_job(request: Request) -> Response:
    job = await _read_json(request, JobIn)
    spec = _spec(job, (await settings_of(request)).default_task)
    result = await (await store_of(request)).enqueue(spec)
    (await metrics_of(request)).enqueued.labels(spec.queue or "default", spec.task or "").inc()
    return Response(
        enqueued_json(result),
        status_code=200 if result.duplicate else 201,
        media_type="application/json",
    )


@_post(
    "/jobs/batch",
    response_model=BatchOut,
    openapi_extra=_json_body(BatchIn),
    responses={
        422: {"model": ErrorOut, "description": "A job is malformed; none is stored."},
        429: {"model": ErrorOut, "description": "A queue is at its max_depth; none is stored."},
    },
    summary="Enqueue many jobs in one round trip",
)
async def post_batch(request: Request) -> Response:
    batch = await _read_json(request, BatchIn)
    default_task = (await settings_of(request)).default_task
    specs: list[JobSpec] = []

    def checked() -> Iterator[JobSpec]:
        # Built as the store takes them, so that the first jobs are inserted while the rest
        # are checked; a 422 from a later one rolls the whole batch back.
        for index, job in enumerate(batch.jobs):
            specs.append(_spec(job, default_task, where=("body", "jobs", index)))
            yield specs[-1]

    results = await (await store_of(request)).enqueue_many(checked())
    enqueued = (await metrics_of(request)).enqueued
    for (queue, task_name), count in Counter(
        (spec.queue or "default", spec.task or "") for spec in specs
    ).items():
        enqueued.labels(queue, task_name).inc(count)
    return Response(batch_json(results), media_type="application/json")


def document_bodies(app: FastAPI) -> None:
    """Adds the schemas of the bodies read by :func:`_read_json` to the OpenAPI document,
    which FastAPI builds only from the parameters it parses itself."""
    models: tuple[type[BaseModel], ...] = (JobIn, BatchIn)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = FastAPI.openapi(app)
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        return document

    app.openapi = openapi  # type: ignore[method-assign]


async def _read_json(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as ``model``, parsed and validated in one pass by pydantic-core
    (FastAPI's json.loads-then-validate took three times as long). Errors are
    RequestValidationErrors located under "body", as FastAPI's are."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise RequestValidationError(
            [
                {
                    "loc": ("body",),
                    "msg": "the body must be JSON, sent with Content-Type: application/json",
                    "type": "content_type",
                }
            ]
        )
    try:
        body = await request.body()
    except ClientDisconnect:
        raise StarletteHTTPException(
            400, "the client went away before sending the whole body"
        ) from None
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]  # a UTF-8 byte order mark, which JSON parsers may ignore (RFC 8259)
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


def _spec(job: JobIn, default_task: str, *, where: tuple[str | int, ...] = ("body",)) -> JobSpec:
    """``job.spec(default_task)``, its InvalidJob answered as a 422 located at ``where``."""
    try:
        return job.spec(default_task)
    except InvalidJob as exc:
        raise RequestValidationError(
            [{"loc": where, "msg": str(exc), "type": "value_error"}]
        ) from None


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def enqueued_json(result: EnqueueResult, iso: Callable[[datetime], str] = _iso) -> str:
    """The JSON of EnqueuedOut, written directly: every value is an id, a status, a boolean
    or a time, none needing escapes (a dict and json.dumps per job took a third of a batch's
    time)."""
    return (
        f'{{"job_id":"{result.job_id}","status":"{result.status.value}",'
        f'"duplicate":{"true" if result.duplicate else "false"},'
        f'"run_at":"{iso(result.run_at)}","created_at":"{iso(result.created_at)}"}}'
    )


def batch_json(results: list[EnqueueResult]) -> str:
    """The JSON of BatchOut, ``{"results": [...]}``. A batch's jobs mostly share one creation
    time, so each time is formatted once."""
    times: dict[datetime, str] = {}

    def iso(moment: datetime) -> str:
        text = times.get(moment)
        if text is None:
            text = times[moment] = _iso(moment)
        return text

    return '{"results":[' + ",".join(enqueued_json(r, iso) for r in results) + "]}"
