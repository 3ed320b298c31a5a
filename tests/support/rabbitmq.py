"""RabbitMQ for the fleet tests: the machine's server with a virtual host of the test run's
own, or a server of a test's own on a free port, to restart under a fleet.

The machine's RabbitMQ is named by ``PARLEY_TEST_AMQP_URL`` (default guest on
127.0.0.1:5672).  Where ``rabbitmqctl`` can reach it (this machine, CI), a test run makes a
virtual host of its own and deletes it after, with every queue in it; elsewhere the run
uses the URL's virtual host as it is, and each fleet deletes the queue it made (its name
is the fleet's own).  A test that needs RabbitMQ fails, never skips, when it is down."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import kombu

from parley.fleet.app import kick_exchange

AMQP_TEST_URL = os.environ.get("PARLEY_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


def with_vhost(url: str, vhost: str) -> str:
    """``url`` with its virtual host replaced by ``vhost``."""
    parts = urlsplit(url)
    return parts._replace(path="/" + quote(vhost, safe="")).geturl()


@contextmanager
def run_vhost(url: str = AMQP_TEST_URL) -> Iterator[str]:
    """``url`` on a virtual host made for this run (when ``rabbitmqctl`` can), deleted
    with everything in it afterwards; else ``url`` itself."""
    ctl = shutil.which("rabbitmqctl")
    user = unquote(urlsplit(url).username or "guest")
    vhost = f"parley-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if ctl is None or _ctl(ctl, "add_vhost", vhost).returncode != 0:
        yield url
        return
    try:
        _ctl(ctl, "set_permissions", "-p", vhost, user, ".*", ".*", ".*", check=True)
        yield with_vhost(url, vhost)
    finally:
        _ctl(ctl, "delete_vhost", vhost)


def _ctl(ctl: str, *argv: str, check: bool = False) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([ctl, "-q", *argv], capture_output=True, timeout=60, check=check)


def connect(url: str, timeout: float = 5) -> Any:
    """A kombu connection to the broker ``url`` (the caller closes it)."""
    return kombu.Connection(url, connect_timeout=timeout)  # type: ignore[attr-defined,no-untyped-call]


def consumers(url: str, queue: str) -> int:
    """How many consumers the queue has (0 if it does not exist yet)."""
    with connect(url) as connection:
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).consumer_count)
        except connection.channel_errors:
            return 0  # not declared yet: RabbitMQ closed the channel saying so
        finally:
            channel.close()


def ready(url: str, queue: str) -> int:
    """How many messages wait on the queue, taken by no consumer."""
    with connect(url) as connection:
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue, passive=True).message_count)
        finally:
            channel.close()


def queue_type(url: str, queue: str) -> str:
    """The type of the queue on the broker: ``quorum`` if RabbitMQ takes a declaration of
    it as a durable quorum queue, else ``classic`` (it refuses one of another type with
    PRECONDITION_FAILED).  Asked over AMQP, so of any server (``rabbitmqctl`` reaches
    only the machine's node, not a test's own)."""
    with connect(url) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, passive=True)  # (none: a channel error)
        try:
            quorum = {"x-queue-type": "quorum"}
            channel.queue_declare(queue, durable=True, auto_delete=False, arguments=quorum)
        except connection.channel_errors:
            return "classic"
        channel.close()
        return "quorum"


def delete_queue(url: str, queue: str) -> None:
    """Delete a fleet's queue and the exchanges kombu made for it: a classic queue's
    direct one, a quorum queue's topic one (nothing if the broker cannot be reached: a
    test that stopped it made them go anyway)."""
    try:
        with connect(url) as connection:
            channel = connection.channel()
            channel.queue_delete(queue)
            channel.exchange_delete(queue)
            channel.exchange_delete(kick_exchange(queue))
            channel.close()
    except Exception:  # (whatever the broker's state: cleaning up must not fail a test)
        pass


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class RabbitServer:
    """A RabbitMQ node of a test's own, on free loopback ports, that the test may stop
    and start again: its definitions and persistent messages on durable queues survive
    the restart, as on a real server.  (The machine's RabbitMQ is shared: never stop
    it.)"""

    def __init__(self, directory: Path) -> None:
        self.port = _free_port()
        self.directory = directory / f"rabbitmq-{self.port}"
        self.directory.mkdir(parents=True)
        self.log = self.directory / "server.log"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        (self.directory / "rabbitmq.conf").write_text(f"listeners.tcp.1 = 127.0.0.1:{self.port}\n")
        (self.directory / "enabled_plugins").write_text("[].\n")
        self._env = {
            **os.environ,
            # Every path of its own: the machine's node keeps its config, data and ports.
            "RABBITMQ_NODENAME": f"parley-test-{self.port}@localhost",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(_free_port()),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_PID_FILE": str(self.directory / "pid"),
        }
        # The server script itself: Debian's wrapper in /usr/sbin would run it as the
        # rabbitmq user, who cannot write the test's directory.
        found = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
        command = str(found) if found.exists() else shutil.which("rabbitmq-server")
        assert command, "rabbitmq-server is not installed"
        self._command: str = command
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        """Start the node and wait until it accepts a connection."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self._command],
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"rabbitmq-server exited; see {self.log}"
            try:
                with connect(self.url, 2) as connection:
                    connection.ensure_connection(max_retries=1)
                return
            except Exception:
                assert time.monotonic() < deadline, f"rabbitmq-server did not start; {self.log}"
                time.sleep(0.2)

    def shutdown(self) -> None:
        """What an operator's ``systemctl stop rabbitmq-server`` does: the node stops,
        closing every connection; durable queues and persistent messages stay on disk."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(60)
        self.process = None

    def stop(self) -> None:
        """Stop the node if it runs."""
        if self.process is not None and self.process.poll() is None:
            self.shutdown()
        self.process = None
