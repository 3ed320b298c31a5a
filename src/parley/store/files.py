"""The store's side of uploaded files (``/v1/files``, docs/batches.md): a file is its row
and its parts, a MiB each, written in one transaction and read a part at a time; a
batch's output and error files are rows whose bytes are queries over its lines.

A tenant sees its live files (those it has not deleted) a page at a time, and frees
them (docs/security.md#5-storage): a deleted upload's parts go at once, and its row too
unless a batch names it, which keeps the row (and the batch its ``input_file_id``) but
serves it to no one.  Its uploads may hold at most its quota, checked as an upload
commits: on PostgreSQL a tenant's uploads commit one at a time, each counting those
before it, so two at once cannot both squeeze past it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

from parley.schemas.batches import FileKind, FileRecord
from parley.schemas.errors import FileNotFound, StorageFull
from parley.store.clock import utc_now
from parley.store.connection import StoreConnection, Transactions
from parley.store.rows import aware
from parley.store.statements import batches as bq
from parley.store.statements import files as fq

PRUNE_CHUNK = 500
"""Uploads deleted per transaction by a prune (and SQLite's bound on a statement's
values is far above it)."""


class FileStore:
    """Uploaded files (see the module docstring)."""

    def __init__(self, db: Transactions) -> None:
        self._db = db

    def create_file(
        self, record: FileRecord, parts: Iterator[bytes], *, quota: int | None = None
    ) -> FileRecord:
        """Store an upload whose bytes come as ``parts`` (each at most a MiB, read one at
        a time): the file, with its size, once every part is in.  With ``quota``,
        :class:`StorageFull` (and nothing stored) if the tenant's uploads would then hold
        more than ``quota`` bytes."""
        size = 0
        with self._db.tx() as db:
            db.execute(bq.INSERT_FILE, file_row(record))
            for number, data in enumerate(parts):
                db.execute(
                    bq.INSERT_FILE_PART, {"file_id": record.file_id, "part": number, "data": data}
                )
                size += len(data)
            db.execute(bq.SET_FILE_BYTES, {"b_file_id": record.file_id, "b_bytes": size})
            if quota is not None and record.tenant is not None:
                self._within_quota(db, record.tenant, size, quota)
        return replace(record, bytes=size)

    def _within_quota(self, db: StoreConnection, tenant: str, size: int, quota: int) -> None:
        """Raise :class:`StorageFull` if the tenant's uploads, this one's ``size`` bytes
        among them, hold more than ``quota`` (the transaction is then rolled back)."""
        if self._db.engine.dialect.name == "postgresql":
            db.execute(fq.LOCK_TENANT_FILES, {"b_tenant": tenant})
        # (After the lock, a statement of its own: it sees the uploads committed before.)
        held = int(db.execute(fq.STORED_BYTES, {"b_tenant": tenant}).scalar_one())
        if held > quota:
            raise StorageFull(
                f"this tenant's files hold {held - size} bytes: this upload of {size} bytes "
                f"would pass its quota of {quota} (PARLEY_TENANT_STORAGE); delete files "
                "(DELETE /v1/files/{id}) to make room"
            )

    def get_file(self, file_id: str) -> FileRecord:
        """A live file (:class:`FileNotFound` for one unknown or deleted)."""
        row = self._db.reading(
            lambda db: db.execute(fq.LIVE_FILE, {"b_file_id": file_id}).one_or_none()
        )
        if row is None:
            raise FileNotFound(f"no file {file_id!r}")
        return file_record(row)

    def file_part(self, file_id: str, part: int) -> bytes | None:
        """Part ``part`` (from 0) of an upload, None past its last;
        :class:`FileNotFound` once the file is deleted (a reader caught mid-file by a
        delete must not take what it read for the whole file)."""

        def read(db: StoreConnection) -> bytes | None:
            binds = {"b_file_id": file_id, "b_part": part}
            found = db.execute(bq.FILE_PART, binds).scalar_one_or_none()
            if found is not None:
                return bytes(found)
            if db.execute(fq.FILE_IS_LIVE, binds).one_or_none() is None:
                raise FileNotFound(f"no file {file_id!r}")
            return None

        return self._db.reading(read)

    def delete_upload(self, file_id: str) -> bool:
        """Delete an upload, with its parts, if no batch was made from it; whether it
        did."""
        with self._db.tx() as db:
            db.execute(bq.DELETE_UNUSED_UPLOAD_PARTS, {"b_file_id": file_id})
            return bool(db.execute(bq.DELETE_UNUSED_UPLOAD, {"b_file_id": file_id}).rowcount)

    def set_file_bytes(self, file_id: str, size: int) -> None:
        """Record the size of a batch's file, counted once its batch ended."""
        with self._db.tx() as db:
            db.execute(bq.SET_FILE_BYTES, {"b_file_id": file_id, "b_bytes": size})

    def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: FileRecord | None = None,
        purpose: str | None = None,
        newest_first: bool = True,
    ) -> list[FileRecord]:
        """A page of the tenant's live files (of one ``purpose``, if given), after the
        file ``after``."""
        if newest_first:
            statement = fq.FILES_NEWEST_FIRST if after is None else fq.FILES_NEWEST_FIRST_AFTER
        else:
            statement = fq.FILES_OLDEST_FIRST if after is None else fq.FILES_OLDEST_FIRST_AFTER
        binds: dict[str, Any] = {"b_tenant": tenant, "b_purpose": purpose, "b_limit": limit}
        if after is not None:
            binds.update(b_created_at=after.created_at, b_id=after.file_id)
        rows = self._db.reading(lambda db: db.execute(statement, binds).all())
        return [file_record(row) for row in rows]

    def stored_bytes(self, tenant: str) -> int:
        """The bytes the tenant's live uploads hold (what its quota counts)."""
        return int(
            self._db.reading(
                lambda db: db.execute(fq.STORED_BYTES, {"b_tenant": tenant}).scalar_one()
            )
        )

    def delete_file(self, file_id: str) -> bool:
        """Delete a live file: its parts, and its row unless a batch names it (then the
        row is marked deleted).  Whether it was live."""
        with self._db.tx() as db:
            binds = {"b_file_id": file_id}
            live = db.execute(fq.LOCK_LIVE_FILE, binds).one_or_none()
            if live is None:
                return False
            db.execute(fq.DELETE_PARTS, binds)
            named = live.batch_id is not None  # (a batch's own output or error file)
            if named or db.execute(fq.A_BATCH_MADE_FROM, binds).one_or_none() is not None:
                db.execute(fq.MARK_DELETED, {**binds, "b_now": utc_now()})
            else:
                db.execute(fq.DELETE_FILE, binds)
        return True

    def prune_uploads(self, made_before: datetime, *, dry_run: bool = False) -> list[str]:
        """Delete the uploads made before ``made_before`` that no batch was made from,
        with their parts, :data:`PRUNE_CHUNK` at a time; their ids (``dry_run``: only
        lists them)."""
        ids = list(
            self._db.reading(
                lambda db: db.execute(fq.UNUSED_UPLOADS_BEFORE, {"b_cut": made_before}).scalars()
            )
        )
        if dry_run:
            return ids
        for start in range(0, len(ids), PRUNE_CHUNK):
            chunk = {"b_file_ids": ids[start : start + PRUNE_CHUNK], "b_cut": made_before}
            with self._db.tx() as db:
                # (A batch made from one meanwhile keeps it: the look is made again.)
                unused = list(db.execute(fq.UNUSED_UPLOADS_AMONG, chunk).scalars())
                if unused:
                    db.execute(bq.DELETE_FILE_PARTS, {"b_file_ids": unused})
                    db.execute(bq.DELETE_FILES, {"b_file_ids": unused})
        return ids


def file_row(record: FileRecord) -> dict[str, Any]:
    """A ``files`` row of ``record``."""
    return {
        "id": record.file_id,
        "tenant": record.tenant,
        "purpose": record.purpose,
        "filename": record.filename,
        "kind": record.kind.value,
        "bytes": record.bytes,
        "batch_id": record.batch_id,
        "created_at": record.created_at,
    }


def file_record(row: Any) -> FileRecord:
    """A ``files`` row as a record."""
    return FileRecord(
        file_id=row.id,
        tenant=row.tenant,
        purpose=row.purpose,
        filename=row.filename,
        kind=FileKind(row.kind),
        bytes=row.bytes,
        batch_id=row.batch_id,
        created_at=aware(row.created_at),
    )
