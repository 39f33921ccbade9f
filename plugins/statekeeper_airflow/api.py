"""The catalog REST API, under ``/api`` of the plugin app.

Endpoints are plain ``def``: catalog calls are synchronous SQLAlchemy, and FastAPI runs plain
functions in its threadpool instead of blocking the event loop. Pages are cut in the database
(the catalog's ``*_page`` methods: one transaction for the items and their total).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel

from state_engine.catalog import Catalog, JobRecord, SnapshotRecord
from state_engine.catalog import Page as CatalogPage
from state_engine.formatting import is_estimated
from statekeeper_airflow.auth import api_user
from statekeeper_airflow.schemas import (
    ErrorOut,
    FilesSummary,
    JobOut,
    Page,
    RunOut,
    SizePointOut,
    SkewOut,
    SnapshotDetail,
    SnapshotFileOut,
    SnapshotOut,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 500

M = TypeVar("M", bound=BaseModel)


def get_catalog(request: Request) -> Catalog:
    # request.app is this plugin app (not Airflow's), which holds the catalog.
    return request.app.state.catalogs.get()


CatalogDep = Annotated[Catalog, Depends(get_catalog)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"page size, at most {MAX_LIMIT}")]
#: Ids and offsets are 64-bit in the catalog: anything larger is a 400, not a database overflow.
INT64_MAX = (1 << 63) - 1
Offset = Annotated[int, Query(ge=0, le=INT64_MAX, description="items to skip")]
SnapshotId = Annotated[int, Path(ge=1, le=INT64_MAX, description="snapshot id")]

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "a parameter out of range, or an unknown filter value"},
    401: {"model": ErrorOut, "description": "no valid Airflow token"},
    404: {"model": ErrorOut, "description": "unknown job or snapshot"},
    503: {"model": ErrorOut, "description": "catalog unreachable or not at head"},
}

router = APIRouter(prefix="/api", dependencies=[Depends(api_user)], responses=ERRORS)


def paginate(
    page: CatalogPage[Any], limit: int, model: type[M], convert: Callable[[Any], M]
) -> Page[M]:
    return Page[model](  # type: ignore[valid-type]  # a generic model parametrized at run time
        total=page.total,
        limit=limit,
        offset=page.offset,
        items=[convert(item) for item in page.items],
    )


@router.get("/jobs", response_model=Page[JobOut], summary="Jobs, by name")
def list_jobs(
    catalog: CatalogDep, limit: Limit = DEFAULT_LIMIT, offset: Offset = 0
) -> Page[JobOut]:
    latest = {snap.job: snap for snap in catalog.latest_snapshots()}
    return paginate(
        catalog.jobs_page(limit=limit, offset=offset),
        limit,
        JobOut,
        lambda job: job_out(job, latest.get(job.name)),
    )


@router.get("/jobs/{job}", response_model=JobOut, summary="A job and its latest snapshot")
def get_job(job: str, catalog: CatalogDep) -> JobOut:
    return job_out(catalog.get_job(job), catalog.latest_snapshot(job))


@router.get(
    "/jobs/{job}/snapshots",
    response_model=Page[SnapshotOut],
    summary="A job's snapshots, newest checkpoint first",
)
def list_snapshots(
    job: str,
    catalog: CatalogDep,
    limit: Limit = DEFAULT_LIMIT,
    offset: Offset = 0,
    status: Annotated[list[str] | None, Query(description="e.g. COMPLETED, PENDING")] = None,
    kind: Annotated[str | None, Query(description="CHECKPOINT or SAVEPOINT")] = None,
) -> Page[SnapshotOut]:
    snapshots = catalog.snapshots_page(job, status=status, kind=kind, limit=limit, offset=offset)
    return paginate(snapshots, limit, SnapshotOut, SnapshotOut.model_validate)


@router.get(
    "/jobs/{job}/size-history",
    response_model=Page[SizePointOut],
    summary="State size per operator of each completed snapshot, oldest first",
)
def size_history(
    job: str,
    catalog: CatalogDep,
    limit: Limit = DEFAULT_LIMIT,
    offset: Offset = 0,
    operator: str | None = None,
) -> Page[SizePointOut]:
    points = catalog.size_history_page(job, operator=operator, limit=limit, offset=offset)
    return paginate(points, limit, SizePointOut, SizePointOut.model_validate)


@router.get(
    "/snapshots/{snapshot_id}",
    response_model=SnapshotDetail,
    summary="A snapshot, a summary of its files, and its key-group skew per operator",
)
def get_snapshot(snapshot_id: SnapshotId, catalog: CatalogDep) -> SnapshotDetail:
    snapshot = catalog.get_snapshot(snapshot_id)
    return SnapshotDetail(
        snapshot=SnapshotOut.model_validate(snapshot),
        files=FilesSummary.model_validate(catalog.snapshot_files_summary(snapshot_id)),
        skew=[
            SkewOut.model_validate(s).model_copy(
                update={"estimated": is_estimated(snapshot.format)}
            )
            for s in catalog.key_group_skew(snapshot_id)
        ],
    )


@router.get(
    "/snapshots/{snapshot_id}/files",
    response_model=Page[SnapshotFileOut],
    summary="The files a snapshot references, by operator, subtask and path",
)
def snapshot_files(
    snapshot_id: SnapshotId, catalog: CatalogDep, limit: Limit = DEFAULT_LIMIT, offset: Offset = 0
) -> Page[SnapshotFileOut]:
    files = catalog.snapshot_files_page(snapshot_id, limit=limit, offset=offset)
    return paginate(files, limit, SnapshotFileOut, SnapshotFileOut.model_validate)


@router.get("/runs", response_model=Page[RunOut], summary="Maintenance runs, newest first")
def list_runs(
    catalog: CatalogDep,
    limit: Limit = DEFAULT_LIMIT,
    offset: Offset = 0,
    job: str | None = None,
    kind: str | None = None,
    status: str | None = None,
) -> Page[RunOut]:
    runs = catalog.runs_page(job=job, kind=kind, status=status, limit=limit, offset=offset)
    return paginate(runs, limit, RunOut, RunOut.model_validate)


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request) -> dict[str, Any]:
    # FastAPI's own /openapi.json and /docs are switched off: they would be unauthenticated.
    return request.app.openapi()


def job_out(job: JobRecord, latest: SnapshotRecord | None) -> JobOut:
    return JobOut(
        id=job.id,
        name=job.name,
        max_parallelism=job.max_parallelism,
        location=job.location,
        properties=job.properties,
        created_at=job.created_at,
        manage=job.manage,
        latest_snapshot=None if latest is None else SnapshotOut.model_validate(latest),
    )
