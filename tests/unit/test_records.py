"""Records shared across boundaries: contracts, the stored step form, usage, statuses."""

from __future__ import annotations

import json
from collections import UserList
from types import MappingProxyType
from typing import Any

import pytest

from parley.errors import CodecError, InvalidRequest
from parley.schemas.messages import StepInput, StepPayload, ToolCall, ToolResult
from parley.schemas.records import TaskContract, TurnStatus, Usage

# ---------------------------------------------------------------------------- TaskContract


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"max_steps": 0}, id="zero-steps"),
        pytest.param({"max_steps": -1}, id="negative-steps"),
        pytest.param({"max_steps": True}, id="bool-steps"),
        pytest.param({"max_steps": 2.0}, id="float-steps"),
        pytest.param({"max_steps": "3"}, id="string-steps"),
        pytest.param({"max_tokens": 0}, id="zero-tokens"),
        pytest.param({"max_tokens": False}, id="bool-tokens"),
        pytest.param({"check": "pytest -q"}, id="check-without-budget"),
        pytest.param({"check": "", "max_steps": 3}, id="empty-check"),
        pytest.param({"check": "   ", "max_steps": 3}, id="blank-check"),
        pytest.param({"check": ["pytest"], "max_steps": 3}, id="check-not-a-string"),
        pytest.param({"check": "pytest\x00-q", "max_steps": 3}, id="check-with-nul"),
        pytest.param({"max_steps": 3, "check_timeout": 0}, id="zero-timeout"),
        pytest.param({"max_steps": 3, "check_timeout": -1.5}, id="negative-timeout"),
    ],
)
def test_invalid_contracts(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        TaskContract(**options)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_steps": 1},
        {"max_tokens": 1},
        {"max_steps": 8, "max_tokens": 50_000, "check": "pytest -q"},
        {"max_tokens": 10, "check": "make test", "check_timeout": 0.5},
    ],
)
def test_valid_contracts_round_trip(options: dict[str, Any]) -> None:
    contract = TaskContract(**options)
    assert TaskContract.from_json(json.loads(json.dumps(contract.to_json()))) == contract


def test_no_contract_stays_none() -> None:
    assert TaskContract.from_json(None) is None


def test_a_contracts_mcp_servers_take_what_their_type_says() -> None:
    # Any sequence of mappings or of objects with to_json(): kept as a tuple of dicts.
    spec = {"name": "calc", "command": ["calc-mcp"]}

    class Spec:
        def to_json(self) -> dict[str, Any]:
            return dict(spec)

    contract = TaskContract(mcp_servers=UserList([MappingProxyType(spec), Spec()]))
    assert contract.mcp_servers == (spec, spec)
    assert all(type(s) is dict for s in contract.mcp_servers)
    assert TaskContract.from_json(json.loads(json.dumps(contract.to_json()))) == contract
    for wrong in ("calc", spec, [3], [{"name": "calc", "env": MappingProxyType({})}]):
        with pytest.raises(InvalidRequest, match="mcp_servers"):
            TaskContract(mcp_servers=wrong)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- StepPayload


def full_payload() -> StepPayload:
    return StepPayload(
        inputs=(StepInput(origin="steer", text="only docs"), StepInput(origin="check", text="F")),
        text="reading ✓",
        tool_calls=(
            ToolCall(id="call_1_0", name="read_file", arguments='{"path": "a"}'),
            ToolCall(id="call_1_1", name="write_file", arguments="raw, not json"),
        ),
        tool_results=(
            ToolResult(call_id="call_1_0", name="read_file", content="body"),
            ToolResult(
                call_id="call_1_1",
                name="write_file",
                content="refused",
                is_error=True,
                refusal="deny_write:secrets/**",
            ),
        ),
        usage=Usage(input_tokens=100, output_tokens=20, cached_tokens=64),
        request_digest="ab" * 32,
        model="scripted",
    )


def test_step_payload_round_trip_through_json_text() -> None:
    payload = full_payload()
    stored = json.dumps(payload.to_json())
    assert StepPayload.from_json(json.loads(stored)) == payload
    assert json.loads(stored)["v"] == 1


def test_empty_step_payload_round_trip() -> None:
    assert StepPayload.from_json(StepPayload().to_json()) == StepPayload()


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_unknown_step_payload_version(version: object) -> None:
    data = full_payload().to_json()
    if version is None:
        del data["v"]
    else:
        data["v"] = version
    with pytest.raises(CodecError):
        StepPayload.from_json(data)


def test_unknown_step_input_origin() -> None:
    data = full_payload().to_json()
    data["inputs"][0]["origin"] = "operator"
    with pytest.raises(CodecError):
        StepPayload.from_json(data)


# ---------------------------------------------------------------------------- Usage


def test_usage_addition_and_total() -> None:
    a = Usage(input_tokens=10, output_tokens=3, cached_tokens=4)
    b = Usage(input_tokens=5, output_tokens=7, cached_tokens=1)
    assert a + b == Usage(input_tokens=15, output_tokens=10, cached_tokens=5)
    assert (a + b).total == 25
    assert a.total == 13  # cached tokens are part of the input, not counted again
    assert Usage() + a == a
    assert Usage().total == 0


def test_usage_json_reads_missing_keys_as_zero() -> None:
    assert Usage.from_json({"output_tokens": 2}) == Usage(output_tokens=2)
    usage = Usage(input_tokens=1, output_tokens=2, cached_tokens=3)
    assert Usage.from_json(usage.to_json()) == usage


# ---------------------------------------------------------------------------- TurnStatus

STATUS_TABLE = [
    # status,                      terminal, has_reply, moves_head
    (TurnStatus.QUEUED, False, False, False),
    (TurnStatus.RUNNING, False, False, False),
    (TurnStatus.WAITING, False, False, False),
    (TurnStatus.FINISHED, True, True, True),
    (TurnStatus.SUCCEEDED, True, True, True),
    (TurnStatus.CHECK_FAILED, True, False, True),
    (TurnStatus.BUDGET_EXCEEDED, True, False, True),
    (TurnStatus.CANCELLED, True, False, True),
    (TurnStatus.FAILED, True, False, False),
]


@pytest.mark.parametrize(("status", "terminal", "has_reply", "moves_head"), STATUS_TABLE)
def test_turn_status_table(
    status: TurnStatus, terminal: bool, has_reply: bool, moves_head: bool
) -> None:
    assert (status.terminal, status.has_reply, status.moves_head) == (
        terminal,
        has_reply,
        moves_head,
    )


def test_status_table_covers_every_status() -> None:
    assert {row[0] for row in STATUS_TABLE} == set(TurnStatus)


def test_statuses_are_their_spec_strings() -> None:
    assert [str(s) for s in TurnStatus] == [
        "queued",
        "running",
        "waiting",
        "finished",
        "succeeded",
        "check_failed",
        "budget_exceeded",
        "cancelled",
        "failed",
    ]
