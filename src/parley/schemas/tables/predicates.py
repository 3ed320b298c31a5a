"""The partial indexes' predicates: which rows each index holds.

Spelt out as SQL text, not bound, so that a query with the same text can use the index;
the statements that read through an index say the same predicate (``t.ACTIVE_RUN``...).
"""

from __future__ import annotations

# A run that still needs a driver.  The sweeper asks which sessions have one every few
# seconds: a partial index on this answers from the work in flight, not the history.
# A run a driver has to take up now: running, or queued with no time still ahead of it
# (a delayed turn's, or the provider capacity a deferred one waits for, keep a run out
# until the sweeper releases it: DUE_RUN).
ACTIVE_RUN = "status IN ('queued', 'running') AND not_before IS NULL"
# A queued run waiting for its time: the sweeper reads ix_runs_due for those whose time
# has come, so what waits for later costs it nothing (docs/time.md#delayed-turns).
DUE_RUN = "status = 'queued' AND not_before IS NOT NULL"
# A run waiting for an event with a deadline (docs/time.md#waiting-for-an-event): the
# release reads ix_runs_wait_due for those whose deadline has come, as it reads
# ix_runs_due, so a wait for tomorrow costs today's sweeps nothing.
WAIT_DUE_RUN = "status = 'waiting' AND not_before IS NOT NULL"
# A run waiting for an event, deadline or not: the sweeper counts them per tenant for the
# metrics every sweep, from ix_runs_waiting_event, not among every run.
EVENT_RUN = "status = 'waiting' AND waiting_for = 'event'"
# A queued run waiting for provider capacity: the sweeper counts them for the metrics
# every sweep, from ix_runs_capacity, not among every run waiting for a time.
CAPACITY_RUN = "status = 'queued' AND not_before IS NOT NULL AND waiting_for = 'capacity'"
# A run waiting for agents (docs/sub-agents.md): a parent whose step waits for its child
# turns (it holds the step), or a child waiting for a place among its step's siblings.
# The sweeper counts both for the metrics every sweep, from ix_runs_agents.
AGENT_WAIT_RUN = "status = 'waiting' AND waiting_for = 'agents'"
# A webhook delivery still to make (neither delivered nor given up): the deliverer's due
# rows are among these, and a session with one is not pruned.
UNSETTLED_DELIVERY = "delivered_at IS NULL AND given_up_at IS NULL"
# A conversation: a session no batch line opened (a batch's sessions are listed under
# their batch).  The page's list of a tenant's conversations reads a partial index of
# these, so a batch of a hundred thousand lines neither slows that list nor adds to what
# its acceptance writes.
CONVERSATION = "batch_id IS NULL"
# A batch line's run that has ended: a batch's results are read in the order of these
# ends, a page at a time from the last one read (parley.batches.Batch.results).
ENDED_BATCH_RUN = "priority = 'batch' AND ended_at IS NOT NULL"
# A batch run still waiting for its place in the batch window
# (src/parley/runtime/batch_window.py), which gives places to each tenant's oldest of these
# in turn, by weight; no driver claims it until then.
UNPLACED_BATCH_RUN = "status = 'queued' AND priority = 'batch' AND placed_at IS NULL"
# A batch run holding a place in the window: placed, and neither ended nor waiting for
# answers (it gives its place back meanwhile).
PLACED_BATCH_RUN = (
    "priority = 'batch' AND placed_at IS NOT NULL AND status IN ('queued', 'running')"
)
# An interactive run queued or running: the sweeper counts each tenant's share of the
# workers from these (docs/admission.md#interactive-share).
INTERACTIVE_RUN = "priority = 'interactive' AND status IN ('queued', 'running')"
