"""Schedules over HTTP (docs/http.md#9-schedules), on every deployment: a tenant makes,
lists, reads, changes, pauses and deletes its own schedules, and another tenant's are
404 on every route; bad input is 422 and stores nothing; a slot that comes fires a turn
the tenant can read."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, update

from parley.schemas import tables as t
from tests.support.deployments import ALL, on_deployments
from tests.support.gateway import Gateway, Tenant, gateway_fixtures, scripted_tenant

pytestmark = on_deployments(*ALL)

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
FIELDS = {
    "id",
    "name",
    "cron",
    "timezone",
    "prompt",
    "session_id",
    "priority",
    "overlap",
    "paused",
    "misfire_grace_seconds",
    "next_at",
    "last_turn_id",
    "created_at",
}

gateways, gateway = gateway_fixtures("schedules")


@pytest.fixture
def alpha(gateway: Gateway) -> Tenant:
    return scripted_tenant(gateway, [ECHO])


@pytest.fixture
def beta(gateway: Gateway) -> Tenant:
    return scripted_tenant(gateway, [ECHO])


def create(tenant: Tenant, **body: Any) -> dict[str, Any]:
    answer = tenant.http.post("/v1/schedules", json={"cron": "0 9 * * *", "prompt": "p", **body})
    assert answer.status_code == 201, answer.text
    assert answer.headers["Location"] == f"/v1/schedules/{answer.json()['id']}"
    created: dict[str, Any] = answer.json()
    return created


def test_a_tenant_keeps_its_schedules(alpha: Tenant) -> None:
    made = create(alpha, timezone="America/New_York", overlap="enqueue", name="digest")
    assert set(made) == FIELDS
    assert made["timezone"] == "America/New_York" and made["overlap"] == "enqueue"
    next_at = datetime.fromisoformat(made["next_at"])
    assert next_at > datetime.now(UTC)
    assert made["id"] in [s["id"] for s in alpha.http.get("/v1/schedules").json()["schedules"]]
    assert alpha.http.get(f"/v1/schedules/{made['id']}").json() == made

    paused = alpha.http.patch(f"/v1/schedules/{made['id']}", json={"paused": True})
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["next_at"] is None
    changed = alpha.http.patch(
        f"/v1/schedules/{made['id']}",
        json={"paused": False, "cron": "30 4 * * *", "timezone": "Asia/Kolkata", "prompt": "q"},
    ).json()
    assert (changed["cron"], changed["timezone"], changed["prompt"]) == (
        "30 4 * * *",
        "Asia/Kolkata",
        "q",
    )
    assert changed["next_at"] is not None and changed["paused"] is False

    assert alpha.http.delete(f"/v1/schedules/{made['id']}").status_code == 204
    assert alpha.http.get(f"/v1/schedules/{made['id']}").status_code == 404


def test_another_tenants_schedule_is_unknown_on_every_route(alpha: Tenant, beta: Tenant) -> None:
    mine = create(alpha)
    session = alpha.new_session()
    path = f"/v1/schedules/{mine['id']}"
    for method, url, body in (
        ("GET", path, None),
        ("PATCH", path, {"paused": True}),
        ("DELETE", path, None),
        ("GET", f"{path}/runs", None),
    ):
        answer = beta.http.request(method, url, json=body)
        assert answer.status_code == 404, (method, url, answer.text)
    assert mine["id"] not in [s["id"] for s in beta.http.get("/v1/schedules").json()["schedules"]]
    # Nor may it fire into alpha's session.
    answer = beta.http.post(
        "/v1/schedules", json={"cron": "* * * * *", "prompt": "p", "session_id": session["id"]}
    )
    assert answer.status_code == 404, answer.text
    assert alpha.http.get(path).json() == mine  # unchanged


@pytest.mark.parametrize(
    "body",
    [
        {"cron": "61 * * * *"},
        {"cron": "* * * *"},
        {"timezone": "Mars/Olympus"},
        {"overlap": "sometimes"},
        {"priority": "urgent"},
        {"prompt": " "},
        {"misfire_grace_seconds": 0},
        {"unknown": 1},
    ],
)
def test_bad_input_is_422_and_stores_nothing(alpha: Tenant, body: dict[str, Any]) -> None:
    before = alpha.http.get("/v1/schedules").json()
    answer = alpha.http.post("/v1/schedules", json={"cron": "* * * * *", "prompt": "p", **body})
    assert answer.status_code == 422, answer.text
    assert alpha.http.get("/v1/schedules").json() == before


def test_a_slot_fires_a_turn_of_the_tenants(gateway: Gateway, alpha: Tenant) -> None:
    session = alpha.new_session()
    made = create(alpha, session_id=session["id"], priority="interactive", cron="* * * * *")
    engine = create_engine(gateway.env["PARLEY_DATABASE_URL"])
    try:
        with engine.begin() as db:
            db.execute(
                update(t.schedules)
                .where(t.schedules.c.id == made["id"])
                .values(next_at=datetime.now(UTC) - timedelta(seconds=1))
            )
    finally:
        engine.dispose()
    deadline = time.monotonic() + 30
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not runs:
        runs = alpha.http.get(f"/v1/schedules/{made['id']}/runs").json()["runs"]
        time.sleep(0.2)
    assert [run["status"] for run in runs] == ["fired"], runs
    result = alpha.result(runs[0]["turn_id"])
    assert result["reply"] == "heard: p"
    assert (
        alpha.http.get(f"/v1/schedules/{made['id']}").json()["last_turn_id"] == runs[0]["turn_id"]
    )
