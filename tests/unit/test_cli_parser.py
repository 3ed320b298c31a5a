"""The command line's grammar (src/parley/cli/parser.py): the global options before or after
the command, a worker's Celery options left to Celery, and what ``parley --help`` says."""

from __future__ import annotations

import pytest

from parley.cli.parser import command_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--db", "sqlite:///x.db", "--host", "pkg.mod:host", "batch", "submit", "in.jsonl"],
        ["batch", "submit", "in.jsonl", "--db", "sqlite:///x.db", "--host", "pkg.mod:host"],
        ["batch", "--db", "sqlite:///x.db", "submit", "--host", "pkg.mod:host", "in.jsonl"],
        ["--host", "pkg.mod:host", "batch", "submit", "in.jsonl", "--db", "sqlite:///x.db"],
    ],
)
def test_the_global_options_go_before_or_after_the_command(argv: list[str]) -> None:
    args, extra = command_parser().parse_known_args(argv)
    assert (args.db, args.host, args.file, extra) == (
        "sqlite:///x.db",
        "pkg.mod:host",
        "in.jsonl",
        [],
    )


def test_an_option_not_given_after_the_command_keeps_the_one_given_before() -> None:
    args, _ = command_parser().parse_known_args(["--db", "sqlite:///a.db", "history", "S"])
    assert (args.db, args.host) == ("sqlite:///a.db", None)
    args, _ = command_parser().parse_known_args(["submit", "S", "hi"])
    assert (args.db, args.host) == (None, None)
    # Given twice, the one nearer the end wins, as with any repeated option.
    args, _ = command_parser().parse_known_args(["--db", "a", "submit", "S", "hi", "--db", "b"])
    assert args.db == "b"


def test_a_workers_celery_options_still_go_to_celery() -> None:
    argv = ["worker", "--hostname=w1@%h", "-c", "4", "--db", "sqlite:///x.db"]
    args, extra = command_parser().parse_known_args(argv)
    assert extra == ["--hostname=w1@%h", "-c", "4"] and args.db == "sqlite:///x.db"


def test_help_says_how_long_the_demo_takes_and_lists_batch_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        command_parser().parse_args(["--help"])
    assert "the whole story offline, in about ten seconds" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        command_parser().parse_args(["batch", "--help"])
    assert "list" in capsys.readouterr().out
