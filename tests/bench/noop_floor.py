"""The fleet benchmark's floor: bare Celery workers running no-op tasks
(:mod:`tests.bench.noop_app`), and a producer that measures their round trip and rate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import redis

from parley.fleet.app import is_amqp
from tests.support.fleet import REPO
from tests.support.rabbitmq import delete_queue


class NoopFloor:
    """``workers`` Celery workers (two single-process ones by default) running the floor's
    tasks on the Redis ``redis_url`` (or on ``broker_url``, RabbitMQ say, signalling on
    that Redis), and a producer for them.  ``channel``: "stock" for kombu's Redis channel
    (the floor), "parley" for parley's."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        channel: str,
        *,
        workers: int = 2,
        pool: str = "prefork",
        concurrency: int = 1,
        broker_url: str | None = None,
    ) -> None:
        self.queue = f"bench.noop.{uuid.uuid4().hex[:6]}"
        self.broker_url = broker_url or redis_url
        env = {
            **os.environ,
            "PARLEY_DATABASE_URL": database_url,
            "PARLEY_REDIS_URL": redis_url,
            "PARLEY_BROKER_URL": broker_url or redis_url,
            "PARLEY_QUEUE": self.queue,
            "PARLEY_BENCH_CHANNEL": channel,
            "PYTHONPATH": str(REPO),
        }
        self.workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "tests.bench.noop_app",
                    "worker",
                    "--queues",
                    self.queue,
                    "--pool",
                    pool,
                    "--concurrency",
                    str(concurrency),
                    "--loglevel",
                    "WARNING",
                    "--hostname",
                    f"noop{n}@%h",
                ],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for n in range(workers)
        ]
        from parley.fleet.app import create_app
        from parley.fleet.settings import FleetSettings

        self.app = create_app(FleetSettings.from_env(env), stock_kombu=channel == "stock")
        # (Its reads block for up to minutes: redis-py 8 would time them out after 5 s.)
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=None)
        self.key = f"bench:{uuid.uuid4().hex}"
        self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        assert self.redis.blpop([self.key], timeout=60), "noop workers did not start"

    def round_trip(self) -> float:
        """Seconds from sending a noop task until it ran."""
        start = time.perf_counter()
        self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        self.redis.blpop([self.key], timeout=10)
        return time.perf_counter() - start

    def rate(self, count: int) -> float:
        """Tasks/s for ``count`` tasks sent at once."""
        start = time.perf_counter()
        for _ in range(count):
            self.app.send_task("bench.noop", args=[self.key], queue=self.queue)
        for _ in range(count):
            self.redis.blpop([self.key], timeout=30)
        return count / (time.perf_counter() - start)

    def close(self) -> None:
        """Stop the workers (once)."""
        if not self.workers:
            return
        self.redis.close()
        self.app.close()
        for worker in self.workers:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(20)
        self.workers = []
        if is_amqp(self.broker_url):  # (RabbitMQ keeps a durable queue)
            delete_queue(self.broker_url, self.queue)

    def __enter__(self) -> NoopFloor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
