"""The gateway's configuration and the pieces of its auth and workspaces that need no
server: tokens, tenants, binds, workspace names."""

from __future__ import annotations

import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from parley.errors import InvalidRequest
from parley.gateway.local_token import TOKEN_FILE
from parley.gateway.server import Bind
from parley.gateway.settings import LOCAL_TENANT, GatewaySettings, parse_tokens
from parley.gateway.tenants import TokenTable
from parley.settings import Settings
from parley.workspaces import workspace_root

TOKEN_A = "aaaaaaaaaaaaaaaaaaaa"
TOKEN_B = "bbbbbbbbbbbbbbbbbbbb"


def test_tokens_from_a_list_and_from_a_file(tmp_path: Path) -> None:
    assert parse_tokens(f"{TOKEN_A}=alpha, {TOKEN_B}=beta") == {TOKEN_A: "alpha", TOKEN_B: "beta"}
    listing = tmp_path / "tokens"
    listing.write_text(f"# the tenants\n{TOKEN_A}=alpha\n\n{TOKEN_B} = beta\n")
    assert parse_tokens(f"@{listing}") == {TOKEN_A: "alpha", TOKEN_B: "beta"}


@pytest.mark.parametrize(
    "value",
    [
        "short=alpha",  # guessable
        f"{TOKEN_A}",  # no tenant
        f"{TOKEN_A}=../up",  # a tenant is a directory name
        f"{TOKEN_A}=",
        f"{TOKEN_A}=alpha,{TOKEN_A}=beta",  # one token, two tenants
        "tok en with spaces..=alpha",
    ],
)
def test_a_wrong_pair_is_refused_without_repeating_the_token(value: str) -> None:
    with pytest.raises(InvalidRequest, match="PARLEY_GATEWAY_TOKENS") as refused:
        parse_tokens(value)
    assert TOKEN_A not in str(refused.value)


def test_an_unreadable_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="cannot be read"):
        parse_tokens(f"@{tmp_path / 'missing'}")


def test_without_tokens_the_local_token_is_kept_in_the_workspaces(tmp_path: Path) -> None:
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(tmp_path)})
    assert settings.loopback_only and not settings.tokens  # none until it may serve
    local = settings.with_local_token()
    assert local.generated_token is not None
    assert local.tokens == {local.generated_token: LOCAL_TENANT}
    kept = tmp_path / TOKEN_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert settings.with_local_token().generated_token == local.generated_token
    renewed = settings.with_local_token(new=True)
    assert renewed.generated_token != local.generated_token
    assert kept.read_text().strip() == renewed.generated_token
    assert sorted(p.name for p in tmp_path.iterdir()) == [TOKEN_FILE]  # no temporary left


@pytest.mark.parametrize(
    ("content", "mode", "refusal"),
    [
        ("A" * 32, 0o640, "may be read by other users"),
        ("A" * 32, 0o604, "may be read by other users"),
        ("not a token", 0o600, "holds no token"),
        ("", 0o600, "holds no token"),
    ],
)
def test_a_local_token_file_that_is_not_its_owners_alone_is_refused(
    tmp_path: Path, content: str, mode: int, refusal: str
) -> None:
    kept = tmp_path / TOKEN_FILE
    kept.write_text(content)
    kept.chmod(mode)
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(tmp_path)})
    with pytest.raises(InvalidRequest, match=refusal) as refused:
        settings.with_local_token()
    assert "--new-token" in str(refused.value)
    assert not content or content not in str(refused.value)
    assert kept.read_text() == content  # left as it was
    assert settings.with_local_token(new=True).generated_token != content


def test_a_local_token_file_through_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("A" * 32)
    elsewhere.chmod(0o600)
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    (workspaces / TOKEN_FILE).symlink_to(elsewhere)
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(workspaces)})
    with pytest.raises(InvalidRequest, match="cannot be read"):
        settings.with_local_token()


def test_a_workspaces_path_that_is_no_directory_is_named(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(taken)})
    unreadable = r"a-file/\.local-token cannot be read: Not a directory"
    with pytest.raises(InvalidRequest, match=unreadable):
        settings.with_local_token()
    unwritable = f"cannot keep the local token in {re.escape(str(taken))}"
    with pytest.raises(InvalidRequest, match=unwritable):
        settings.with_local_token(new=True)
    assert taken.read_text() == ""


def test_two_gateways_starting_at_once_serve_one_local_token(tmp_path: Path) -> None:
    settings = GatewaySettings.from_environment({"PARLEY_WORKSPACES": str(tmp_path)})
    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(lambda _: settings.with_local_token().generated_token, range(32)))
    assert len(tokens) == 1


def test_configured_tokens_have_no_local_token(tmp_path: Path) -> None:
    settings = GatewaySettings.from_environment(
        {"PARLEY_GATEWAY_TOKENS": f"{TOKEN_A}=alpha", "PARLEY_WORKSPACES": str(tmp_path)}
    )
    with pytest.raises(InvalidRequest, match="PARLEY_GATEWAY_TOKENS"):
        settings.with_local_token(new=True)
    assert not list(tmp_path.iterdir())


def test_settings_from_the_environment(tmp_path: Path) -> None:
    settings = GatewaySettings.from_environment(
        {
            "PARLEY_GATEWAY_TOKENS": f"{TOKEN_A}=alpha",
            "PARLEY_WORKSPACES": str(tmp_path),
            "PARLEY_GATEWAY_MAX_BODY": "1000",
            "PARLEY_GATEWAY_KEEPALIVE": "2.5",
            "PARLEY_GATEWAY_CORS_ORIGINS": "https://a.example, https://b.example",
            "PARLEY_GATEWAY_HEADER_TIMEOUT": "2",
            "PARLEY_GATEWAY_BODY_TIMEOUT": "7.5",
            "PARLEY_GATEWAY_TENANT_REQUESTS": "9",
            "PARLEY_GATEWAY_TENANT_STREAMS": "3",
            "PARLEY_GATEWAY_MAX_FILE": "5000",
            "PARLEY_GATEWAY_UPLOAD_RATE": "100",
            "PARLEY_GATEWAY_UPLOAD_SPOOL": "5000",
            "PARLEY_GATEWAY_TENANT_UPLOADS": "4",
            "PARLEY_GATEWAY_CONNECTIONS": "50",
            "PARLEY_GATEWAY_CLIENT_CONNECTIONS": "10",
            "PARLEY_GATEWAY_HEAVY_THREADS": "6",
            "PARLEY_GATEWAY_TENANT_HEAVY": "3",
            "PARLEY_TENANT_STORAGE": "123456",
        }
    )
    assert not settings.loopback_only
    assert settings.tokens == {TOKEN_A: "alpha"}
    assert settings.workspaces == tmp_path
    assert settings.max_body == 1000
    assert settings.keepalive_seconds == 2.5
    assert settings.cors_origins == ("https://a.example", "https://b.example")
    assert (settings.header_timeout_seconds, settings.body_timeout_seconds) == (2, 7.5)
    assert (settings.tenant_requests, settings.tenant_streams) == (9, 3)
    assert (settings.max_file, settings.upload_rate, settings.upload_spool) == (5000, 100, 5000)
    assert settings.tenant_uploads == 4
    assert (settings.connections, settings.client_connections) == (50, 10)
    assert (settings.heavy_threads, settings.tenant_heavy) == (6, 3)
    assert settings.tenant_storage == 123456


def test_the_upload_spool_holds_the_largest_file() -> None:
    with pytest.raises(InvalidRequest, match=r"PARLEY_GATEWAY_UPLOAD_SPOOL .* PARLEY_GATEWAY_MAX"):
        GatewaySettings.from_environment(
            {"PARLEY_GATEWAY_MAX_FILE": "5000", "PARLEY_GATEWAY_UPLOAD_SPOOL": "4999"}
        )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PARLEY_GATEWAY_MAX_BODY", "lots"),
        ("PARLEY_GATEWAY_MAX_BODY", "0"),
        ("PARLEY_GATEWAY_KEEPALIVE", "-1"),
        ("PARLEY_GATEWAY_KEEPALIVE", "never"),
        ("PARLEY_GATEWAY_HEADER_TIMEOUT", "0"),
        ("PARLEY_GATEWAY_BODY_TIMEOUT", "soon"),
        ("PARLEY_GATEWAY_TENANT_REQUESTS", "0"),
        ("PARLEY_GATEWAY_TENANT_STREAMS", "many"),
        ("PARLEY_GATEWAY_UPLOAD_RATE", "fast"),
        ("PARLEY_GATEWAY_UPLOAD_SPOOL", "-5"),
        ("PARLEY_GATEWAY_TENANT_UPLOADS", "0"),
        ("PARLEY_GATEWAY_CONNECTIONS", "1.5"),
        ("PARLEY_GATEWAY_CLIENT_CONNECTIONS", "0"),
        ("PARLEY_GATEWAY_HEAVY_THREADS", "none"),
        ("PARLEY_GATEWAY_TENANT_HEAVY", "0"),
        ("PARLEY_TENANT_STORAGE", "10GB"),
    ],
)
def test_a_bad_setting_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(InvalidRequest, match=name):
        GatewaySettings.from_environment({name: value})


def test_the_token_table_finds_only_whole_tokens() -> None:
    table = TokenTable({TOKEN_A: "alpha", TOKEN_B: "beta"})
    assert table.tenant_of(TOKEN_A) == "alpha"
    assert table.tenant_of(TOKEN_B) == "beta"
    assert table.tenant_of(TOKEN_A[:-1]) is None
    assert table.tenant_of(TOKEN_A + "a") is None
    assert table.tenant_of("") is None
    assert table.tenant_of("\udcff") is None  # not even valid UTF-8


@pytest.mark.parametrize(
    ("value", "host", "port", "loopback"),
    [
        ("127.0.0.1:8000", "127.0.0.1", 8000, True),
        ("localhost:0", "localhost", 0, True),
        ("[::1]:9000", "::1", 9000, True),
        ("0.0.0.0:80", "0.0.0.0", 80, False),
        ("192.168.1.5:8000", "192.168.1.5", 8000, False),
        ("example.com:8000", "example.com", 8000, False),
    ],
)
def test_binds(value: str, host: str, port: int, loopback: bool) -> None:
    bind = Bind.parse(value)
    assert (bind.host, bind.port, bind.loopback) == (host, port, loopback)


def test_the_default_bind_is_loopback_on_port() -> None:
    port = Settings.from_environment({"PORT": "5001"}).port
    assert Bind.parse(None, port) == Bind(host="127.0.0.1", port=5001)
    assert Bind.parse(None, Settings.from_environment({}).port) == Bind(host="127.0.0.1", port=8000)


@pytest.mark.parametrize("value", ["8000", ":8000", "host:port", "host:70000"])
def test_a_bad_bind_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest):
        Bind.parse(value)


def test_a_workspace_is_made_under_its_tenant(tmp_path: Path) -> None:
    root = workspace_root(tmp_path, "alpha", "repo")
    assert root == tmp_path / "alpha" / "repo"
    assert root.is_dir()
    assert workspace_root(tmp_path, "alpha", "repo") == root  # sessions may share one


def test_a_workspace_that_is_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "alpha").mkdir()
    os.symlink(outside, tmp_path / "alpha" / "link")
    (tmp_path / "alpha" / "file").write_text("")
    for name in ("link", "file"):
        with pytest.raises(InvalidRequest, match="not a plain directory"):
            workspace_root(tmp_path, "alpha", name)
    assert list(outside.iterdir()) == []
