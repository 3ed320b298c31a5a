"""The store's side of files as tenants see, bound and free them (src/parley/store/files.py),
on SQLite and PostgreSQL: a tenant's live files a page at a time, newest or oldest first,
of one purpose; a delete takes the bytes at once and the row unless a batch names it; a
reader caught mid-file by a delete is told, not handed half a file; a tenant's quota
holds even for uploads committing at once; prune removes old uploads no batch used."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from parley.schemas.batches import FileKind, FileRecord
from parley.schemas.errors import FileNotFound, StorageFull
from parley.store.clock import utc_now
from parley.store.sql_store import SqlStore
from tests.conftest import BACKENDS
from tests.integration.batch_plans import create_batch, new_batch
from tests.integration.drive import migrated_store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with migrated_store(url) as opened:
        yield opened


def an_upload(tenant: str, *, at: datetime | None = None, name: str = "in.jsonl") -> FileRecord:
    return FileRecord(
        file_id=f"file-{uuid.uuid4().hex}",
        tenant=tenant,
        purpose="batch",
        filename=name,
        kind=FileKind.UPLOAD,
        bytes=None,
        batch_id=None,
        created_at=at or utc_now(),
    )


def tenant_name() -> str:
    """A tenant no other test has (the PostgreSQL database is shared)."""
    return f"t-{uuid.uuid4().hex[:12]}"


def test_a_tenants_live_files_are_listed_a_page_at_a_time(store: SqlStore) -> None:
    tenant, other = tenant_name(), tenant_name()
    start = utc_now() - timedelta(hours=1)
    uploads = [
        store.create_file(an_upload(tenant, at=start + timedelta(seconds=n)), iter([b"x"]))
        for n in range(5)
    ]
    store.create_file(an_upload(other), iter([b"y"]))
    batch, _ = create_batch(
        store, replace(new_batch(tenant), input_file_id=uploads[0].file_id), [], []
    )
    ids = [u.file_id for u in uploads]

    newest = store.list_files(tenant, limit=3)  # the batch's two files, made last
    assert {f.file_id for f in newest[:2]} == {batch.output_file_id, batch.error_file_id}
    assert newest[2].file_id == ids[4]
    everything = store.list_files(tenant, limit=100)
    assert len(everything) == 7  # five uploads and the batch's two files
    page = store.list_files(tenant, limit=2, after=uploads[3], purpose="batch")
    assert [f.file_id for f in page] == [ids[2], ids[1]]
    oldest = store.list_files(tenant, limit=2, purpose="batch", newest_first=False)
    assert [f.file_id for f in oldest] == ids[:2]
    later = store.list_files(
        tenant, limit=10, after=uploads[1], purpose="batch", newest_first=False
    )
    assert [f.file_id for f in later] == ids[2:]
    outputs = store.list_files(tenant, limit=10, purpose="batch_output")
    assert {f.file_id for f in outputs} == {batch.output_file_id, batch.error_file_id}
    assert store.delete_file(ids[4])
    assert ids[4] not in {f.file_id for f in store.list_files(tenant, limit=100)}
    assert store.stored_bytes(tenant) == 4 and store.stored_bytes(other) == 1


def test_a_delete_takes_the_bytes_and_the_row_unless_a_batch_names_it(store: SqlStore) -> None:
    tenant = tenant_name()
    unused = store.create_file(an_upload(tenant), iter([b"a" * 10]))
    used = store.create_file(an_upload(tenant), iter([b"b" * 10, b"c" * 5]))
    batch, _ = create_batch(store, replace(new_batch(tenant), input_file_id=used.file_id), [], [])
    assert store.stored_bytes(tenant) == 25

    assert store.delete_file(unused.file_id) and store.delete_file(used.file_id)
    assert store.delete_file(batch.output_file_id)

    assert store.stored_bytes(tenant) == 0
    with store.engine.connect() as db:
        parts = db.execute(
            text("SELECT count(*) FROM file_parts WHERE file_id IN (:a, :b)"),
            {"a": unused.file_id, "b": used.file_id},
        ).scalar_one()
        rows = db.execute(
            text("SELECT id FROM files WHERE id IN (:a, :b)"),
            {"a": unused.file_id, "b": used.file_id},
        ).scalars()
        assert parts == 0 and list(rows) == [used.file_id]  # (kept for its batch)
    for gone in (unused.file_id, used.file_id, batch.output_file_id):
        with pytest.raises(FileNotFound):
            store.get_file(gone)
        assert not store.delete_file(gone)  # (once)
    # The batch still names its input, and its error file is still served.
    assert store.get_batch(batch.batch_id).input_file_id == used.file_id
    assert store.get_file(batch.error_file_id).kind is FileKind.BATCH_ERROR


def test_a_reader_caught_mid_file_by_a_delete_is_told(store: SqlStore) -> None:
    upload = store.create_file(an_upload(tenant_name()), iter([b"a", b"b", b"c"]))
    assert store.file_part(upload.file_id, 0) == b"a"
    assert store.file_part(upload.file_id, 3) is None  # past the last part: its end
    store.delete_file(upload.file_id)
    with pytest.raises(FileNotFound):
        store.file_part(upload.file_id, 1)


def test_a_tenants_quota_holds_for_uploads_committing_at_once(store: SqlStore) -> None:
    tenant, other = tenant_name(), tenant_name()
    store.create_file(an_upload(tenant), iter([b"x" * 40]), quota=100)
    with pytest.raises(StorageFull, match="PARLEY_TENANT_STORAGE"):
        store.create_file(an_upload(tenant), iter([b"x" * 61]), quota=100)
    assert store.stored_bytes(tenant) == 40  # the refused one stored nothing
    store.create_file(an_upload(other), iter([b"x" * 61]), quota=100)  # its own quota
    if store.engine.dialect.name == "sqlite":
        return  # (one writer: its uploads commit one at a time whatever they do)

    # Eight uploads of 20 bytes, each written before any commits, with room for three:
    # three are stored.
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def upload() -> None:
        def parts() -> Iterator[bytes]:
            start.wait(10)  # (every transaction has begun when the bytes come)
            yield b"y" * 20

        try:
            store.create_file(an_upload(tenant), parts(), quota=100)
        except StorageFull:
            outcomes.append("full")
        else:
            outcomes.append("stored")

    threads = [threading.Thread(target=upload) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["full"] * 5 + ["stored"] * 3
    assert store.stored_bytes(tenant) == 100


def test_prune_removes_the_old_uploads_no_batch_was_made_from(store: SqlStore) -> None:
    tenant = tenant_name()
    long_ago = utc_now() - timedelta(days=10)
    old_unused = store.create_file(an_upload(tenant, at=long_ago), iter([b"a"]))
    old_used = store.create_file(an_upload(tenant, at=long_ago), iter([b"b"]))
    fresh = store.create_file(an_upload(tenant), iter([b"c"]))
    create_batch(store, replace(new_batch(tenant), input_file_id=old_used.file_id), [], [])
    cut = utc_now() - timedelta(days=5)

    assert store.prune_uploads(cut, dry_run=True) == [old_unused.file_id]
    assert store.get_file(old_unused.file_id)  # (a dry run deletes nothing)
    assert store.prune_uploads(cut) == [old_unused.file_id]

    with pytest.raises(FileNotFound):
        store.get_file(old_unused.file_id)
    assert {f.file_id for f in store.list_files(tenant, limit=10, purpose="batch")} == {
        old_used.file_id,
        fresh.file_id,
    }
