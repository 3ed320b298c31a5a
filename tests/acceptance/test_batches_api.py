"""OpenAI's Files and Batch APIs over durable turns (docs/batches.md) through a real
``parley gateway`` process, with the official ``openai`` client pointed at it, on every
deployment: a batch from an uploaded file whose counts grow monotonically to
``completed`` and whose output has each ``custom_id`` once, each body a Response whose id
is a turn; lines that continue conversations; malformed lines in the error file and
the batch going on; a line followed live while the batch runs; a cancel mid-way whose
counts and files agree with what ran; a file of chat completions in the shape OpenAI
documents run unchanged, each body a ``ChatCompletion`` the client parses; the Batch
object's model and usage; another tenant's ids answering 404; bad requests refused in
OpenAI's form, changing nothing."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tests.support.abusive_lines import ABUSIVE
from tests.support.deployments import ALL, on_deployments
from tests.support.gateway import (
    Gateway,
    Tenant,
    deployment_env,
    gateway_fixtures,
    make_tokens,
    start_gateway,
    tenant_fixture,
)

pytestmark = on_deployments(*ALL)

ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
SLOW: dict[str, Any] = {
    "when": "^slow",
    "steps": [{"text": "".join(f"w{i} " for i in range(20)), "chunk_chars": 3, "delay_ms": 40}],
}
LIST: dict[str, Any] = {"name": "list_files", "arguments": {}}
TOOL: dict[str, Any] = {
    "when": "^tool",
    "steps": [{"tool_calls": [LIST]}, {"text": "listed."}],
}
RULES = [SLOW, TOOL, ECHO]


gateways, gateway = gateway_fixtures("batch-gateways")


tenant = tenant_fixture(RULES)


@pytest.fixture
def api(gateway: Gateway, tenant: Tenant) -> Iterator[OpenAI]:
    with OpenAI(
        base_url=f"{gateway.url}/v1", api_key=tenant.token, max_retries=0, timeout=60
    ) as client:
        yield client


def line(custom_id: str, body: dict[str, Any] | str, **extra: Any) -> str:
    value: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": "/v1/responses"}
    value["body"] = {"input": body} if isinstance(body, str) else body
    return json.dumps({**value, **extra})


def upload(api: OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    created = api.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
    assert created.purpose == "batch" and created.bytes == len(data)
    assert api.files.content(created.id).content == data
    return created.id


def create(api: OpenAI, lines: list[str], endpoint: Any = "/v1/responses") -> Any:
    batch = api.batches.create(
        input_file_id=upload(api, lines), endpoint=endpoint, completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.endpoint == endpoint
    return batch


def watch(api: OpenAI, batch_id: str, *, until: tuple[str, ...] = ("completed",)) -> Any:
    """Poll the batch to its end, checking that its counts never go back."""
    deadline = time.monotonic() + 60
    last = (0, 0)
    while True:
        batch = api.batches.retrieve(batch_id)
        counts = batch.request_counts
        assert counts is not None
        now = (counts.completed, counts.failed)
        assert now[0] >= last[0] and now[1] >= last[1], (last, now)
        last = now
        if batch.status not in ("in_progress", "cancelling"):
            assert batch.status in until, batch
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)


def jsonl(api: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    text = api.files.content(file_id).text
    return [json.loads(row) for row in text.splitlines() if row]


def test_a_batch_runs_every_line_as_a_turn_and_its_output_names_them(
    api: OpenAI, tenant: Tenant
) -> None:
    lines = [line(f"ticket-{n}", f"classify ticket {n}") for n in range(12)]
    lines.insert(3, "{not json")
    lines.insert(7, line("ticket-2", "a custom_id used twice"))
    lines.append(line("bad-url", "x", url="/v1/chat/completions"))
    lines.append(line("tools", "tool turn"))
    batch = create(api, lines)
    assert batch.request_counts is not None and batch.request_counts.total == len(lines)

    ended = watch(api, batch.id)

    assert ended.request_counts.completed == 13 and ended.request_counts.failed == 3
    assert ended.completed_at is not None and ended.output_file_id and ended.error_file_id
    output = jsonl(api, ended.output_file_id)
    assert sorted(r["custom_id"] for r in output) == sorted(
        [f"ticket-{n}" for n in range(12)] + ["tools"]
    )
    for row in output:
        body = row["response"]["body"]
        assert row["error"] is None and row["response"]["status_code"] == 200
        assert row["response"]["request_id"] == body["id"]
        # The body is the response of a turn: the Responses API answers it by that id.
        stored = api.responses.retrieve(body["id"])
        assert stored.status == "completed" and stored.output_text == body["output_text"]
    by_id = {r["custom_id"]: r["response"]["body"] for r in output}
    assert by_id["ticket-5"]["output_text"] == "heard: classify ticket 5"
    assert by_id["tools"]["output_text"] == "listed."
    assert [item["type"] for item in by_id["tools"]["output"]][:2] == [
        "function_call",
        "function_call_output",
    ]
    errors = jsonl(api, ended.error_file_id)
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [
        (None, "invalid_json"),
        ("ticket-2", "duplicate_custom_id"),
        ("bad-url", "invalid_url"),
    ]
    assert all(r["response"] is None for r in errors)
    # Each line's session is the tenant's, as any conversation.
    session = tenant.http.get(f"/v1/sessions/{by_id['ticket-0']['conversation']['id']}")
    assert session.status_code == 200, session.text
    listed = api.batches.list(limit=5)
    assert [b.id for b in listed.data][:1] == [batch.id]


def test_lines_the_store_cannot_keep_fail_alone_and_the_batch_runs(
    api: OpenAI, tenant: Tenant
) -> None:
    good = [line("first", "first line").encode(), line("last", "last line").encode()]
    data = b"\n".join([good[0], *(raw for raw, _code in ABUSIVE.values()), good[1]]) + b"\n"
    upload = api.files.create(file=("abusive.jsonl", io.BytesIO(data)), purpose="batch")
    batch = api.batches.create(
        input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
    )
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert batch.request_counts.total == len(ABUSIVE) + 2

    ended = watch(api, batch.id)

    assert (ended.request_counts.completed, ended.request_counts.failed) == (2, len(ABUSIVE))
    output = jsonl(api, ended.output_file_id)
    assert sorted(row["custom_id"] for row in output) == ["first", "last"]
    errors = jsonl(api, ended.error_file_id)
    assert [row["error"]["code"] for row in errors] == [code for _raw, code in ABUSIVE.values()]
    assert all(len(row["error"]["message"]) <= 500 for row in errors)
    # A workspace for each line that opened a session, and none for the others.
    made = [d for d in tenant.workspaces.iterdir() if d.is_dir() and d.name[0] != "."]
    assert len(made) == 2, made


def test_a_batch_of_refused_lines_says_why_in_a_few_words_not_its_input(
    api: OpenAI, tenant: Tenant
) -> None:
    key = "k" * 200_000  # each line refused for an unknown key this long
    lines = [line(f"r{n}", "hello", **{f"{key}{n}": 1}) for n in range(12)]
    batch = api.batches.create(
        input_file_id=upload(api, lines), endpoint="/v1/responses", completion_window="24h"
    )  # 2.4 MB of input

    failed = api.batches.retrieve(batch.id)

    assert failed.status == "failed" and failed.errors is not None
    assert [e.code for e in failed.errors.data or []] == ["invalid_line"] * 12
    # The object quotes its lines' errors, a few hundred characters each (it was the
    # input twice over: a 20 MiB file made a 42 MB object, on every read).
    listed = tenant.http.get("/v1/batches", params={"limit": 1})
    assert len(listed.content) < 20_000 and batch.id in listed.text, len(listed.content)
    assert all(len(row["error"]["message"]) <= 500 for row in jsonl(api, failed.error_file_id))


@pytest.mark.embedded_only
def test_a_large_file_is_accepted_a_part_and_a_line_at_a_time(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    env = deployment_env(backend, request, f"sqlite:///{tmp_path / 'large.db'}")
    gateway = start_gateway(env, tmp_path / "gateway", tokens=make_tokens(["large"]))
    try:
        pad = "x" * 3100
        rows = (line(f"l{n}", f"hold {n} {pad}") for n in range(20_000))
        data = ("\n".join(rows) + "\n").encode()  # 61 MiB
        with OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.token, timeout=600) as big:
            upload = big.files.create(file=("large.jsonl", io.BytesIO(data)), purpose="batch")
            del data
            before = gateway.peak_rss()
            batch = big.batches.create(
                input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
            )
            grown = gateway.peak_rss() - before
            assert batch.request_counts is not None and batch.request_counts.total == 20_000
            big.batches.cancel(batch.id)
        # Read whole, the file took the gateway's peak 160 MiB up (636 MiB for 100,000
        # shorter lines); read a part and a line at a time, some 20 MiB.
        assert grown < 80 << 20, f"the gateway's peak memory grew {grown >> 20} MiB"
    finally:
        gateway.stop()


def test_lines_continue_conversations_and_wait_their_turn_in_them(api: OpenAI) -> None:
    first = api.responses.create(model="m", input="remember the colour blue")
    assert first.conversation is not None
    conversation = first.conversation.id
    second = api.responses.create(model="m", input="and green", conversation=conversation)
    batch = create(
        api,
        [
            line("after", {"input": "what came first?", "previous_response_id": second.id}),
            line("in-conv", {"input": "and then?", "conversation": conversation}),
            line("nowhere", {"input": "x", "previous_response_id": "resp_unknown"}),
            line("earlier", {"input": "x", "previous_response_id": first.id}),
        ],
    )

    ended = watch(api, batch.id)

    output = {r["custom_id"]: r["response"]["body"] for r in jsonl(api, ended.output_file_id)}
    assert set(output) == {"after", "in-conv"}
    assert {body["conversation"]["id"] for body in output.values()} == {conversation}
    # Both queued after the conversation's last response, one after the other.
    parents = {body["previous_response_id"] for body in output.values()}
    assert second.id in parents
    errors = {r["custom_id"]: r["error"]["code"] for r in jsonl(api, ended.error_file_id)}
    assert errors == {
        "nowhere": "previous_response_not_found",
        "earlier": "previous_response_not_latest",
    }


def test_a_line_is_followed_live_while_its_batch_runs(api: OpenAI, tenant: Tenant) -> None:
    batch = create(api, [line(f"s{n}", f"slow {n}") for n in range(3)])
    page = tenant.http.get(f"/v1/batches/{batch.id}/lines")
    assert page.status_code == 200, page.text
    turn_id = page.json()["data"][0]["turn_id"]
    text = "".join(
        event.delta
        for event in api.responses.retrieve(turn_id, stream=True)
        if event.type == "response.output_text.delta"
    )
    assert text == "".join(f"w{i} " for i in range(20))
    watch(api, batch.id)


def test_a_cancel_stops_the_lines_and_the_files_agree_with_what_ran(
    api: OpenAI, tenant: Tenant
) -> None:
    batch = create(api, [line(f"s{n}", f"slow {n}") for n in range(200)])
    deadline = time.monotonic() + 30
    while api.batches.retrieve(batch.id).request_counts.completed < 2:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.05)

    cancelling = api.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    asked = (tenant.control.dir / "requests.jsonl").read_text().count("\n")
    ended = watch(api, batch.id, until=("cancelled",))

    counts = ended.request_counts
    assert counts.completed + counts.failed == counts.total == 200
    assert 2 <= counts.completed < 200
    output, errors = jsonl(api, ended.output_file_id), jsonl(api, ended.error_file_id)
    assert len(output) == counts.completed and len(errors) == counts.failed
    assert {r["custom_id"] for r in output} | {r["custom_id"] for r in errors} == {
        f"s{n}" for n in range(200)
    }
    # As OpenAI's lines a batch's cancel stopped: no response, and why.
    assert all(r["response"] is None for r in errors)
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}
    # Only the lines running at the cancel called the model after it.
    time.sleep(0.5)
    later = (tenant.control.dir / "requests.jsonl").read_text().count("\n")
    assert later - asked <= 70, (asked, later)
    assert ended.cancelled_at is not None
    again = api.batches.cancel(batch.id)
    assert again.status == "cancelled" and again.request_counts == ended.request_counts


def chat(custom_id: str, messages: list[dict[str, Any]], **body: Any) -> str:
    """A chat completions line, as OpenAI's Batch API guide writes them."""
    request = {"model": "gpt-3.5-turbo-0125", "messages": messages, **body}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": request}
    )


def test_a_chat_completions_file_runs_unchanged_and_each_body_is_a_chat_completion(
    api: OpenAI, tenant: Tenant
) -> None:
    system = {"role": "system", "content": "You are a helpful assistant."}
    lines = [
        chat("request-1", [system, {"role": "user", "content": "Hello world!"}], max_tokens=1000),
        chat(
            "request-2",
            [
                {"role": "system", "content": "You are an unhelpful assistant."},
                {"role": "user", "content": "Hello world!"},
            ],
            max_tokens=1000,
        ),
        chat(
            "with-history",
            [
                system,
                {"role": "user", "content": "My name is Ann."},
                {"role": "assistant", "content": "Hello, Ann."},
                {"role": "user", "content": [{"type": "text", "text": "What is my name?"}]},
            ],
            temperature=0,
        ),
        chat("budget", [{"role": "user", "content": "tool turn"}], max_completion_tokens=1),
        chat(
            "orphan-call",
            [
                {"role": "user", "content": "look"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "user", "content": "well?"},
            ],
        ),
        line("a-responses-line", "x"),
    ]
    batch = create(api, lines, endpoint="/v1/chat/completions")

    ended = watch(api, batch.id)

    counts = ended.request_counts
    assert (counts.total, counts.completed, counts.failed) == (6, 4, 2)
    completions = {
        row["custom_id"]: ChatCompletion.model_validate(row["response"]["body"])
        for row in jsonl(api, ended.output_file_id)
    }
    assert list(completions) == ["request-1", "request-2", "with-history", "budget"]
    for name in ("request-1", "request-2"):
        assert completions[name].choices[0].message.content == "heard: Hello world!"
        assert completions[name].choices[0].finish_reason == "stop"
    assert completions["with-history"].choices[0].message.content == "heard: What is my name?"
    budget = completions["budget"].choices[0]
    assert budget.finish_reason == "length" and budget.message.content is None
    assert all(c.object == "chat.completion" and c.usage for c in completions.values())
    # The Batch object: the model that ran the lines, and what they spent, summed.
    assert ended.model and {c.model for c in completions.values()} == {ended.model}
    assert ended.usage is not None
    spent = [c.usage.total_tokens for c in completions.values() if c.usage is not None]
    assert ended.usage.total_tokens == sum(spent)
    assert ended.usage.input_tokens > 0 and ended.usage.output_tokens > 0
    errors = {r["custom_id"]: r for r in jsonl(api, ended.error_file_id)}
    assert {k: r["error"]["code"] for k, r in errors.items()} == {
        "orphan-call": "invalid_messages",
        "a-responses-line": "invalid_url",
    }
    assert all(r["response"] is None for r in errors.values())
    # The earlier messages are the line's session's history, the prompt its last turn.
    page = tenant.http.get(f"/v1/batches/{batch.id}/lines").json()["data"]
    session = next(row["session_id"] for row in page if row["custom_id"] == "with-history")
    history = tenant.http.get(f"/v1/sessions/{session}/history").json()["turns"]
    assert [(t["prompt"], t["reply"]) for t in history] == [
        ("My name is Ann.", "Hello, Ann."),
        ("What is my name?", "heard: What is my name?"),
    ]


def test_another_tenants_batches_and_files_are_not_found(api: OpenAI, gateway: Gateway) -> None:
    batch = create(api, [line("one", "hello")])
    watch(api, batch.id)
    other = gateway.tenant()
    with OpenAI(base_url=f"{gateway.url}/v1", api_key=other.token, max_retries=0) as stranger:
        for attempt in (
            lambda: stranger.batches.retrieve(batch.id),
            lambda: stranger.batches.cancel(batch.id),
            lambda: stranger.files.retrieve(batch.input_file_id),
            lambda: stranger.files.content(batch.output_file_id or ""),
        ):
            with pytest.raises(openai.NotFoundError):
                attempt()
        assert stranger.batches.list().data == []
        with pytest.raises(openai.BadRequestError) as refused:
            stranger.batches.create(
                input_file_id=batch.input_file_id,
                endpoint="/v1/responses",
                completion_window="24h",
            )
        assert refused.value.body["param"] == "input_file_id"  # type: ignore[index]


def test_a_repeated_idempotency_key_answers_the_same_batch_and_makes_no_other(
    api: OpenAI, tenant: Tenant
) -> None:
    # What a client does when the answer to its create was lost (a gateway died, say):
    # it sends the same request again, with the same key.
    body = {"input_file_id": "", "endpoint": "/v1/responses", "completion_window": "24h"}
    body["input_file_id"] = upload(api, [line("one", "hello"), line("two", "again")])
    key = {"Idempotency-Key": f"retry-{uuid.uuid4().hex}"}
    first = tenant.http.post("/v1/batches", json=body, headers=key)
    again = tenant.http.post("/v1/batches", json=body, headers=key)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    assert [b.id for b in api.batches.list().data].count(first.json()["id"]) == 1
    batch = watch(api, first.json()["id"])
    assert batch.request_counts.total == 2  # two lines, each run once
    other = tenant.http.post("/v1/batches", json=body)  # no key: a batch of its own
    assert other.status_code == 200 and other.json()["id"] != batch.id
    too_long = tenant.http.post("/v1/batches", json=body, headers={"Idempotency-Key": "k" * 201})
    assert too_long.status_code == 400, too_long.text


def test_bad_requests_are_refused_in_openais_form_and_change_nothing(
    api: OpenAI, gateway: Gateway, tenant: Tenant
) -> None:
    good = upload(api, [line("one", "hello")])
    before = api.batches.list().data
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-0123456789abcdef0123456789abcdef"}, "input_file_id"),
        ({"metadata": {"k": float("nan")}}, None),
    ]
    for change, param in cases:
        body = {
            "input_file_id": good,
            "endpoint": "/v1/responses",
            "completion_window": "24h",
            **change,
        }
        answer = tenant.http.post("/v1/batches", content=_json(body), headers=_JSON)
        assert answer.status_code == 400, (change, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        if param is not None:
            assert error["param"] == param, error
    extra = tenant.http.post(
        "/v1/batches",
        json={
            "input_file_id": good,
            "endpoint": "/v1/responses",
            "completion_window": "24h",
            "x": 1,
        },
    )
    assert extra.status_code == 400 and extra.json()["error"]["code"] == "unknown_parameter"
    empty = upload(api, [])
    with pytest.raises(openai.BadRequestError):
        api.batches.create(input_file_id=empty, endpoint="/v1/responses", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as purpose:
        api.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="assistants")
    assert purpose.value.body["param"] == "purpose"  # type: ignore[index]
    json_upload = tenant.http.post("/v1/files", json={"file": "x", "purpose": "batch"})
    assert json_upload.status_code == 415, json_upload.text
    for missing in ("batch_0123456789abcdef0123456789abcdef", "nonsense"):
        assert tenant.http.get(f"/v1/batches/{missing}").status_code == 404
    assert api.batches.list().data == before
    unauthenticated = httpx.get(f"{gateway.url}/v1/batches")
    assert unauthenticated.status_code == 401
    assert "error" in unauthenticated.json()


_JSON = {"Content-Type": "application/json"}


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body, allow_nan=True)
