"""Path globs, confinement to the session root, and the host policy, which no steer can
widen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parley.errors import InvalidRequest
from parley.globs import glob_match
from parley.policy import ApproveAll, Policy
from parley.ports.host import Access, AccessMode, ApprovalRequest
from parley.workspace import confine, relative

# ---------------------------------------------------------------------------- globs


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "pkg/a.py", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/sub/a.py", False),
        ("src/*", "src/", True),
        ("**", "a", True),
        ("**", "a/b/c.txt", True),
        ("**/*.py", "a.py", True),
        ("**/*.py", "a/b/c.py", True),
        ("**/*.py", "a/b/c.pyc", False),
        ("**/x", "x", True),
        ("**/x", "a/x", True),
        ("**/x", "a/b/c/x", True),
        ("**/x", "ax", False),
        ("**/x", "x/y", False),
        ("secrets/**", "secrets/token.txt", True),
        ("secrets/**", "secrets/deep/er/key.pem", True),
        ("secrets/**", "public/secrets/token.txt", False),
        ("secrets/**", "secretsfile", False),
        ("a/**/b", "a/b", True),
        ("a/**/b", "a/x/y/b", True),
        ("a/**/b", "ab", False),
        ("?.txt", "a.txt", True),
        ("?.txt", "ab.txt", False),
        ("?", "/", False),
        ("a.b", "aXb", False),
        ("a+b(c)", "a+b(c)", True),
        ("docs/*.md", "docs/readme.md.bak", False),
    ],
)
def test_glob_match(pattern: str, path: str, expected: bool) -> None:
    assert glob_match(pattern, path) is expected


# ---------------------------------------------------------------------------- confine


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with a sibling directory outside it (for escapes through symlinks)."""
    base = tmp_path / "root"
    (base / "a").mkdir(parents=True)
    (base / "a" / "file.txt").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("outside")
    return base


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../x", "..", "a/../../x", "a/b/../../../x", "./../x", "a\x00b", "", "  "],
)
def test_confine_refuses(root: Path, path: str) -> None:
    with pytest.raises(InvalidRequest):
        confine(str(root), path)


def test_confine_refuses_the_absolute_path_of_a_file_inside_the_root(root: Path) -> None:
    with pytest.raises(InvalidRequest):
        confine(str(root), str(root / "a" / "file.txt"))


def test_confine_allows_dot_dot_that_stays_inside(root: Path) -> None:
    assert confine(str(root), "a/../b") == root.resolve() / "b"
    assert relative(str(root), "a/../b") == "b"
    assert relative(str(root), "a/./file.txt") == "a/file.txt"


def test_confine_allows_missing_files(root: Path) -> None:
    assert confine(str(root), "new/dir/file.txt") == root.resolve() / "new" / "dir" / "file.txt"


def test_root_itself_is_dot(root: Path) -> None:
    assert confine(str(root), ".") == root.resolve()
    assert relative(str(root), ".") == "."


def test_confine_refuses_a_symlink_leaving_the_root(root: Path, tmp_path: Path) -> None:
    (root / "out_file").symlink_to(tmp_path / "outside" / "secret.txt")
    (root / "out_dir").symlink_to(tmp_path / "outside", target_is_directory=True)
    for path in ("out_file", "out_dir", "out_dir/secret.txt", "out_dir/new.txt"):
        with pytest.raises(InvalidRequest, match="symlink"):
            confine(str(root), path)


def test_confine_follows_a_symlink_that_stays_inside(root: Path) -> None:
    (root / "link").symlink_to(root / "a", target_is_directory=True)
    assert confine(str(root), "link/file.txt") == (root / "a" / "file.txt").resolve()
    assert relative(str(root), "link/file.txt") == "a/file.txt"


def test_confine_works_when_the_root_is_reached_through_a_symlink(
    root: Path, tmp_path: Path
) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    assert confine(str(alias), "a/file.txt") == (root / "a" / "file.txt").resolve()
    with pytest.raises(InvalidRequest):
        confine(str(alias), "../outside/secret.txt")


# ---------------------------------------------------------------------------- policy


def access(mode: AccessMode, path: str) -> Access:
    return Access(mode=mode, path=path)


def rule_of(policy: Policy, root: Path, *accesses: Access, tool: str = "tool") -> str | None:
    refusal = policy.check(tool, accesses, str(root))
    return None if refusal is None else refusal.rule


def test_default_policy_reads_and_writes_inside_the_root(root: Path) -> None:
    policy = Policy()
    assert rule_of(policy, root, access("read", "a/file.txt")) is None
    assert rule_of(policy, root, access("write", "new/file.txt")) is None
    assert rule_of(policy, root, access("read", ".")) is None
    assert rule_of(policy, root) is None


def test_default_policy_executes_nothing(root: Path) -> None:
    assert rule_of(Policy(), root, access("execute", "pytest -q")) == "allow_execute"


def test_allow_execute(root: Path) -> None:
    policy = Policy(allow_execute=["pytest*", "ruff check *"])
    assert rule_of(policy, root, access("execute", "pytest -q")) is None
    assert rule_of(policy, root, access("execute", "ruff check src")) is None
    assert rule_of(policy, root, access("execute", "rm -rf .")) == "allow_execute"


def test_deny_write_rule_name_and_deny_beats_allow(root: Path) -> None:
    policy = Policy(allow_write=["**", "secrets/**"], deny_write=["secrets/**"])
    assert rule_of(policy, root, access("write", "secrets/token.txt")) == "deny_write:secrets/**"
    assert rule_of(policy, root, access("write", "secrets/a/b.txt")) == "deny_write:secrets/**"
    # The write deny rule says nothing about reads.
    assert rule_of(policy, root, access("read", "secrets/token.txt")) is None
    assert rule_of(policy, root, access("write", "public/token.txt")) is None


def test_deny_read_rule_name(root: Path) -> None:
    policy = Policy(deny_read=["*.key", "**/.env"])
    assert rule_of(policy, root, access("read", "id.key")) == "deny_read:*.key"
    assert rule_of(policy, root, access("read", "svc/.env")) == "deny_read:**/.env"
    assert rule_of(policy, root, access("read", "svc/id.key")) is None
    assert rule_of(policy, root, access("write", "id.key")) is None


def test_deny_is_matched_on_the_normalised_path(root: Path) -> None:
    policy = Policy(deny_write=["secrets/**"])
    refused = access("write", "a/../secrets/./token.txt")
    assert rule_of(policy, root, refused) == "deny_write:secrets/**"


def test_deny_is_matched_on_the_symlink_target(root: Path) -> None:
    (root / "secrets").mkdir()
    (root / "innocent").symlink_to(root / "secrets", target_is_directory=True)
    policy = Policy(deny_write=["secrets/**"])
    assert rule_of(policy, root, access("write", "innocent/token.txt")) == "deny_write:secrets/**"


@pytest.mark.parametrize(
    "policy",
    [Policy(deny_read=["secrets/**", ".env"]), Policy(allow_read=["docs/**"])],
    ids=["deny", "allow-list"],
)
def test_a_symlink_named_like_a_glob_is_judged_by_where_it_leads(
    root: Path, policy: Policy
) -> None:
    # read_file opens `s?/token` as written, through the link: the policy must not take
    # the name for a glob whose walk (following no symlinked directory) finds nothing.
    (root / "secrets").mkdir()
    (root / "secrets" / "token").write_text("TOPSECRET")
    (root / ".env").write_text("API_KEY=sk")
    (root / "s?").symlink_to(root / "secrets", target_is_directory=True)
    (root / "e*").symlink_to(root, target_is_directory=True)
    for path in ("s?/token", "e*/.env", "./e*/secrets/token"):
        assert rule_of(policy, root, access("read", path)) is not None, path


def test_writes_into_git_are_refused_unless_the_host_lifts_the_guard(root: Path) -> None:
    # A hook or core.fsmonitor written there would run with any allowed git command.
    for path in (".git/config", ".git/hooks/pre-commit", "vendor/lib/.git/config", ".git"):
        assert rule_of(Policy(), root, access("write", path)) == "guard_git", path
        assert rule_of(Policy(guard_git=False), root, access("write", path)) is None, path
    assert rule_of(Policy(), root, access("read", ".git/config")) is None
    assert rule_of(Policy(), root, access("write", ".github/workflows/ci.yml")) is None


def test_outside_allow_list_names_the_allow_rule(root: Path) -> None:
    policy = Policy(allow_read=["docs/**"], allow_write=["docs/*.md"])
    assert rule_of(policy, root, access("read", "docs/a/b.md")) is None
    assert rule_of(policy, root, access("read", "src/a.py")) == "allow_read"
    assert rule_of(policy, root, access("write", "docs/a.md")) is None
    assert rule_of(policy, root, access("write", "docs/a/b.md")) == "allow_write"


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "escape/secret.txt"])
def test_paths_outside_the_root_are_refused_by_rule_root(
    root: Path, tmp_path: Path, path: str
) -> None:
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    permissive = Policy(allow_read=["**"], allow_write=["**"])
    assert rule_of(permissive, root, access("read", path)) == "root"
    assert rule_of(permissive, root, access("write", path)) == "root"


def test_deny_tools(root: Path) -> None:
    policy = Policy(deny_tools=["write_file"])
    assert rule_of(policy, root, access("write", "a.txt"), tool="write_file") == (
        "deny_tools:write_file"
    )
    # Denied even with no accesses at all.
    assert rule_of(policy, root, tool="write_file") == "deny_tools:write_file"
    assert rule_of(policy, root, access("write", "a.txt"), tool="other") is None


def test_every_access_is_checked(root: Path) -> None:
    policy = Policy(deny_write=["secrets/**"])
    accesses = (access("read", "a/file.txt"), access("write", "secrets/x"))
    assert rule_of(policy, root, *accesses) == "deny_write:secrets/**"


def test_refusal_reason_is_a_sentence_for_the_model(root: Path) -> None:
    refusal = Policy(deny_write=["secrets/**"]).check(
        "write_file", [access("write", "secrets/x")], str(root)
    )
    assert refusal is not None
    assert "secrets/x" in refusal.reason


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"deny_write": "secrets/**"}, id="string-deny-write"),
        pytest.param({"allow_read": "**"}, id="string-allow-read"),
        pytest.param({"deny_tools": "write_file"}, id="string-deny-tools"),
        pytest.param({"allow_execute": ["pytest", 3]}, id="non-string-item"),
        pytest.param({"deny_read": None}, id="none"),
        pytest.param({"allow_write": 5}, id="number"),
        pytest.param({"guard_git": "no"}, id="guard-git-not-a-bool"),
    ],
)
def test_bad_policy_input_is_invalid_request(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        Policy(**options)


def test_policy_lists_are_frozen_to_tuples() -> None:
    globs = ["secrets/**"]
    policy = Policy(deny_write=globs)
    globs.append("**")
    assert policy.deny_write == ("secrets/**",)


def test_approve_all_approves() -> None:
    request = ApprovalRequest(
        session_id="s",
        turn_id="t",
        tool="write_file",
        arguments={"path": "a"},
        accesses=(access("write", "a"),),
    )
    assert ApproveAll().approve(request) is True
