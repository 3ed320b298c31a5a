"""The Open Responses specification's schema (``tests/schemas/openresponses.json``, its
published OpenAPI document; ``tests/schemas/README.md`` says where it came from), as
checks of what the Responses routes send: the response object (``ResponseResource``) and
each streaming event (one of those ``POST /responses`` declares for its
``text/event-stream``).

The document is OpenAPI 3.1, whose schemas are JSON Schema 2020-12.  Its
``discriminator`` keywords are annotations only, so an event is checked against the
member of the union its ``type`` names (an error then says which field is wrong, not
that no member matched).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry
from referencing.jsonschema import DRAFT202012

DOCUMENT = Path(__file__).resolve().parents[1] / "schemas" / "openresponses.json"
URI = "urn:openresponses"
OPENAI_ITEMS = frozenset({"mcp_approval_request"})
"""Output items parley sends that are OpenAI's and not the specification's: a call waiting
for a person's answer, in the form the official client takes
(docs/protocols.md#3-openai-responses)."""


@cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    return document


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of the document's schema ``name`` (under ``components/schemas``)."""
    registry: Registry[Any] = Registry().with_resource(
        URI, DRAFT202012.create_resource(_document())
    )
    reference = {"$ref": f"{URI}#/components/schemas/{name}"}
    return jsonschema.Draft202012Validator(reference, registry=registry)


@cache
def event_schemas() -> dict[str, str]:
    """The streaming events the specification defines: each ``type`` and its schema's
    name."""
    content = _document()["paths"]["/responses"]["post"]["responses"]["200"]["content"]
    schemas = _document()["components"]["schemas"]
    names = [
        member["$ref"].rsplit("/", 1)[-1]
        for member in content["text/event-stream"]["schema"]["oneOf"]
    ]
    return {schemas[name]["properties"]["type"]["enum"][0]: name for name in names}


def _check(name: str, instance: Any) -> None:
    error = jsonschema.exceptions.best_match(_validator(name).iter_errors(instance))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the top"
        raise AssertionError(f"not an Open Responses {name}: at {where}, {error.message}")


def check_response(response: dict[str, Any]) -> None:
    """Fail, naming the first field the specification's ``ResponseResource`` refuses."""
    _check("ResponseResource", response)


def check_event(event: dict[str, Any]) -> None:
    """Fail unless ``event`` is one of the specification's streaming events, whole."""
    name = event_schemas().get(event.get("type"))  # type: ignore[arg-type]
    if name is None:
        raise AssertionError(f"{event.get('type')!r} is not a streaming event of Open Responses")
    _check(name, event)
