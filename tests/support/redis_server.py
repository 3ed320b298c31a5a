"""A `redis-server` of a test's own, on a loopback port nobody else uses: for tests that
stop the broker, or need one that speaks TLS.  (The machine's Redis is shared: never stop
it.)"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


class RedisServer:
    """A `redis-server` that a test may stop and start again (on the same port, empty).
    With ``tls``, it speaks only TLS, with a self-signed certificate made in ``directory`` and
    no client certificates asked for."""

    def __init__(self, directory: Path, *, tls: bool = False) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.log = directory / f"redis-server-{self.port}.log"
        self.tls = tls
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self._argv = [
            *("redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--daemonize", "no"),
        ]
        if tls:
            key, cert = directory / "redis-key.pem", directory / "redis-cert.pem"
            subprocess.run(
                [
                    *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"),
                    *("-keyout", str(key), "-out", str(cert), "-days", "1"),
                    *("-subj", "/CN=127.0.0.1"),
                ],
                check=True,
                capture_output=True,
            )
            self._argv += [
                *("--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"),
                *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
                *("--tls-ca-cert-file", str(cert)),
            ]
        else:
            self._argv += ["--port", str(self.port)]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers."""
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self._argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            client = self.client()
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert self.process.poll() is None, f"redis-server exited; see {self.log}"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
            finally:
                client.close()

    def shutdown(self) -> None:
        """What an operator's `redis-cli shutdown nosave` does: every key is gone."""
        assert self.process is not None
        self.client().shutdown(nosave=True)
        self.process.wait(10)
        self.process = None

    def client(self) -> redis.Redis:
        """A client of the server (the caller closes it); it does not check the
        certificate."""
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=self.tls, ssl_cert_reqs="none")

    def stop(self) -> None:
        """Stop the server if it runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


@contextmanager
def running_redis(directory: Path, *, tls: bool = False) -> Iterator[RedisServer]:
    """A :class:`RedisServer` in ``directory``, started, and stopped after the block."""
    server = RedisServer(directory, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()
