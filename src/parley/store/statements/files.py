"""Statements on files as their tenants see, bound and free them (docs/security.md#5-storage):
a live file (one its tenant has not deleted), a tenant's files a page at a time, the
bytes its uploads hold, a delete, and the uploads no batch was made from that
``parley prune`` removes.

(The rows a file is written as, and those a batch's files and their pruning share with
the batch, are in :mod:`~parley.store.statements.batches`; the file store reads these as
``fq.NAME``.)"""

from __future__ import annotations

from sqlalchemy import String, delete, func, select, tuple_, update

from parley.schemas import tables as t
from parley.schemas.batches import FileKind
from parley.store.statements.binds import b

_LIVE = t.files.c.deleted_at.is_(None)

LIVE_FILE = select(t.files).where(t.files.c.id == b("file_id"), _LIVE)

FILE_IS_LIVE = select(t.files.c.id).where(t.files.c.id == b("file_id"), _LIVE)

# A delete holds the row first: a batch being made from the file (whose insert locks it
# too, as its foreign key) commits before the delete looks, or after it.
LOCK_LIVE_FILE = (
    select(t.files.c.kind, t.files.c.batch_id)
    .where(t.files.c.id == b("file_id"), _LIVE)
    .with_for_update()
)

# A tenant's live files, of one purpose if ``purpose`` is not null; newest or oldest
# first, after the file (``created_at``, ``id``) a page ended with.
_OF_TENANT = select(t.files).where(
    t.files.c.tenant == b("tenant"),
    _LIVE,
    t.files.c.purpose == func.coalesce(b("purpose", type_=String), t.files.c.purpose),
)
_PLACE = tuple_(t.files.c.created_at, t.files.c.id)
_AFTER = tuple_(b("created_at", type_=t.files.c.created_at.type), b("id", type_=t.files.c.id.type))
FILES_NEWEST_FIRST = _OF_TENANT.order_by(t.files.c.created_at.desc(), t.files.c.id.desc()).limit(
    b("limit")
)
FILES_NEWEST_FIRST_AFTER = FILES_NEWEST_FIRST.where(_PLACE < _AFTER)
FILES_OLDEST_FIRST = _OF_TENANT.order_by(t.files.c.created_at, t.files.c.id).limit(b("limit"))
FILES_OLDEST_FIRST_AFTER = FILES_OLDEST_FIRST.where(_PLACE > _AFTER)

# What a tenant's quota counts: the bytes of its live uploads (a batch's own files are
# queries over its lines, and hold none).
STORED_BYTES = select(func.coalesce(func.sum(t.files.c.bytes), 0)).where(
    t.files.c.tenant == b("tenant"), t.files.c.kind == FileKind.UPLOAD.value, _LIVE
)

# PostgreSQL: one tenant's uploads commit one at a time past this, each counting the
# ones before it (a transaction's lock, released at its end; SQLite has one writer).
LOCK_TENANT_FILES = select(
    func.pg_advisory_xact_lock(
        func.hashtextextended(func.concat("parley.files:", b("tenant", type_=String)), 0)
    )
)

# A batch was made from the upload: a delete keeps its row (as it keeps a batch's own
# files', whose rows name their batch).
A_BATCH_MADE_FROM = select(t.batches.c.id).where(t.batches.c.input_file_id == b("file_id")).limit(1)

MARK_DELETED = (
    update(t.files).where(t.files.c.id == b("file_id"), _LIVE).values(deleted_at=b("now"))
)
DELETE_PARTS = delete(t.file_parts).where(t.file_parts.c.file_id == b("file_id"))
DELETE_FILE = delete(t.files).where(t.files.c.id == b("file_id"))

# Uploads made before the cut that no batch was made from (``parley prune``), and
# those of them still unused, locked, as a chunk is deleted.
UNUSED_UPLOADS_BEFORE = select(t.files.c.id).where(
    t.files.c.kind == FileKind.UPLOAD.value,
    t.files.c.created_at < b("cut"),
    ~select(t.batches.c.id).where(t.batches.c.input_file_id == t.files.c.id).exists(),
)
UNUSED_UPLOADS_AMONG = UNUSED_UPLOADS_BEFORE.where(
    t.files.c.id.in_(b("file_ids", expanding=True))
).with_for_update()
