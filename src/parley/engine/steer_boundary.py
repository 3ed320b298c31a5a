"""A step boundary: where an attempt makes sure it still holds its session, takes the
steers pending, and obeys an interrupt among them.

The turn's steer list (the coordinator's) is read first, as the boundary looks anyway;
it is trusted only while it holds every steer the store counted (one lost with Redis, a
push that failed or has not landed yet make it fall behind), and the store's inbox is
read otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from parley.engine.fenced_run import FencedStore
from parley.engine.holding import ensure_holding
from parley.engine.turn_state import TurnState, has_interrupt
from parley.ports.backend import Coordinator
from parley.schemas.records import Steer


class SteerBoundary:
    """The steers of one attempt's turn, as its boundaries take them."""

    def __init__(
        self,
        coordinator: Coordinator,
        store: FencedStore,
        turn_id: str,
        holding: Callable[[], bool],
    ) -> None:
        self._coordinator = coordinator
        self._store = store
        self._turn_id = turn_id
        self._holding = holding

    def interrupt_listed(self, cursor: int) -> bool:
        """Whether an accepted interrupt is listed past ``cursor``: a listed interrupt is
        one the store accepted (listed after its commit); past the cursor, it is not one
        the turn obeyed already."""
        return has_interrupt(self._coordinator.steers_after(self._turn_id, cursor))

    def interrupted(self, state: TurnState) -> bool:
        """A step boundary: the lock still ours (or :class:`Fenced`), the pending steers
        taken; whether an interrupt is among them."""
        ensure_holding(self._holding, "at a step boundary")
        self.take(state)
        return has_interrupt(state.pending)

    def take(self, state: TurnState) -> None:
        """Settle the steers pending at this boundary: the turn's steer list, read in the
        look the boundary makes anyway, unless it lacks steers the store counted (lost
        with Redis, a push that failed or has not landed yet); then the store's inbox."""
        # The first boundary looks afresh: the claim read the inbox before the turn was
        # prepared (hooks, tools), and a steer that arrived meanwhile must reach it.
        fresh, state.first_boundary = state.first_boundary, False
        listed = self._listed(state, fresh=fresh)
        if listed is None and not fresh:
            listed = self._listed(state, fresh=True)  # a look too old to trust
        if listed is not None:
            state.pending = listed
        elif len(state.pending) < state.steer_count - state.cursor:
            state.pending = list(self._store.pending_steers(state.cursor))
        state.steer_count = max(state.steer_count, state.cursor + len(state.pending))

    def _listed(self, state: TurnState, *, fresh: bool) -> list[Steer] | None:
        """The steers pending past the cursor as the steer list has them, or None when
        the list cannot be trusted: a position missing among them, or fewer than the
        store counted."""
        listed, state.listed = state.listed, None
        if listed is None or fresh:
            listed = self._coordinator.steers_after(self._turn_id, state.cursor, fresh=fresh)
        if listed:
            # Listed only once committed: the store has at least as many.
            state.steer_count = max(state.steer_count, listed[-1].position)
        in_order = all(s.position == state.cursor + n for n, s in enumerate(listed, 1))
        return listed if in_order and len(listed) >= state.steer_count - state.cursor else None
