"""The OpenAI Files and Batches routes against a hostile tenant (docs/security.md),
through a real ``parley gateway`` process with the official ``openai`` client, on every
deployment: a tenant lists and deletes its files (a batch made from a deleted upload
runs on), its uploads stop at its quota, ``parley prune`` removes old uploads no batch
used, another tenant's ids are unknown on every route, a method a route does not serve
is refused in OpenAI's form, and one tenant's heavy requests (batches being made) do not
delay another tenant's reads."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import openai
import psycopg
import pytest
from openai import OpenAI
from sqlalchemy import create_engine, text

from tests.support.deployments import ALL, on_deployments
from tests.support.gateway import Gateway, Tenant, gateway_fixtures, tenant_fixture
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

ECHO: dict[str, Any] = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
# How long another tenant's read may take while heavy work waits on a lock: it waits on
# nothing, so this is slack for a loaded machine; the lock is held longer.
READ_SECONDS = 10.0
LOCK_SECONDS = 20.0
# Each tenant's uploads may hold this much (PARLEY_TENANT_STORAGE).
QUOTA = 20_000


gateways, gateway = gateway_fixtures("file-gateways", {"PARLEY_TENANT_STORAGE": str(QUOTA)})


tenant = tenant_fixture([ECHO])


def client_of(gateway: Gateway, tenant: Tenant) -> OpenAI:
    return OpenAI(base_url=f"{gateway.url}/v1", api_key=tenant.token, max_retries=0, timeout=60)


@pytest.fixture
def api(gateway: Gateway, tenant: Tenant) -> Iterator[OpenAI]:
    with client_of(gateway, tenant) as client:
        yield client


def line(custom_id: str, prompt: str) -> str:
    body = {"input": prompt}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}
    )


def upload(api: OpenAI, lines: list[str], name: str = "lines.jsonl") -> str:
    data = ("\n".join(lines) + "\n").encode()
    return api.files.create(file=(name, io.BytesIO(data)), purpose="batch").id


def create_batch(api: OpenAI, file_id: str) -> Any:
    return api.batches.create(
        input_file_id=file_id, endpoint="/v1/responses", completion_window="24h"
    )


def ended(api: OpenAI, batch_id: str) -> Any:
    """The batch once it has ended."""
    deadline = time.monotonic() + 60
    while (batch := api.batches.retrieve(batch_id)).status in ("in_progress", "cancelling"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return batch


def sql(gateway: Gateway, statement: str, **values: Any) -> None:
    """Run ``statement`` on the gateway's database (what a test does to age rows)."""
    engine = create_engine(gateway.env["PARLEY_DATABASE_URL"])
    try:
        with engine.begin() as db:
            db.execute(text(statement), values)
    finally:
        engine.dispose()


def test_a_tenant_lists_and_deletes_its_files(api: OpenAI, gateway: Gateway) -> None:
    ids = [upload(api, [line(f"n{n}", "x")], name=f"f{n}.jsonl") for n in range(3)]

    listed = api.files.list()
    assert [f.id for f in listed.data] == ids[::-1]  # newest first
    assert listed.has_more is False and listed.data[0].filename == "f2.jsonl"
    first = api.files.list(limit=2)
    assert [f.id for f in first.data] == ids[:0:-1] and first.has_more is True
    assert [f.id for f in api.files.list(limit=2)] == ids[::-1]  # (the client pages on)
    assert [f.id for f in api.files.list(order="asc", after=ids[0]).data] == ids[1:]
    assert api.files.list(purpose="batch_output").data == []
    with pytest.raises(openai.BadRequestError) as unknown:
        api.files.list(after="file-0123456789abcdef0123456789abcdef")
    assert unknown.value.body["param"] == "after"  # type: ignore[index]

    deleted = api.files.delete(ids[1])
    assert (deleted.id, deleted.object, deleted.deleted) == (ids[1], "file", True)
    for gone in (
        lambda: api.files.retrieve(ids[1]),
        lambda: api.files.content(ids[1]),
        lambda: api.files.delete(ids[1]),
    ):
        with pytest.raises(openai.NotFoundError):
            gone()
    assert [f.id for f in api.files.list().data] == [ids[2], ids[0]]
    other = gateway.tenant()
    with client_of(gateway, other) as stranger:
        with pytest.raises(openai.NotFoundError):
            stranger.files.delete(ids[0])
        assert stranger.files.list().data == []
    assert api.files.retrieve(ids[0]).id == ids[0]


def test_a_batch_made_from_an_upload_runs_on_once_the_upload_is_deleted(api: OpenAI) -> None:
    file_id = upload(api, [line(f"n{n}", f"ticket {n}") for n in range(5)])
    batch = create_batch(api, file_id)
    api.files.delete(file_id)  # as OpenAI allows: the batch has its lines already

    done = ended(api, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 5
    assert done.input_file_id == file_id
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(file_id)
    with pytest.raises(openai.BadRequestError):
        create_batch(api, file_id)
    output = api.files.content(done.output_file_id).text.splitlines()
    assert len(output) == 5
    # A batch's own files are deleted as any: hidden from then on.
    api.files.delete(done.error_file_id)
    with pytest.raises(openai.NotFoundError):
        api.files.content(done.error_file_id)
    assert api.batches.retrieve(batch.id).error_file_id == done.error_file_id


def test_a_tenants_uploads_stop_at_its_quota(api: OpenAI, gateway: Gateway) -> None:
    big = upload(api, [line("big", "x" * 15_000)])
    before = [f.id for f in api.files.list().data]
    with pytest.raises(openai.APIStatusError) as full:
        upload(api, [line("more", "y" * 6_000)])
    assert full.value.status_code == 413
    error = full.value.body
    assert error["code"] == "storage_full", error  # type: ignore[index]
    assert "PARLEY_TENANT_STORAGE" in error["message"]  # type: ignore[index]
    assert [f.id for f in api.files.list().data] == before  # nothing was stored
    other = gateway.tenant()
    with client_of(gateway, other) as theirs:
        upload(theirs, [line("theirs", "z" * 15_000)])  # a quota of its own
    api.files.delete(big)  # room made
    upload(api, [line("more", "y" * 6_000)])


def test_prune_removes_old_uploads_no_batch_was_made_from(api: OpenAI, gateway: Gateway) -> None:
    unused = upload(api, [line("one", "unused")])
    used = upload(api, [line("one", "used")])
    batch = create_batch(api, used)
    ended(api, batch.id)
    fresh = upload(api, [line("one", "fresh")])
    long_ago = datetime.now(UTC) - timedelta(days=10)
    sql(
        gateway,
        "UPDATE files SET created_at = :then WHERE id IN (:unused, :used)",
        then=long_ago,
        unused=unused,
        used=used,
    )

    pruned = subprocess.run(
        [sys.executable, "-m", "parley", "prune", "--older-than", "5"],
        env=gateway.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 1 upload(s) no batch was made from" in pruned.stdout, pruned.stdout
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(unused)
    assert {api.files.retrieve(f).id for f in (used, fresh)} == {used, fresh}


def test_another_tenants_files_and_batches_are_unknown_on_every_route(
    api: OpenAI, gateway: Gateway, tenant: Tenant
) -> None:
    file_id = upload(api, [line("one", "hello")])
    batch = create_batch(api, file_id)
    done = ended(api, batch.id)
    stranger = gateway.tenant()

    def same_as_unknown(method: str, path: str, owned: str, unknown: str) -> None:
        """The stranger's answer about ``owned`` is the very one an unknown id gets."""
        expected = stranger.http.request(method, path.replace("{}", unknown))
        got = stranger.http.request(method, path.replace("{}", owned))
        assert expected.status_code in (400, 404), (path, expected.text)
        assert got.status_code == expected.status_code, (path, got.text)
        assert got.text == expected.text.replace(unknown, owned), (path, got.text)

    missing_file = "file-0123456789abcdef0123456789abcdef"
    missing_batch = "batch_0123456789abcdef0123456789abcdef"
    for owned in (file_id, done.output_file_id, done.error_file_id):
        for method, path in (
            ("GET", "/v1/files/{}"),
            ("GET", "/v1/files/{}/content"),
            ("DELETE", "/v1/files/{}"),
            ("GET", "/v1/files?after={}"),
        ):
            same_as_unknown(method, path, owned, missing_file)
    for method, path in (
        ("GET", "/v1/batches/{}"),
        ("POST", "/v1/batches/{}/cancel"),
        ("GET", "/v1/batches/{}/lines"),
        ("GET", "/v1/batches?after={}"),
    ):
        same_as_unknown(method, path, batch.id, missing_batch)
    assert api.files.retrieve(file_id).id == file_id  # (nothing was deleted)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PUT", "/v1/files/file-0123456789abcdef0123456789abcdef"),
        ("PATCH", "/v1/files"),
        ("DELETE", "/v1/batches/batch_0123456789abcdef0123456789abcdef"),
        ("DELETE", "/v1/responses/r"),
    ],
)
def test_a_method_an_openai_route_does_not_serve_is_405_in_openais_form(
    tenant: Tenant, method: str, path: str
) -> None:
    answer = tenant.http.request(method, path)
    assert answer.status_code == 405, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
    nowhere = tenant.http.get("/v1/files/x/y")
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "not_found"


@contextmanager
def batches_locked(gateway: Gateway) -> Iterator[psycopg.Connection[Any]]:
    """No batch can be written while the block runs, and every read goes on (a lock on
    PostgreSQL's batches table, held by the connection it yields)."""
    url = gateway.env["PARLEY_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as held:
        held.execute("LOCK TABLE batches IN SHARE ROW EXCLUSIVE MODE")
        yield held
        held.rollback()


def waiting_on(held: psycopg.Connection[Any], table: str) -> int:
    """How many transactions of the database wait for a lock on ``table``."""
    found = held.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        (table,),
    ).fetchone()
    assert found is not None
    return int(found[0])


# On SQLite every transaction, a read's too, takes the database's one lock: a write
# there delays every read, whatever thread it runs on (docs/limits.md).
@on_deployments("embedded-postgres", "fleet-postgres")
def test_one_tenants_heavy_requests_do_not_delay_another_tenants_reads(
    gateway: Gateway, tenant: Tenant, api: OpenAI
) -> None:
    # The case: six POST /v1/batches of one tenant made another tenant's
    # GET /v1/responses/{id} wait 36.5 s.  Here forty wait on a lock (more than any
    # machine's default thread pool has threads), and another tenant reads meanwhile.
    reader = gateway.tenant()
    reader.control.script([ECHO])
    body = {"input_file_id": upload(api, [line("one", "heavy")])}
    body |= {"endpoint": "/v1/responses", "completion_window": "24h"}
    created: list[int] = []

    def create() -> None:
        created.append(tenant.http.post("/v1/batches", json=body, timeout=120).status_code)

    creators = [threading.Thread(target=create) for _ in range(40)]
    with client_of(gateway, reader) as theirs:
        response = theirs.responses.create(model="m", input="hello")
        read: list[Any] = []
        with batches_locked(gateway) as held:
            for creator in creators:
                creator.start()
            # (They reach the gateway, and as many as may run wait on the lock.)
            wait_until(lambda: waiting_on(held, "batches") >= 2, what="creations held")
            time.sleep(0.5)
            started = time.monotonic()
            reading = threading.Thread(
                target=lambda: read.append(theirs.responses.retrieve(response.id))
            )
            reading.start()
            reading.join(LOCK_SECONDS)  # (the lock is held until the read is answered)
            took = time.monotonic() - started
        assert read, "the read waited for another tenant's heavy requests"
        assert read[0].output_text == "heard: hello"
        assert took < READ_SECONDS, took
    for creator in creators:
        creator.join(120)
    assert created == [200] * 40  # each made its batch once the lock was gone


def test_a_page_of_a_batchs_lines_has_more_only_when_more_remain(
    api: OpenAI, tenant: Tenant
) -> None:
    batch = create_batch(api, upload(api, [line(f"n{n}", "x") for n in range(4)]))
    lines = f"/v1/batches/{batch.id}/lines"

    first = tenant.http.get(lines, params={"limit": 2}).json()
    last = tenant.http.get(lines, params={"limit": 2, "after": 2}).json()  # exactly two left

    assert [row["line"] for row in first["data"]] == [1, 2] and first["has_more"] is True
    assert [row["line"] for row in last["data"]] == [3, 4] and last["has_more"] is False
    for after in (2**31, 2**63, -1):  # (2**31 was a 5xx on PostgreSQL)
        refused = tenant.http.get(lines, params={"after": after})
        assert refused.status_code == 400, (after, refused.text)
        assert refused.json()["error"]["param"] == "after"


def test_an_idempotency_key_names_one_batch(api: OpenAI, tenant: Tenant) -> None:
    first, second = upload(api, [line("one", "first")]), upload(api, [line("one", "second")])
    body: dict[str, Any] = {"endpoint": "/v1/responses", "completion_window": "24h"}
    key = {"Idempotency-Key": f"key-{time.monotonic_ns()}"}
    made = tenant.http.post("/v1/batches", json={**body, "input_file_id": first}, headers=key)
    again = tenant.http.post("/v1/batches", json={**body, "input_file_id": first}, headers=key)
    assert made.status_code == again.status_code == 200, (made.text, again.text)
    assert again.json()["id"] == made.json()["id"]

    for other in (
        {**body, "input_file_id": second},  # (it answered the first batch, silently)
        {**body, "input_file_id": first, "metadata": {"run": "2"}},
    ):
        refused = tenant.http.post("/v1/batches", json=other, headers=key)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "idempotency_key_reused", error
        assert made.json()["id"] in error["message"]
    assert [b.id for b in api.batches.list().data] == [made.json()["id"]]


def test_a_malformed_upload_is_told_what_is_wrong_with_it(api: OpenAI, tenant: Tenant) -> None:
    answer = tenant.http.post(
        "/v1/files",
        content=b"this is no form",
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "multipart/form-data" in error["message"] and "JSON" not in error["message"], error
    assert api.files.list().data == []


def test_an_ended_batchs_file_is_described_without_being_read(api: OpenAI) -> None:
    # Its size is what a whole read counts: the first GET of a large ended batch's file
    # rendered every line of it (11.7 s) to say how many bytes they make.
    batch = create_batch(api, upload(api, [line(f"n{n}", "x") for n in range(3)]))
    done = ended(api, batch.id)

    described = api.files.retrieve(done.output_file_id)
    assert described.bytes is None and described.purpose == "batch_output"  # not yet known
    content = api.files.content(done.output_file_id).content
    assert len(content.splitlines()) == 3
    assert api.files.retrieve(done.output_file_id).bytes == len(content)  # counted as read
    listed = {f.id: f.bytes for f in api.files.list(purpose="batch_output").data}
    assert listed == {done.output_file_id: len(content), done.error_file_id: None}
