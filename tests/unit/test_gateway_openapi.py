"""The gateway's OpenAPI document declares what it serves: every route's bodies and
answers, and every event kind's payload, which real events fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

import parley
from parley.gateway import GatewaySettings, create_app
from parley.schemas.events import EventKind
from tests.support.helpers import scripted_host

ROUTES = {
    ("post", "/v1/sessions"),
    ("get", "/v1/sessions"),
    ("get", "/v1/sessions/{session_id}"),
    ("post", "/v1/sessions/{session_id}/turns"),
    ("get", "/v1/sessions/{session_id}/history"),
    ("get", "/v1/sessions/{session_id}/tree"),
    ("post", "/v1/sessions/{session_id}/branch"),
    ("post", "/v1/sessions/{session_id}/compact"),
    ("get", "/v1/sessions/{session_id}/compactions"),
    ("delete", "/v1/sessions/{session_id}/compactions/{compaction_id}"),
    ("get", "/v1/turns/{turn_id}"),
    ("get", "/v1/turns/{turn_id}/events"),
    ("get", "/v1/turns/{turn_id}/result"),
    ("post", "/v1/turns/{turn_id}/say"),
    ("post", "/v1/turns/{turn_id}/interrupt"),
    ("post", "/v1/turns/{turn_id}/resume"),
    ("get", "/healthz"),
    ("get", "/readyz"),
}


@pytest.fixture
def document(tmp_path: Path) -> dict[str, Any]:
    client = parley.connect(f"sqlite:///{tmp_path / 'p.db'}")
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(tmp_path)})
    try:
        openapi: dict[str, Any] = create_app(client, settings).openapi()
    finally:
        client.close()
    return openapi


def test_every_route_is_declared_with_its_bodies(document: dict[str, Any]) -> None:
    declared = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert declared >= ROUTES
    assert document["openapi"].startswith("3.")
    for method, path in ROUTES:
        operation = document["paths"][path][method]
        assert any(code.startswith("2") for code in operation["responses"]), (method, path)
        if path.startswith("/v1"):
            assert "401" in operation["responses"], (method, path)
    for path in ("/v1/sessions", "/v1/sessions/{session_id}/turns", "/v1/turns/{turn_id}/say"):
        assert "requestBody" in document["paths"][path]["post"], path
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_every_event_kind_has_its_payload_schema(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    kinds = {v["properties"]["kind"]["const"] for v in schemas["Event"]["oneOf"]}
    assert kinds == {kind.value for kind in EventKind}


def test_real_events_fit_the_declared_schemas(document: dict[str, Any], tmp_path: Path) -> None:
    """A turn with a tool call, a refusal, a steer and a budget's end: each event it
    publishes validates against the document's ``Event`` schema (and a wrong one does
    not)."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "notes.md").write_text("hello\n")
    steps = [
        {
            "text": "Reading. ",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "notes.md"}},
                {"name": "write_file", "arguments": {"path": "secrets/x", "content": "no"}},
            ],
            "chunk_chars": 3,
        },
        {"text": "heard: {last_message}"},
    ]
    host = scripted_host(
        [{"when": ".*", "steps": steps}], policy=parley.Policy(deny_write=["secrets/**"])
    )
    schema = {"$ref": "#/components/schemas/Event", "components": document["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    with parley.connect(f"sqlite:///{tmp_path / 'run.db'}", host=host) as client:
        session = client.open_session(root)
        handle = session.submit("look", contract=parley.TaskContract(max_steps=1))
        handle.say("and the rest")
        events = list(handle.events())
    seen = {event.kind for event in events}
    assert {
        EventKind.QUEUED,
        EventKind.STARTED,
        EventKind.TOKEN,
        EventKind.TOOL_CALL,
        EventKind.TOOL_RESULT,
        EventKind.REFUSAL,
        EventKind.STEP,
        EventKind.END,
    } <= seen
    for event in events:
        validator.validate(event.to_json())
    step = next(e.to_json() for e in events if e.kind is EventKind.STEP)
    step["data"].pop("index")
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(step)
