"""A real ``parley gateway`` process for tests, and its tenants.

:func:`start_gateway` runs ``python -m parley gateway --bind 127.0.0.1:0`` with the
environment of the deployment under test, reads the URL it prints, and hands back a
:class:`Gateway`.  The gateway is given many tenants (a token file, ``@path``): each
test takes fresh ones with :meth:`Gateway.tenant`, so its scripted model's rules
(``<workspaces>/<tenant>/.parley-test``, written through :class:`tests.support.helpers.Control`)
and its sessions are its own, while one gateway process serves a whole module.
:func:`start_fleet_gateway` starts one on a test fleet, with one tenant, stopped with the
fleet.  What is measured of a gateway from outside is :mod:`tests.support.probes`'; its
event streams are read with :mod:`tests.support.sse`.
"""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fleet import REPO, Fleet
from tests.support.helpers import Control
from tests.support.probes import ProcessProbes
from tests.support.processes import stop_group
from tests.support.sse import SseMessage, sse_messages

URL_LINE = "parley gateway: open "
TOKEN = "gateway-test-token-0123456789"
TENANT = "alpha"
"""A fleet gateway's one tenant (:func:`start_fleet_gateway`), and its token."""
START_TIMEOUT_SECONDS = 60
HTTP_TIMEOUT_SECONDS = 60


@dataclass
class Stream:
    """An open event stream: its response and its messages as they arrive."""

    response: httpx.Response
    messages: Iterator[SseMessage]

    def events(self) -> Iterator[SseMessage]:
        """The events only (no comments)."""
        return (m for m in self.messages if m.comment is None)


@dataclass
class Tenant:
    """One tenant of a running gateway: its token, an HTTP client that sends it, and the
    control files of its workspaces' scripted model."""

    name: str
    token: str
    http: httpx.Client
    control: Control
    workspaces: Path

    def json(self, method: str, path: str, body: Any = None, **options: Any) -> httpx.Response:
        """A request with a JSON body (if given)."""
        if body is not None:
            options["json"] = body
        return self.http.request(method, path, **options)

    def new_session(self, **body: Any) -> dict[str, Any]:
        """A fresh session (201)."""
        response = self.http.post("/v1/sessions", json=body)
        assert response.status_code == 201, response.text
        session: dict[str, Any] = response.json()
        return session

    def submit(self, session_id: str, prompt: str, **body: Any) -> dict[str, Any]:
        """A new turn (202)."""
        response = self.http.post(
            f"/v1/sessions/{session_id}/turns", json={"prompt": prompt, **body}
        )
        assert response.status_code == 202, response.text
        turn: dict[str, Any] = response.json()
        return turn

    def result(self, turn_id: str, wait: float = 30) -> dict[str, Any]:
        """The ended turn (200 within ``wait`` seconds)."""
        response = self.http.get(
            f"/v1/turns/{turn_id}/result",
            params={"wait": wait},
            timeout=max(HTTP_TIMEOUT_SECONDS, wait + 10),
        )
        assert response.status_code == 200, response.text
        turn: dict[str, Any] = response.json()
        return turn

    @contextmanager
    def stream(
        self, turn_id: str, *, after: int | None = None, headers: Mapping[str, str] | None = None
    ) -> Iterator[Stream]:
        """The turn's event stream, open for the ``with`` block."""
        params = {} if after is None else {"after": after}
        with self.http.stream(
            "GET", f"/v1/turns/{turn_id}/events", params=params, headers=headers
        ) as response:
            yield Stream(response, sse_messages(response.iter_lines()))

    def events(
        self, turn_id: str, *, after: int | None = None, headers: Mapping[str, str] | None = None
    ) -> list[SseMessage]:
        """Every event of the stream, read until the gateway closes it (comments left out)."""
        with self.stream(turn_id, after=after, headers=headers) as stream:
            assert stream.response.status_code == 200, stream.response.read()
            return list(stream.events())

    def event_json(self, turn_id: str, after: int | None = None) -> list[dict[str, Any]]:
        """The stream's events as Event JSON."""
        return [m.json() for m in self.events(turn_id, after=after)]


@dataclass
class Gateway(ProcessProbes):
    """A running ``parley gateway`` process."""

    url: str
    """``http://127.0.0.1:PORT``, as the process printed it."""
    printed: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    workspaces: Path
    tokens: dict[str, str]  # tenant → token
    env: dict[str, str] = field(default_factory=dict)
    """The environment it was started with (its database: ``PARLEY_DATABASE_URL``)."""
    _unused: Iterator[str] = field(default_factory=lambda: iter(()))
    _clients: list[httpx.Client] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> Path:
        """Where the process writes its log lines (stderr)."""
        return self.stderr

    @property
    def token(self) -> str:
        """The first tenant's token (a fleet gateway's one tenant, :data:`TENANT`)."""
        return next(iter(self.tokens.values()))

    @property
    def headers(self) -> dict[str, str]:
        """What a request as the first tenant sends."""
        return {"Authorization": f"Bearer {self.token}"}

    def tenant(self, name: str | None = None) -> Tenant:
        """A tenant no test has used yet (or the one named)."""
        name = name or next(self._unused)
        token = self.tokens[name]
        http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=HTTP_TIMEOUT_SECONDS,
        )
        self._clients.append(http)
        return Tenant(
            name=name,
            token=token,
            http=http,
            control=Control(self.workspaces / name / "workspace"),
            workspaces=self.workspaces / name,
        )

    def anonymous(self) -> httpx.Client:
        """A client that sends no token."""
        http = httpx.Client(base_url=self.url, timeout=HTTP_TIMEOUT_SECONDS)
        self._clients.append(http)
        return http

    def logs(self) -> str:
        """Everything the process has written to stdout and stderr so far."""
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")

    def stop(self) -> int:
        """Stop the process (SIGTERM, then SIGKILL); its exit status."""
        for http in self._clients:
            http.close()
        stop_group(self.process)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, no goodbye to any connection."""
        os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)


def deployment_env(backend: str, request: pytest.FixtureRequest, sqlite_url: str) -> dict[str, str]:
    """What ``parley gateway`` needs to serve the deployment ``backend`` (the
    acceptance suite's names): embedded on a database with the suite's host, or a fleet
    producer with the fleet fixture's environment (whose workers hold the host)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    if backend.startswith("fleet"):
        pool: Fleet = request.getfixturevalue("fleet")
        env = pool.env()
        env.pop("PARLEY_HOST")
        return {**base, **{k: v for k, v in env.items() if k.startswith("PARLEY_")}}
    url = sqlite_url if backend == "embedded-sqlite" else request.getfixturevalue("postgres_url")
    return {
        **base,
        "PARLEY_DATABASE_URL": url,
        "PARLEY_HOST": "tests.support.hosts:workspace_host",
        "PYTHONPATH": str(REPO),
    }


def make_tokens(names: list[str]) -> dict[str, str]:
    """A fresh token for each tenant."""
    return {name: f"tok-{name}-{secrets.token_hex(8)}" for name in names}


def start_gateway(
    env: Mapping[str, str],
    directory: Path,
    *,
    tokens: Mapping[str, str] | None = None,
    tokens_in_file: bool = True,
    extra: Mapping[str, str] | None = None,
    ready: bool = True,
    arguments: Sequence[str] = (),
) -> Gateway:
    """Start ``parley gateway --bind 127.0.0.1:0 [ARGUMENTS]`` in ``directory`` (its logs
    and workspaces go there) and wait for the URL it prints (and, if ``ready``, for
    ``/readyz`` to answer 200).  ``tokens`` (tenant → token) are given as a token file
    (``@path``) or inline; none means the gateway serves its local token."""
    directory.mkdir(parents=True, exist_ok=True)
    full = {**env, "PARLEY_WORKSPACES": str(directory / "workspaces"), **(extra or {})}
    if tokens:
        full["PARLEY_GATEWAY_TOKENS"] = token_setting(tokens, directory, in_file=tokens_in_file)
    stdout, stderr = directory / "gateway.out", directory / "gateway.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "parley", "gateway", "--bind", "127.0.0.1:0", *arguments],
            env=full,
            cwd=directory,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    printed_url = printed_url_of(process, stdout, stderr)
    gateway = Gateway(
        url=printed_url.split("?", 1)[0].rstrip("/"),
        printed=printed_url,
        process=process,
        stdout=stdout,
        stderr=stderr,
        workspaces=Path(full["PARLEY_WORKSPACES"]),
        tokens=dict(tokens or {}),
        env=full,
        _unused=iter(list(tokens or {})),
    )
    if ready:
        wait_ready(gateway)
    return gateway


def token_setting(tokens: Mapping[str, str], directory: Path, *, in_file: bool) -> str:
    """``PARLEY_GATEWAY_TOKENS`` for ``tokens``: a token file in ``directory``
    (``@path``), or the pairs inline."""
    pairs = [f"{token}={tenant}" for tenant, token in tokens.items()]
    if not in_file:
        return ",".join(pairs)
    path = directory / "tokens.txt"
    path.write_text("# tenants of this test gateway\n" + "\n".join(pairs) + "\n")
    return f"@{path}"


def printed_url_of(process: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> str:
    """The URL the gateway prints once it listens (the process is killed, and the test
    fails, if it exits or takes too long first)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        printed = stdout.read_text()
        line = next((x for x in printed.splitlines() if x.startswith(URL_LINE)), None)
        if line is not None:
            return line.removeprefix(URL_LINE).strip()
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
            raise RuntimeError(
                f"the gateway did not start (exit {process.returncode}):\n"
                f"{printed}{stderr.read_text()}"
            )
        time.sleep(0.05)


def start_fleet_gateway(
    fleet: Fleet, workspaces: Path, *, checkout: Path = REPO, **extra_env: str
) -> Gateway:
    """A gateway on ``fleet``'s database, Redis and queue (no host: on a fleet the
    workers hold it), serving :data:`TENANT` with :data:`TOKEN` and making sessions'
    roots under ``workspaces/alpha``; from ``checkout``'s code (a benchmark compares
    two).  Stopped with the fleet."""
    env = fleet.env()
    env.pop("PARLEY_HOST")
    # Its src first: the package is installed (editable) from this checkout's src, which
    # the checkout's root alone on the path would not shadow.
    env["PYTHONPATH"] = os.pathsep.join([str(checkout / "src"), str(checkout)])
    gateway = start_gateway(
        env,
        fleet.log_dir / f"{fleet.queue}-gateway-{len(fleet.logs)}",
        tokens={TENANT: TOKEN},
        tokens_in_file=False,
        extra={"PARLEY_WORKSPACES": str(workspaces), **extra_env},
        ready=False,
    )
    fleet.processes.append(gateway.process)
    fleet.logs[gateway.pid] = gateway.log
    return gateway


def wait_ready(gateway: Gateway, timeout: float = 30) -> None:
    """Block until ``/readyz`` answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{gateway.url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"the gateway never became ready:\n{gateway.logs()}"
        time.sleep(0.1)


class Gateways:
    """One gateway per deployment for a module: started when a test first needs it,
    stopped with the module."""

    TENANTS = 400

    def __init__(self, directory: Path, extra: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.extra = dict(extra or {})
        self.running: dict[str, Gateway] = {}
        self._numbers = itertools.count()

    def get(self, backend: str, request: pytest.FixtureRequest) -> Gateway:
        """The gateway of ``backend``, started if need be."""
        if backend not in self.running:
            where = self.directory / backend
            env = deployment_env(backend, request, f"sqlite:///{where / 'parley.db'}")
            # Names of this gateway's own: on the fleet every module's gateway shares one
            # database, where another module's tenant of the same name would see these
            # tenants' sessions.
            tag = secrets.token_hex(3)
            names = [f"t{tag}-{n:03d}" for n in range(self.TENANTS)]
            self.running[backend] = start_gateway(
                env, where, tokens=make_tokens(names), extra=self.extra
            )
        gateway = self.running[backend]
        assert gateway.process.poll() is None, f"the gateway exited:\n{gateway.logs()}"
        return gateway

    def stop(self) -> None:
        """Stop every gateway."""
        for gateway in self.running.values():
            gateway.stop()
        self.running.clear()


def gateway_fixtures(folder: str, extra: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    """A test module's ``gateways`` fixture (a :class:`Gateways` of its own, in a folder
    named ``folder``, with ``extra`` variables, stopped with the module) and its
    ``gateway`` fixture (the gateway of the test's ``backend``).  Assign them to those
    names, which pytest finds them by: ``gateways, gateway = gateway_fixtures("x")``."""

    @pytest.fixture(scope="module")
    def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
        pool = Gateways(tmp_path_factory.mktemp(folder), extra=extra)
        yield pool
        pool.stop()

    @pytest.fixture
    def gateway(backend: str, gateways: Gateways, request: pytest.FixtureRequest) -> Gateway:
        return gateways.get(backend, request)

    return gateways, gateway


def scripted_tenant(gateway: Gateway, rules: list[dict[str, Any]]) -> Tenant:
    """A fresh tenant of ``gateway`` whose model answers with ``rules``."""
    fresh = gateway.tenant()
    fresh.control.script(rules)
    return fresh


def tenant_fixture(rules: list[dict[str, Any]]) -> Any:
    """A test module's ``tenant`` fixture: a fresh tenant of the test's gateway whose
    model answers with ``rules`` (``tenant = tenant_fixture(RULES)``)."""

    @pytest.fixture
    def tenant(gateway: Gateway) -> Tenant:
        return scripted_tenant(gateway, rules)

    return tenant
