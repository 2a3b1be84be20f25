"""The workflow routes: create one (``POST /workflows``), read one (``GET /workflows/{id}``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from notifyq.api.deps import SettingsDep, StoreDep
from notifyq.api.schemas import ErrorOut, JobOut, WorkflowCreatedOut, WorkflowIn, WorkflowOut
from notifyq.errors import InvalidJob
from notifyq.jobspec import JobSpec
from notifyq.workflows import MAX_WORKFLOW_JOBS, plan, workflow_status

router = APIRouter()


@router.post(
    "/workflows",
    status_code=201,
    response_model=WorkflowCreatedOut,
    responses={
        422: {
            "model": ErrorOut,
            "description": "A cycle, a duplicate or unknown ref, an unknown job id or a "
            "malformed job: nothing is created.",
        }
    },
    summary="Create jobs that depend on each other, in one transaction",
)
async def post_workflow(
    body: WorkflowIn, store: StoreDep, settings: SettingsDep
) -> WorkflowCreatedOut:
    def make_spec(
        index: int, job: Mapping[str, Any], depends_on: list[UUID], workflow_id: UUID,
        job_id: UUID,
    ) -> JobSpec:  # fmt: skip
        model = body.jobs[index]
        if model.dedup_key is not None:
            raise InvalidJob(
                f"jobs[{index}] (ref {model.ref!r}): a job of a workflow cannot have a "
                "dedup_key (a duplicate would leave the jobs that depend on it naming another "
                "job)"
            )
        try:
            return model.spec(
                settings.default_task, depends_on=depends_on, workflow_id=workflow_id,
                job_id=job_id,
            )  # fmt: skip
        except InvalidJob as exc:
            raise InvalidJob(f"jobs[{index}] (ref {model.ref!r}): {exc}") from None

    shape = [{"ref": job.ref, "depends_on": job.depends_on} for job in body.jobs]
    planned = plan(shape, make_spec)
    await store.enqueue_many(planned.specs)
    return WorkflowCreatedOut(workflow_id=planned.workflow_id, jobs=planned.ids)


@router.get(
    "/workflows/{workflow_id}",
    response_model=WorkflowOut,
    responses={404: {"model": ErrorOut, "description": "No workflow has this id."}},
    summary="Read a workflow: its status and its jobs",
)
async def get_workflow(workflow_id: UUID, store: StoreDep) -> WorkflowOut | JSONResponse:
    jobs = await store.workflow_jobs(workflow_id, limit=MAX_WORKFLOW_JOBS)
    if not jobs:
        return JSONResponse({"detail": f"no workflow {workflow_id}"}, status_code=404)
    return WorkflowOut(
        workflow_id=workflow_id,
        status=workflow_status(jobs),
        jobs=[JobOut.of(job) for job in jobs],
    )
