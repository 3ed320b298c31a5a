"""The store's side of uploaded files (``POST /v1/files``, docs/batches.md): a file is
its row and its parts, a MiB each, written in one transaction and read a part at a time;
a batch's output and error files are rows whose bytes are queries over its lines."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from schemas.batches import FileKind, FileRecord
from schemas.errors import FileNotFound
from workers.store.rows import aware
from workers.store.statements import batches as bq
from workers.store.submissions import SubmissionStore


class FileStore(SubmissionStore):
    """Uploaded files (see the module docstring)."""

    def create_file(self, record: FileRecord, parts: Iterator[bytes]) -> FileRecord:
        """Store an upload whose bytes come as ``parts`` (each at most a MiB, read one at
        a time): the file, with its size, once every part is in."""
        size = 0
        with self._tx() as db:
            db.execute(bq.INSERT_FILE, file_row(record))
            for number, data in enumerate(parts):
                db.execute(
                    bq.INSERT_FILE_PART, {"file_id": record.file_id, "part": number, "data": data}
                )
                size += len(data)
            db.execute(bq.SET_FILE_BYTES, {"b_file_id": record.file_id, "b_bytes": size})
        return replace(record, bytes=size)

    def get_file(self, file_id: str) -> FileRecord:
        row = self._reading(lambda db: db.execute(bq.FILE, {"b_file_id": file_id}).one_or_none())
        if row is None:
            raise FileNotFound(f"no file {file_id!r}")
        return file_record(row)

    def file_part(self, file_id: str, part: int) -> bytes | None:
        """Part ``part`` (from 0) of an upload, None past its last."""
        data = self._reading(
            lambda db: db.execute(
                bq.FILE_PART, {"b_file_id": file_id, "b_part": part}
            ).scalar_one_or_none()
        )
        return None if data is None else bytes(data)

    def set_file_bytes(self, file_id: str, size: int) -> None:
        """Record the size of a batch's file, counted once its batch ended."""
        with self._tx() as db:
            db.execute(bq.SET_FILE_BYTES, {"b_file_id": file_id, "b_bytes": size})


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
