"""The gateway against its own OpenAPI document: schemathesis generates requests for every
operation ``/openapi.json`` declares, valid ones and invalid ones, sends them to a real
``parley gateway`` with a tenant's token, and checks every answer: no 5xx, a status and
a content type the document declares for the operation, a body its schema accepts,
invalid input refused, and the token required.

It runs on the embedded deployments, SQLite and PostgreSQL (they reject different
strings); the fleet serves the same application, and what differs behind it is the
other suite's business.  Each operation gets a bounded number of examples per mode.
Path ids are swapped for those of a real session and its ended turn half of the time,
so that the fuzzer gets past 404 into each route's own validation; the event stream of
an ended turn closes after its last event, so that route is checked like any other (its
``text/event-stream`` body is not JSON, and schemathesis checks its status and content
type only).

schemathesis's pytest integration (``schemathesis.pytest.from_fixture``) does not run on
pytest 9 (it sets ``Function._nodeid``, which pytest 9 no longer has), so each operation
is a pytest parameter and its Hypothesis test is built with ``APIOperation.as_strategy``.
"""

from __future__ import annotations

import random
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis import Case, CheckFunction, GenerationMode
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation, BaseSchema
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from tests.acceptance.test_gateway import ROUTES
from tests.support.deployments import EMBEDDED, on_deployments
from tests.support.gateway import Gateway, Tenant, gateway_fixtures, tenant_fixture

pytestmark = on_deployments(*EMBEDDED)

AnyCase = Case[APIOperation[Any, Any, Any, Any]]
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
MAX_EXAMPLES = 40
# test_gateway.py's routes, the approvals route (tested with approvals themselves) and
# the OpenAI Responses, Files and Batches routes (test_protocol_responses.py,
# test_batches_api.py and test_gateway_files.py) and the UI protocols'
# (test_protocols_ui.py drives them with their stock clients).
OPERATIONS = [(method.upper(), path) for method, path in ROUTES] + [
    ("POST", "/v1/turns/{turn_id}/approvals/{approval_id}"),
    ("POST", "/v1/turns/{turn_id}/signals"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
    ("POST", "/v1/ag-ui"),
    ("POST", "/v1/chat"),
    ("GET", "/v1/chat/{chat_id}/stream"),
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("DELETE", "/v1/files/{file_id}"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
    ("GET", "/v1/batches/{batch_id}/lines"),
    ("POST", "/v1/schedules"),
    ("GET", "/v1/schedules"),
    ("GET", "/v1/schedules/{schedule_id}"),
    ("PATCH", "/v1/schedules/{schedule_id}"),
    ("DELETE", "/v1/schedules/{schedule_id}"),
    ("GET", "/v1/schedules/{schedule_id}/runs"),
]
# The approvals route answers an approval id the turn does not have with 422 (its
# docstring says so), where the document's other routes say 404 for what is not there;
# so a well-formed unknown id fails "valid data is accepted" (reported, not changed here:
# the approvals route is its feature's).  Every other check still runs on it.
# POST /v1/responses speaks OpenAI's protocol, which answers 400 to a well-formed request
# it cannot serve (an unknown previous_response_id is `previous_response_not_found`, an
# input with no user message, client tools): what the official clients expect, and
# test_protocol_responses.py checks; the document's schema cannot state those rules.
# (By path, or by method and path.)
EXCLUDED: dict[str, list[CheckFunction]] = {
    "/v1/turns/{turn_id}/approvals/{approval_id}": [positive_data_acceptance],
    "/v1/responses": [positive_data_acceptance],
    # Likewise POST /v1/batches: an unknown input_file_id is OpenAI's 400 (param
    # input_file_id), and so is a file with no lines; test_batches_api.py checks them.
    "/v1/batches": [positive_data_acceptance],
    # An uploaded file is any bytes: schemathesis's "invalid" file (the four bytes
    # `null`, read as JSON's null against the binary string) is a file.
    "POST /v1/files": [negative_data_rejection],
    # The list's `after` must name one of the tenant's files: another is OpenAI's 400
    # (param after), as for batches; test_gateway_files.py checks it.
    "GET /v1/files": [positive_data_acceptance],
    # A RunAgentInput whose messages hold no user message is valid by AG-UI's schema and
    # refused (422: nothing to run), which no schema can say.
    "/v1/ag-ui": [positive_data_acceptance],
    # Last-Event-ID is a seq for a plain stream and a cursor of the turn's tree with
    # children=1 (docs/sub-agents.md#one-stream-for-the-tree): one header, one pattern
    # for both, so a well-formed cursor on a plain stream (or a seq, or another turn's
    # cursor, with children=1) is refused; test_sub_agents_http.py checks them.
    "GET /v1/turns/{turn_id}/events": [positive_data_acceptance],
    # A schedule's cron and zone are strings the schema cannot check (five cron fields
    # in range, a time that comes; an IANA name): a string of the right type is often
    # refused (422); test_schedules_http.py checks them.
    "POST /v1/schedules": [positive_data_acceptance],
    "PATCH /v1/schedules/{schedule_id}": [positive_data_acceptance],
}
# Every operation with an input gets invalid inputs too (health and readiness take none:
# there is nothing to make invalid).
CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if p not in ("/healthz", "/readyz")
]


gateways, gateway = gateway_fixtures("schema-gateways")


tenant = tenant_fixture([ECHO])


@pytest.fixture
def real_ids(tenant: Tenant) -> dict[str, str]:
    """A session with one ended turn, for the fuzzer's path ids."""
    session = tenant.new_session()
    turn = tenant.submit(session["id"], "hello")
    tenant.result(turn["turn_id"])
    return {"session_id": session["id"], "turn_id": turn["turn_id"], "response_id": turn["turn_id"]}


@pytest.fixture
def api(gateway: Gateway, tenant: Tenant) -> BaseSchema:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    # Two generation settings, each for a rule the document cannot state:
    # - allow_x00: a NUL anywhere in a string is refused (PostgreSQL cannot store it),
    #   which JSON Schema cannot say of the strings nested in a session's metadata
    #   (test_gateway.py sends NULs on purpose);
    # - allow_extra_parameters: an undeclared query parameter is ignored, as HTTP APIs
    #   do, not refused.
    schema.config.generation.update(allow_x00=False, allow_extra_parameters=False)
    # A body over PARLEY_GATEWAY_MAX_BODY is refused with 413 before it is read (a long
    # text of astral characters is well over 1 MiB of JSON): invalid data refused.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]

    @schema.auth()
    class Bearer:
        """The tenant's token, except where a negative case leaves it out on purpose."""

        def get(self, case: AnyCase, context: schemathesis.AuthContext) -> str:
            return tenant.token

        def set(self, case: AnyCase, data: str, context: schemathesis.AuthContext) -> None:
            case.headers["Authorization"] = f"Bearer {data}"

    return schema


def test_the_document_declares_exactly_the_operations_fuzzed_here(api: BaseSchema) -> None:
    declared = set()
    for result in api.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        declared.add((operation.method.upper(), operation.path))
    assert declared == set(OPERATIONS)


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {g}" for m, p, g in CASES]
)
def test_every_operation_answers_as_its_document_says(
    api: BaseSchema,
    tenant: Tenant,
    real_ids: dict[str, str],
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    operation = api[path][method]

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def fuzz(case: AnyCase) -> None:
        chooser = random.Random(repr(case.path_parameters))
        for name, value in real_ids.items():
            if case.path_parameters and name in case.path_parameters and chooser.random() < 0.5:
                case.path_parameters[name] = value
        # One rule between two inputs that a schema cannot state: an Idempotency-Key and
        # a request_id that differ are refused (422); the fuzzer's valid ones agree.
        key = case.headers.get("Idempotency-Key")
        valid = mode is GenerationMode.POSITIVE
        if valid and isinstance(case.body, dict) and key and case.body.get("request_id"):
            case.body["request_id"] = key
        excluded = EXCLUDED.get(f"{method} {path}", EXCLUDED.get(path, []))
        case.call_and_validate(timeout=70, excluded_checks=excluded)

    fuzz()
