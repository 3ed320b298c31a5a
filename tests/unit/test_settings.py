"""The settings: every variable read in one place, once, each one listed in the docs, and
a bad value a clear error naming it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from parley.errors import InvalidRequest
from parley.settings import PROVIDER_VARIABLES, TELEMETRY_VARIABLES, Settings

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "src" / "parley"
REFERENCE = REPO / "docs" / "reference.md"
READS = re.compile(r"\bos\.environ\b|\bos\.getenv\b|\benviron\[|\bgetenv\(")
HANDED_ON = {
    # Each of these hands the environment on rather than reading parley's configuration.
    "tools/commands.py": "a command's child process gets the variables the tool lets through",
    "demo/__init__.py": "the demo's worker and gateway processes inherit the environment",
    "cli/fleet.py": (
        "`parley worker --db/--host`: the options become the environment Celery's app "
        "module (parley.celery_tasks) reads its settings from as it is imported"
    ),
    "cli/worker_processes.py": (
        "a worker's processes inherit its environment, with their parent's pid (how each "
        "knows to die with it: internal, not configuration)"
    ),
}
"""Modules that touch ``os.environ`` other than to read parley's configuration, and why."""
PROMETHEUS_DIRECTORY = "MULTIPROC_VARIABLE"
"""prometheus_client's multiprocess mode is set by ``PROMETHEUS_MULTIPROC_DIR`` in the
environment, which the library reads itself: a worker sets it there for its pool
processes, and the lines naming it read back what the process set (not a setting)."""


def test_nothing_set_is_every_default() -> None:
    assert Settings.from_environment({}) == Settings()
    defaults = Settings()
    assert (defaults.database_url, defaults.redis_url, defaults.host) == (None, None, None)
    assert (defaults.sweep_seconds, defaults.replay_seconds, defaults.batch_window) == (2, 3600, 64)
    assert (defaults.gateway_max_body, defaults.tenant_storage) == (1 << 20, 10 << 30)
    assert (defaults.webhook_max_attempts, defaults.admission, defaults.port) == (40, True, 8000)


def test_each_kind_of_value_is_read() -> None:
    settings = Settings.from_environment(
        {
            "PARLEY_DATABASE_URL": "sqlite:///x.db",
            "PARLEY_DATABASE_POOLER": " PgBouncer ",
            "PARLEY_DATABASE_POOL_SIZE": "3",
            "PARLEY_SWEEP_SECONDS": "0.5",
            "PARLEY_REPLAY_SECONDS": "60.0",
            "PARLEY_STREAM_FLUSH_SECONDS": "0",
            "PARLEY_TASK_EVENTS": "1",
            "PARLEY_ADMISSION": "OFF",
            "PARLEY_GATEWAY_CORS_ORIGINS": "https://a.example, ,https://b.example",
            "PARLEY_MODEL": "  openai:gpt-4o-mini ",
            "PARLEY_LOG_FORMAT": "json",
            "PORT": "5001",
            "OPENAI_API_KEY": "sk-test",
            "UNRELATED": "x",
        }
    )
    assert settings.database_url == "sqlite:///x.db"
    assert (settings.database_pooler, settings.database_pool_size) == ("pgbouncer", 3)
    assert (settings.sweep_seconds, settings.replay_seconds) == (0.5, 60)
    assert type(settings.replay_seconds) is int
    assert (settings.stream_flush_seconds, settings.task_events, settings.admission) == (
        0,
        True,
        False,
    )
    assert settings.gateway_cors_origins == ("https://a.example", "https://b.example")
    assert (settings.model, settings.log_format, settings.port) == (
        "openai:gpt-4o-mini",
        "json",
        5001,
    )
    assert settings.credentials == {"OPENAI_API_KEY": "sk-test"}


def test_a_blank_value_is_unset() -> None:
    kept_as_set = PROVIDER_VARIABLES + TELEMETRY_VARIABLES
    blank = {name: "  " for name in Settings.variables() if name not in kept_as_set}
    assert Settings.from_environment(blank) == Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PARLEY_SWEEP_SECONDS", "abc"),
        ("PARLEY_SWEEP_SECONDS", "0"),
        ("PARLEY_SWEEP_SECONDS", "inf"),
        ("PARLEY_SWEEP_SECONDS", "nan"),
        ("PARLEY_REPLAY_SECONDS", "1.5"),
        ("PARLEY_REPLAY_SECONDS", str(400 * 86_400)),
        ("PARLEY_STREAM_FLUSH_SECONDS", "2"),
        ("PARLEY_STREAM_FLUSH_SECONDS", "-0.1"),
        ("PARLEY_DATABASE_POOL_SIZE", "0"),
        ("PARLEY_BATCH_WINDOW", "many"),
        ("PARLEY_MAX_RETRY_AFTER", "-1"),
        ("PARLEY_GATEWAY_KEEPALIVE", "3600"),
        ("PARLEY_GATEWAY_CONNECTIONS", "1.5"),
        ("PARLEY_TENANT_STORAGE", "10GB"),
        ("PARLEY_WEBHOOK_MAX_ATTEMPTS", "2.5"),
        ("PARLEY_WEBHOOK_BACKOFF", "inf"),
        ("PORT", "70000"),
        ("PARLEY_TASK_EVENTS", "yes"),
        ("PARLEY_TRACE_CONTENT", "2"),
        ("PARLEY_ADMISSION", "true"),
        ("PARLEY_BROKER_QUEUE_TYPE", "stream"),
        ("PARLEY_DATABASE_POOLER", "pgpool"),
        ("PARLEY_LOG_FORMAT", "JSON"),
    ],
)
def test_a_bad_value_is_one_error_naming_its_variable_and_the_value(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Settings.from_environment({name: value})
    message = str(refused.value)
    assert message.startswith(f"{name} must be ") and repr(value) in message
    assert "\n" not in message


def test_the_upload_spool_holds_the_largest_file() -> None:
    with pytest.raises(InvalidRequest, match=r"PARLEY_GATEWAY_UPLOAD_SPOOL .* PARLEY_GATEWAY_MAX"):
        Settings.from_environment(
            {"PARLEY_GATEWAY_MAX_FILE": "5000", "PARLEY_GATEWAY_UPLOAD_SPOOL": "4999"}
        )


def test_secrets_stay_out_of_the_repr() -> None:
    settings = Settings.from_environment(
        {
            "PARLEY_WEBHOOK_SECRET": "whsec-1234567890",
            "PARLEY_METRICS_TOKEN": "metrics-token-1234567890",
            "PARLEY_GATEWAY_TOKENS": "gateway-token-1234567890=alpha",
            "ANTHROPIC_API_KEY": "sk-ant-1234567890",
        }
    )
    shown = repr(settings)
    for secret in ("whsec", "metrics-token", "gateway-token", "sk-ant"):
        assert secret not in shown


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().sweep_seconds = 1.0  # type: ignore[misc]


def _listed() -> set[str]:
    """The variables the reference's configuration table names, each in backticks."""
    table = REFERENCE.read_text("utf-8").split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*[A-Z0-9])`", line))
    return names


def test_every_variable_read_is_in_the_reference_and_every_one_listed_is_read() -> None:
    listed = _listed()
    read = set(Settings.variables())
    assert sorted(read - listed) == []
    parleys = {name for name in listed if name.startswith("PARLEY_")}
    tests_own = {name for name in parleys if name.startswith("PARLEY_TEST_")}
    assert sorted(parleys - tests_own - read) == []


def test_no_module_but_the_settings_reads_the_environment() -> None:
    readers = []
    for path in sorted(SOURCE.rglob("*.py")):
        name = path.relative_to(SOURCE).as_posix()
        if name == "settings.py" or name in HANDED_ON:
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if READS.search(line) and PROMETHEUS_DIRECTORY not in line:
                readers.append(f"{name}:{number}: {line.strip()}")
    assert readers == []
