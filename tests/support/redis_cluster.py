"""A Redis Cluster of the test's own on loopback: three primaries, each with a replica,
started with ``redis-server --cluster-enabled yes`` in a temporary directory and joined
with ``redis-cli --cluster create``.  A test may kill a primary (its replica is promoted,
as in a failover in production), flush every node, and ask which node holds a key."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.cluster import RedisCluster

FAILOVER_NODE_TIMEOUT_MS = 1_000
"""How long a primary may be silent before its replica takes over, in a cluster whose
test kills one: short, so the failover takes a few seconds rather than the 15 of Redis's
default."""
NODE_TIMEOUT_MS = 5_000
"""The same for a cluster no test breaks: long enough that a busy machine's pauses
cause no failover of their own."""


CREATE = ("--cluster-replicas", "1", "--cluster-yes")
"""``redis-cli --cluster create``'s options: a replica for each primary, no questions."""


def _free_ports(count: int) -> list[int]:
    """``count`` free loopback ports whose cluster bus ports (each + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        with closing(socket.socket()) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10_000 > 65_535 or port in ports:
            continue
        with closing(socket.socket()) as bus:
            try:
                bus.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        ports.append(port)
    return ports


@dataclass
class RedisClusterNodes:
    """The processes of a running cluster, by port."""

    directory: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """``PARLEY_REDIS_URL`` for the cluster: one seed node is enough."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (the caller closes it)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def primaries(self) -> list[int]:
        """The ports of the primaries that serve slots, as the first live node that
        answers sees them."""
        for port in self.live():
            with closing(self.node(port)) as client:
                try:
                    nodes = client.execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]
                except redis.RedisError:
                    continue
            return sorted(
                int(address.rsplit(":", 1)[1])
                for address, node in nodes.items()
                if "master" in node["flags"] and "fail" not in node["flags"] and node["slots"]
            )
        return []

    def _synced(self) -> bool:
        """Whether every live replica has its primary's data (it can take over)."""
        for port in self.live():
            with closing(self.node(port)) as client:
                try:
                    info = client.info("replication")
                except redis.RedisError:
                    return False
            if info.get("role") == "slave" and (
                info.get("master_link_status") != "up" or info.get("master_sync_in_progress")
            ):
                return False
        return True

    def live(self) -> list[int]:
        """The ports of the nodes whose process runs."""
        return [p for p, process in self.processes.items() if process.poll() is None]

    def holder(self, key: str) -> int:
        """The port of the primary that holds ``key``'s slot now."""
        client = RedisCluster(host="127.0.0.1", port=self.live()[0])
        try:
            return int(client.get_node_from_key(key).port)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def keys_by_primary(self) -> dict[int, int]:
        """How many keys each live primary holds."""
        counts: dict[int, int] = {}
        for port in self.primaries():
            with closing(self.node(port)) as client:
                counts[port] = int(client.dbsize())
        return counts

    def flushall(self) -> None:
        """FLUSHALL every live primary (replicas follow)."""
        for port in self.primaries():
            with closing(self.node(port)) as client:
                client.flushall()

    def kill(self, port: int) -> None:
        """SIGKILL a node."""
        process = self.processes[port]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait_healthy(self, timeout: float = 30, *, primaries: int = 3) -> None:
        """Until every live node says the cluster is ok, with ``primaries`` primaries."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for port in self.live():
                with closing(self.node(port)) as client:
                    try:
                        info = client.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
                        states.append(info["cluster_state"] == "ok")
                    except redis.RedisError:
                        states.append(False)
            if states and all(states) and len(self.primaries()) == primaries and self._synced():
                return
            time.sleep(0.1)
        raise TimeoutError("the Redis Cluster did not become healthy")


@contextmanager
def redis_cluster(
    *, primaries: int = 3, node_timeout_ms: int = NODE_TIMEOUT_MS
) -> Iterator[RedisClusterNodes]:
    """A cluster of ``primaries`` primaries with a replica each (whose primary is
    declared failed after ``node_timeout_ms`` of silence), stopped and removed after."""
    server = shutil.which("redis-server")
    cli = shutil.which("redis-cli")
    assert server and cli, "redis-server and redis-cli are needed for a Redis Cluster"
    directory = Path(tempfile.mkdtemp(prefix="parley-redis-cluster-"))
    nodes = RedisClusterNodes(directory, [])
    try:
        for attempt in range(3):
            nodes.ports = _free_ports(2 * primaries)
            try:
                _start_nodes(nodes, server, node_timeout_ms)
                break
            except PortTaken:  # (between choosing the port and binding it)
                _stop_nodes(nodes)
                if attempt == 2:
                    raise
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in nodes.ports), *CREATE],
            check=True,
            capture_output=True,
            timeout=60,
        )
        nodes.wait_healthy(primaries=primaries)
        yield nodes
    finally:
        _stop_nodes(nodes)
        shutil.rmtree(directory, ignore_errors=True)


class PortTaken(RuntimeError):
    """A node could not bind its port: another process took it first."""


def _start_nodes(nodes: RedisClusterNodes, server: str, node_timeout_ms: int) -> None:
    """Start a node on each of ``nodes.ports`` and wait until each answers."""
    for port in nodes.ports:
        home = nodes.directory / str(port)
        home.mkdir(exist_ok=True)
        log = (home / "redis.log").open("wb")
        nodes.processes[port] = subprocess.Popen(
            [server, *_node_options(port, home, node_timeout_ms)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
    for port in nodes.ports:
        _wait_answers(nodes, port)


def _stop_nodes(nodes: RedisClusterNodes) -> None:
    for process in nodes.processes.values():
        if process.poll() is None:
            process.kill()
            process.wait(10)
    nodes.processes.clear()


def _node_options(port: int, home: Path, node_timeout_ms: int) -> list[str]:
    """``redis-server``'s options for the cluster node on ``port``, its files in ``home``."""
    options = {
        "port": str(port),
        "bind": "127.0.0.1",
        "cluster-enabled": "yes",
        "cluster-node-timeout": str(node_timeout_ms),
        "cluster-config-file": str(home / "nodes.conf"),
        "dir": str(home),
        "save": "",
        "appendonly": "no",
        # A replica syncs at once (not 5 s after it asked), and takes over however long
        # its primary was gone: a test kills one as soon as the cluster is up.
        "repl-diskless-sync-delay": "0",
        "cluster-replica-validity-factor": "0",
    }
    return [word for name, value in options.items() for word in (f"--{name}", value)]


def _wait_answers(nodes: RedisClusterNodes, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if nodes.processes[port].poll() is not None:
            log = (nodes.directory / str(port) / "redis.log").read_text(errors="replace")
            if "Address already in use" in log:
                raise PortTaken(f"port {port} (or {port + 10_000}) is taken")
            raise RuntimeError(f"redis-server on {port} exited:\n{log[-2000:]}")
        with closing(nodes.node(port)) as client:
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
    raise TimeoutError(f"redis-server on {port} did not start")
