"""Two flags on a session that let a turn skip reads most sessions never need.

``compacted``: a compaction was ever made on the session (docs/compaction.md).  A claim
reads which compaction applies to its turn; on a session that never had one there is
none, and the claim skips the read.  ``pushes``: an A2A push configuration was ever
set on one of its turns (docs/protocols.md).  A turn's end posts to its turn's
configurations; on a session that never had one there are none, and the end skips the
read.  Each is set under the session row's lock, in the transaction that stores the
compaction or the configuration, so a claim or an end (which update that row first)
either sees the flag or runs before what it stands for was stored.

The flags of existing sessions are set from what they already hold.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for name in ("compacted", "pushes"):
        op.add_column(
            "sessions", sa.Column(name, sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute(
        "UPDATE sessions SET compacted = TRUE WHERE id IN (SELECT session_id FROM compactions)"
    )
    op.execute(
        "UPDATE sessions SET pushes = TRUE WHERE id IN"
        " (SELECT turns.session_id FROM push_configs JOIN turns ON turns.id = push_configs.turn_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("pushes")
        batch.drop_column("compacted")
