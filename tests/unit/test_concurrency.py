"""How many turns a fleet process drives at once, and the connection pools sized for
them (``parley.runtime.concurrency``)."""

from __future__ import annotations

import pytest

from parley.runtime.concurrency import (
    COORDINATOR_THREADS,
    DATABASE_POOL_SIZE,
    ConnectionBudget,
    drivers_per_process,
)


@pytest.mark.parametrize(
    ("pool", "concurrency", "drivers"),
    [
        ("threads", 1000, 1000),  # every kick on a thread of the one process
        ("threads", 1, 1),
        ("gevent", 500, 500),
        ("prefork", 8, 1),  # eight processes, one kick each
        ("solo", 4, 1),  # solo runs one kick at a time, whatever its concurrency says
    ],
)
def test_drivers_per_process(pool: str, concurrency: int, drivers: int) -> None:
    assert drivers_per_process(pool, concurrency) == drivers


def test_redis_pools_hold_a_connection_for_every_driver_and_the_coordinators_threads() -> None:
    budget = ConnectionBudget.for_drivers(1000)
    assert budget.drivers == 1000
    assert budget.redis > 1000 + COORDINATOR_THREADS  # no driver ever waits for one


def test_the_database_pool_is_far_smaller_than_the_drivers_and_set_by_the_operator() -> None:
    many = ConnectionBudget.for_drivers(1000)
    assert (many.database, many.database_overflow) == (DATABASE_POOL_SIZE, DATABASE_POOL_SIZE)
    one = ConnectionBudget.for_drivers(1)  # a prefork child: one kept, a burst allowed
    assert (one.database, one.database_overflow) == (1, DATABASE_POOL_SIZE)
    sized = ConnectionBudget.for_drivers(1000, database_pool_size=40)
    assert (sized.database, sized.database_overflow) == (40, 40)
