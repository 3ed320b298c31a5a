"""The deploy files (``deploy/``) and the Procfile say only what parley really has: the
Kubernetes manifests are valid against the Kubernetes API's schemas (kubernetes-validate,
which carries them offline) and hold what a fleet needs; the compose file parses and runs
the Procfile's processes; every command and option in every deploy file is one that
`parley --help` (or, after `parley worker`, Celery's worker) lists, and every environment
variable one that the code reads; and they all run the Procfile's worker line."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from celery.bin.worker import worker as celery_worker

from tests.support.fleet import REPO, procfile

DEPLOY = REPO / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
COMPOSE = DEPLOY / "compose.yaml"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
IMAGE = "parley"  # what deploy/Dockerfile builds; the compose file and manifests run it
CODE = [REPO / "src" / "parley"]


def manifests() -> list[dict[str, Any]]:
    """Every Kubernetes object of deploy/kubernetes/."""
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def parley_services() -> dict[str, dict[str, Any]]:
    """The compose file's services that run parley's image."""
    return {n: s for n, s in compose()["services"].items() if s.get("image") == IMAGE}


def containers() -> list[dict[str, Any]]:
    """Every container (and init container) of the manifests' pod templates that runs
    parley's image (PgBouncer's is configured in its own terms)."""
    found = []
    for doc in manifests():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        found += pod.get("containers", []) + pod.get("initContainers", [])
    return [c for c in found if c["image"].split(":")[0] == IMAGE]


def of_kind(kind: str, component: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in manifests()
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
    ]


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


# ---------------------------------------------------------------- what parley has


@cache
def parley_help(*command: str) -> str:
    """What `parley COMMAND --help` prints."""
    return subprocess.run(
        [sys.executable, "-m", "parley", *command, "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout


def subcommands() -> set[str]:
    """The commands `parley --help` lists under COMMAND."""
    listing = parley_help().split("COMMAND\n", 2)[-1].split("\noptions:")[0]
    return set(re.findall(r"^    ([a-z][a-z-]*)\b", listing, flags=re.MULTILINE))


def options_of(*command: str) -> set[str]:
    """The options the usage line of `parley [COMMAND] --help` names."""
    usage = parley_help(*command).split("\n\n")[0]
    return set(re.findall(r"\[(-[-\w]+)", usage))


def celery_worker_options() -> set[str]:
    return {o for p in celery_worker.params for o in (*p.opts, *p.secondary_opts)}


@cache
def code_names() -> set[str]:
    """Every upper-case name the code spells as a string: where it reads the environment
    (``env.get("PARLEY_…")``, ``_key(env, "OPENAI_API_KEY", …)``)."""
    names = set()
    for root in CODE:
        for path in root.rglob("*.py"):
            names |= set(re.findall(r"""["']([A-Z][A-Z0-9_]{2,})["']""", path.read_text()))
    return names


# ---------------------------------------------------------------- the commands


def parley_argv(command: list[str]) -> list[str]:
    """``command`` from the word after `parley` (a path to it, or the image's
    entrypoint)."""
    for n, word in enumerate(command):
        if Path(word).name == "parley":
            return command[n + 1 :]
    return command  # the image's entrypoint is `parley`: this is its arguments


def deploy_commands() -> dict[str, list[str]]:
    """Every parley command line of the Procfile and deploy/, by where it is."""
    found = {f"Procfile {n}": shlex.split(line) for n, line in procfile().items()}
    for unit in UNITS:
        for line in unit.read_text().splitlines():
            if line.startswith("ExecStart="):
                found[unit.name] = shlex.split(line.removeprefix("ExecStart="))
    for name, service in parley_services().items():
        found[f"compose {name}"] = list(service["command"])
    for container in containers():
        if container["image"].split(":")[0] == IMAGE:
            found[f"kubernetes {container['name']}"] = list(container["args"])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, flags=re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, flags=re.MULTILINE)
    assert entrypoint and cmd, "the Dockerfile's ENTRYPOINT and CMD are JSON arrays"
    found["Dockerfile"] = [*yaml.safe_load(entrypoint[1]), *yaml.safe_load(cmd[1])]
    return {where: parley_argv(argv) for where, argv in found.items()}


def check_command(argv: list[str]) -> None:
    """``argv`` (what follows `parley`) is a command parley has, with options it has."""
    global_options = options_of()
    while argv and argv[0] in global_options:
        argv = argv[2:]  # --db URL, --host HOST
    assert argv and argv[0] in subcommands(), f"no such command: parley {' '.join(argv)}"
    command, rest = argv[0], argv[1:]
    known = options_of(command)
    if command == "worker":
        known |= celery_worker_options()  # `parley worker` hands the rest to Celery
    for word in rest:
        option = word.split("=", 1)[0]
        if option.startswith("-"):
            assert option in known, f"parley {command} has no option {option}"
    if command == "worker":
        pools = next(p for p in celery_worker.params if p.name == "pool").type.choices
        assert worker_options(argv)["--pool"] in pools


def worker_options(argv: list[str]) -> dict[str, str]:
    """A worker command's options and their values, by their long names."""
    short = {"-P": "--pool", "-c": "--concurrency", "-n": "--hostname", "-Q": "--queues"}
    words = [w for word in argv[1:] for w in word.split("=", 1)]
    return {short.get(k, k): v for k, v in zip(words[::2], words[1::2], strict=True)}


def test_every_command_in_the_procfile_and_deploy_is_one_parley_has() -> None:
    commands = deploy_commands()
    expected = {"Procfile release", "Procfile worker", "Procfile beat", "Procfile gateway"}
    assert expected <= set(commands)
    assert {f"compose {p}" for p in ("release", "worker", "beat", "gateway")} <= set(commands)
    for where, argv in commands.items():
        try:
            check_command(argv)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None


def test_a_command_parley_lacks_is_caught() -> None:
    # (The check above cannot pass on anything.)
    with pytest.raises(AssertionError, match="no such command"):
        check_command(["sweep"])
    with pytest.raises(AssertionError, match="no option --bnd"):
        check_command(["gateway", "--bnd", "0.0.0.0:8000"])
    with pytest.raises(AssertionError, match="no option --concurency"):
        check_command(["worker", "--pool", "threads", "--concurency", "100"])
    with pytest.raises(AssertionError):
        check_command(["worker", "--pool", "thread", "--concurrency", "100"])


def test_procfile_and_deploy_run_the_same_worker_line() -> None:
    lines = {
        where: {k: v for k, v in worker_options(argv).items() if k != "--hostname"}
        for where, argv in deploy_commands().items()
        if argv[:1] == ["worker"]
    }
    assert {"Procfile worker", "compose worker", "kubernetes worker"} <= set(lines)
    assert any(where.startswith("parley-worker") for where in lines)  # the systemd unit
    procfile_line = lines.pop("Procfile worker")
    assert procfile_line["--pool"] == "threads"
    for where, options in lines.items():
        assert options == procfile_line, f"{where} runs another worker line than the Procfile"


# ---------------------------------------------------------------- the environment


def deploy_environment() -> dict[str, set[str]]:
    """Every environment variable the deploy files give parley, by file."""
    found: dict[str, set[str]] = {}
    text = COMPOSE.read_text()
    found["compose.yaml"] = {n for s in parley_services().values() for n in s["environment"]}
    found["compose.yaml"] |= set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    objects = manifests()
    found["kubernetes"] = {
        key
        for doc in objects
        if doc["kind"] in ("ConfigMap", "Secret")
        # (PgBouncer's and RabbitMQ's are configured in their own terms)
        and doc["metadata"]["labels"].get("app.kubernetes.io/component")
        not in ("pgbouncer", "rabbitmq")
        for key in (*doc.get("data", {}), *doc.get("stringData", {}))
    } | {e["name"] for c in containers() for e in c.get("env", [])}
    example = (DEPLOY / "parley.env.example").read_text()
    found["parley.env.example"] = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]*)=", example, re.M))
    for unit in UNITS:
        found[unit.name] = set(
            re.findall(r"^Environment=([A-Z][A-Z0-9_]*)=", unit.read_text(), re.M)
        )
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    found["Dockerfile"] = set(re.findall(r"^ENV ([A-Z][A-Z0-9_]*)=", dockerfile, re.M))
    return found


def test_every_environment_variable_in_deploy_is_one_the_code_reads() -> None:
    found = deploy_environment()
    assert {"PARLEY_DATABASE_URL", "PARLEY_REDIS_URL", "PARLEY_HOST"} <= found["kubernetes"]
    for where, names in found.items():
        unknown = names - code_names()
        assert not unknown, f"{where} sets what parley never reads: {sorted(unknown)}"
    assert "PARLEY_DATABSE_URL" not in code_names()  # (the check can fail)


# ---------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_manifests_are_valid_kubernetes_objects(path: Path) -> None:
    version = kubernetes_validate.latest_version()
    for doc in yaml.safe_load_all(path.read_text()):
        # Strict: a misspelt field is an error, not something the API server drops.
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_manifests_run_a_migration_job_workers_a_gateway_and_one_sweeper() -> None:
    [job] = of_kind("Job")
    job_pod = job["spec"]["template"]["spec"]
    assert parley_argv(job_pod["containers"][0]["args"]) == ["migrate"]
    assert job_pod["restartPolicy"] in ("OnFailure", "Never")

    [worker] = of_kind("Deployment", "worker")
    spec = pod_spec(worker)
    # Longer than a turn: warm shutdown lets each driver finish the turn it runs.
    assert spec["terminationGracePeriodSeconds"] == stop_timeouts()["parley-worker@.service"]
    script = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert script[:2] == ["/bin/sh", "-c"]
    assert re.search(r"\bkill -(TERM|s TERM|15) 1\b", script[2]), "SIGTERM to the main process"
    assert re.search(r"\bkill -0 1\b", script[2]), "and wait for it to exit"

    [beat] = of_kind("Deployment", "beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"

    [gateway] = of_kind("Deployment", "gateway")
    [service] = of_kind("Service", "gateway")
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for c in pod_spec(gateway)["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    assert pod_spec(gateway)["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_every_container_takes_the_config_map_and_the_secret_that_are_defined() -> None:
    defined = {(d["kind"], d["metadata"]["name"]) for d in manifests()}
    claims = {n for (k, n) in defined if k == "PersistentVolumeClaim"}
    for container in containers():
        refs = {
            ("ConfigMap", s["configMapRef"]["name"])
            for s in container["envFrom"]
            if "configMapRef" in s
        }
        refs |= {
            ("Secret", s["secretRef"]["name"]) for s in container["envFrom"] if "secretRef" in s
        }
        assert len(refs) == 2 and refs <= defined, container["name"]
    for doc in manifests():
        for volume in doc.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", []):
            assert volume["persistentVolumeClaim"]["claimName"] in claims


# ---------------------------------------------------------------- compose, systemd


def stop_timeouts() -> dict[str, int]:
    """How long each deploy gives a stopping worker, in seconds."""
    unit = (DEPLOY / "systemd" / "parley-worker@.service").read_text()
    [grace] = [
        pod_spec(d)["terminationGracePeriodSeconds"] for d in of_kind("Deployment", "worker")
    ]
    return {
        "parley-worker@.service": int(re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.M)[0]),
        "kubernetes": int(grace),
        "compose": int(compose()["services"]["worker"]["stop_grace_period"].removesuffix("s")),
    }


def test_every_deploy_gives_a_stopping_worker_the_same_time_well_past_the_defaults() -> None:
    timeouts = stop_timeouts()
    assert len(set(timeouts.values())) == 1, timeouts
    # Longer than Kubernetes' and compose's defaults (30 s, 10 s), which would cut turns.
    assert min(timeouts.values()) >= 300


def test_the_compose_file_runs_the_procfiles_processes_in_order() -> None:
    services = parley_services()
    assert set(services) == {"release", "worker", "beat", "gateway"}
    build = services["worker"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "Dockerfile"
    )
    for name in ("worker", "beat", "gateway"):
        depends = services[name]["depends_on"]
        assert depends["release"] == {"condition": "service_completed_successfully"}
    assert services["release"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["worker"]["stop_signal"] == "SIGTERM"
    assert services["beat"]["deploy"]["replicas"] == 1
    assert "PARLEY_GATEWAY_TOKENS" in services["gateway"]["environment"]
    declared = set(compose()["volumes"])
    for service in compose()["services"].values():
        for mount in service.get("volumes", []):
            assert mount.split(":")[0] in declared
    everything = set(compose()["services"])
    for service in services.values():
        assert set(service["depends_on"]) <= everything


def test_every_deploy_puts_pgbouncer_in_transaction_mode_in_front_and_migrates_past_it() -> None:
    # Compose: the processes through the pooler, the migration to PostgreSQL itself.
    services = compose()["services"]
    environment = parley_services()["release"]["environment"]
    assert "@pgbouncer:" in environment["PARLEY_DATABASE_URL"]
    assert "@postgres:" in environment["PARLEY_DATABASE_DIRECT_URL"]
    assert environment["PARLEY_DATABASE_POOLER"] == "pgbouncer"
    assert services["pgbouncer"]["environment"]["POOL_MODE"] == "transaction"
    for name in ("worker", "beat", "gateway"):
        assert services[name]["depends_on"]["pgbouncer"] == {"condition": "service_healthy"}
    # Kubernetes: the same, the pooler a Deployment behind a Service of its own.
    [config] = [
        d
        for d in manifests()
        if d["kind"] == "Secret" and d["metadata"]["name"] == "parley-secrets"
    ]
    [settings] = [d for d in manifests() if d["kind"] == "ConfigMap"]
    [pooler] = of_kind("Deployment", "pgbouncer")
    [service] = of_kind("Service", "pgbouncer")
    host = config["stringData"]["PARLEY_DATABASE_URL"].split("@")[1].split(":")[0]
    assert host == service["metadata"]["name"] == pooler["metadata"]["name"]
    assert "@postgres:" in config["stringData"]["PARLEY_DATABASE_DIRECT_URL"]
    assert settings["data"]["PARLEY_DATABASE_POOLER"] == "pgbouncer"
    env = {e["name"]: e.get("value") for e in pod_spec(pooler)["containers"][0]["env"]}
    assert env["POOL_MODE"] == "transaction"


def test_every_deploy_offers_rabbitmq_with_quorum_queues_kept_across_restarts() -> None:
    # Compose, with --profile rabbitmq: a fixed host name (the node's name, under which
    # its data is kept) and a volume for that data.
    rabbitmq = compose()["services"]["rabbitmq"]
    assert rabbitmq["profiles"] == ["rabbitmq"] and rabbitmq["hostname"] == "rabbitmq"
    assert "rabbitmq:/var/lib/rabbitmq" in rabbitmq["volumes"]
    environment = parley_services()["worker"]["environment"]
    assert environment["PARLEY_BROKER_QUEUE_TYPE"] == "${PARLEY_BROKER_QUEUE_TYPE:-quorum}"
    user, password = (rabbitmq["environment"][f"RABBITMQ_DEFAULT_{k}"] for k in ("USER", "PASS"))
    assert f"amqp://{user}:{password}@rabbitmq:5672//" in COMPOSE.read_text()
    # Kubernetes: a StatefulSet (a stable host name) with a volume of its own, behind the
    # Service parley's broker URL names, as the user its Secret makes.
    [server] = of_kind("StatefulSet", "rabbitmq")
    [service] = of_kind("Service", "rabbitmq")
    [account] = of_kind("Secret", "rabbitmq")
    assert server["spec"]["serviceName"] == service["metadata"]["name"] == "rabbitmq"
    [claim] = server["spec"]["volumeClaimTemplates"]
    [mount] = pod_spec(server)["containers"][0]["volumeMounts"]
    assert (mount["name"], mount["mountPath"]) == (claim["metadata"]["name"], "/var/lib/rabbitmq")
    [config] = [d for d in manifests() if d["metadata"]["name"] == "parley-secrets"]
    [settings] = [d for d in manifests() if d["kind"] == "ConfigMap"]
    credentials = account["stringData"]
    user, password = credentials["RABBITMQ_DEFAULT_USER"], credentials["RABBITMQ_DEFAULT_PASS"]
    url = config["stringData"]["PARLEY_BROKER_URL"]
    assert url == f"amqp://{user}:{password}@rabbitmq:5672//"
    assert settings["data"]["PARLEY_BROKER_QUEUE_TYPE"] == "quorum"
