"""Schedules over HTTP (docs/http.md#9-schedules): ``POST/GET /v1/schedules``,
``GET/PATCH/DELETE /v1/schedules/{id}`` and ``GET /v1/schedules/{id}/runs``, each
tenant's own (another tenant's id is 404).  A schedule without a session opens each
firing's session in a workspace of the tenant's, as ``POST /v1/sessions`` does."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Response
from pydantic import BaseModel, Field

from parley.errors import InvalidRequest, ScheduleNotFound
from parley.gateway import resources as r
from parley.gateway.dependencies import ClientDep, SettingsDep, Tenant
from parley.gateway.tenants import plausible_id
from parley.gateway.work import light
from parley.schedules import check_overlap, checked_request
from parley.schemas.cron_slots import check_cron, zone_of
from parley.schemas.schedules import ScheduleRecord, ScheduleRun
from parley.validation import MAX_PROMPT_BYTES, check_text
from parley.workspaces import NAME_PATTERN, workspace_root

router = APIRouter(prefix="/v1", responses=r.ERRORS, tags=["schedules"])

SCHEDULES_WORKSPACE = "schedules"
"""The workspace of the tenant's that a schedule without a session and without a
workspace of its own opens its sessions in."""


class ScheduleCreate(r.Body):
    """``POST /v1/schedules``."""

    cron: str = Field(description="Five fields: minute hour day-of-month month day-of-week.")
    prompt: str = Field(description="What each firing submits.")
    timezone: str = Field("UTC", description="The IANA zone the cron is read in.")
    session_id: str | None = Field(
        None, description="The session each firing is a turn of; null: each opens one."
    )
    workspace: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")] | None = Field(
        None,
        description="Without a session: the workspace of the tenant's each firing's "
        f"session is about (default: {SCHEDULES_WORKSPACE!r}).",
    )
    priority: str = Field("batch", description="The turns' lane: interactive or batch.")
    overlap: str = Field("skip", description="skip, enqueue or interrupt.")
    name: str | None = None
    misfire_grace_seconds: int = Field(
        3600, description="How late a slot may still fire; older ones are recorded missed."
    )


class ScheduleUpdate(r.Body):
    """``PATCH /v1/schedules/{id}``: any of these."""

    cron: str | None = None
    timezone: str | None = None
    prompt: str | None = None
    overlap: str | None = None
    paused: bool | None = None


class Schedule(BaseModel):
    """A schedule (docs/http.md#9-schedules)."""

    id: str
    name: str | None
    cron: str
    timezone: str
    prompt: str
    session_id: str | None
    priority: str
    overlap: str
    paused: bool
    misfire_grace_seconds: int
    next_at: datetime | None = Field(description="The next slot (UTC); null while paused.")
    last_turn_id: str | None
    created_at: datetime

    @classmethod
    def of(cls, record: ScheduleRecord) -> Schedule:
        return cls.model_validate(record.to_json())


class Schedules(BaseModel):
    """``GET /v1/schedules``: oldest first."""

    schedules: list[Schedule]


class SlotRun(BaseModel):
    """A slot dealt with: fired (its turn), skipped or missed."""

    at: datetime
    status: str
    turn_id: str | None
    session_id: str | None
    recorded_at: datetime

    @classmethod
    def of(cls, run: ScheduleRun) -> SlotRun:
        return cls.model_validate(run.to_json())


class SlotRuns(BaseModel):
    """``GET /v1/schedules/{id}/runs``: in order, oldest first."""

    runs: list[SlotRun]


def _prompt(value: str) -> str:
    return check_text(value, "prompt", MAX_PROMPT_BYTES)


def _owned(schedule_id: str) -> str:
    if not plausible_id(schedule_id):
        raise ScheduleNotFound(f"no schedule {schedule_id!r}")
    return schedule_id


@router.post("/schedules", status_code=201, response_model=Schedule)
async def create_schedule(
    client: ClientDep,
    settings: SettingsDep,
    owner: Tenant,
    response: Response,
    body: Annotated[ScheduleCreate, Body()],
) -> Schedule:
    """Store a schedule: its prompt is submitted at every slot of its cron in its zone,
    each slot once fleet-wide.  A bad cron, an unknown zone or a bad overlap is 422 and
    stores nothing; another tenant's session is 404."""

    def create() -> ScheduleRecord:
        root = None
        if body.session_id is None:
            # Checked before the workspace directory is made: a refusal makes nothing.
            checked_request(body.cron, body.prompt, timezone=body.timezone, root="/")
            root = workspace_root(settings.workspaces, owner, body.workspace or SCHEDULES_WORKSPACE)
        elif body.workspace is not None:
            raise InvalidRequest("workspace is for a schedule that opens a session each firing")
        asked = checked_request(
            body.cron,
            body.prompt,
            timezone=body.timezone,
            session_id=body.session_id,
            root=root,
            tenant=owner,
            priority=body.priority,
            overlap=body.overlap,
            name=body.name,
            misfire_grace=body.misfire_grace_seconds,
        )
        return client.store.create_schedule(
            cron=asked.cron,
            timezone=asked.timezone,
            prompt=asked.prompt,
            session_id=asked.session_id,
            root=asked.root,
            tenant=owner,
            priority=asked.priority,
            overlap=asked.overlap,
            name=asked.name,
            misfire_grace_seconds=asked.misfire_grace_seconds,
        )

    record = await light(create)
    response.headers["Location"] = f"/v1/schedules/{record.schedule_id}"
    return Schedule.of(record)


@router.get("/schedules", response_model=Schedules)
async def list_schedules(client: ClientDep, owner: Tenant) -> Schedules:
    """The tenant's schedules, oldest first."""
    records = await light(lambda: client.store.list_schedules(owner))
    return Schedules(schedules=[Schedule.of(s) for s in records])


@router.get("/schedules/{schedule_id}", response_model=Schedule)
async def get_schedule(schedule_id: str, client: ClientDep, owner: Tenant) -> Schedule:
    """One of the tenant's schedules, with its next slot."""
    found = _owned(schedule_id)
    return Schedule.of(await light(lambda: client.store.get_schedule(found, owner)))


@router.patch("/schedules/{schedule_id}", response_model=Schedule)
async def update_schedule(
    schedule_id: str,
    client: ClientDep,
    owner: Tenant,
    body: Annotated[ScheduleUpdate, Body()],
) -> Schedule:
    """Change any of its cron, zone, prompt, overlap, or pause it (``paused: true``) or
    resume it.  A new cron or zone, or a resume, moves its next slot to the first after
    now by them."""
    found = _owned(schedule_id)
    changes: dict[str, Any] = {
        "cron": None if body.cron is None else check_cron(body.cron),
        "timezone": None if body.timezone is None else zone_of(body.timezone).key,
        "prompt": None
        if body.prompt is None
        else check_text(body.prompt, "prompt", MAX_PROMPT_BYTES),
        "overlap": None if body.overlap is None else check_overlap(body.overlap),
        "paused": body.paused,
    }
    record = await light(lambda: client.store.update_schedule(found, tenant=owner, **changes))
    return Schedule.of(record)


@router.delete("/schedules/{schedule_id}", status_code=204)
async def delete_schedule(schedule_id: str, client: ClientDep, owner: Tenant) -> Response:
    """Delete it and the record of its slots (the turns it fired stay)."""
    found = _owned(schedule_id)
    await light(lambda: client.store.delete_schedule(found, owner))
    return Response(status_code=204)


@router.get("/schedules/{schedule_id}/runs", response_model=SlotRuns)
async def schedule_runs(schedule_id: str, client: ClientDep, owner: Tenant) -> SlotRuns:
    """Its slots dealt with, in order (the last hundred)."""
    found = _owned(schedule_id)
    runs = await light(lambda: client.store.schedule_runs(found, owner))
    return SlotRuns(runs=[SlotRun.of(run) for run in runs])
