"""How many processes `parley worker` runs, and what each is called
(src/parley/cli/worker_processes.py): the Procfile's line takes every core; a bad
``--processes`` or one with the prefork pool is a clear error before anything starts.
(The processes themselves: tests/acceptance/test_worker_processes.py.)"""

from __future__ import annotations

import os
import shlex

import pytest

from parley.cli import main
from parley.cli.parser import command_parser
from parley.cli.worker_processes import child_names, pool_of, process_count
from parley.settings import Settings
from tests.support.fleet import procfile

NO_SETTINGS = Settings.from_environment({})


def test_the_procfiles_worker_line_runs_a_process_per_core() -> None:
    argv = shlex.split(procfile()["worker"])[1:]
    args, celery_args = command_parser().parse_known_args(argv)
    assert args.processes is None
    cores = len(os.sched_getaffinity(0))
    assert process_count(args.processes, NO_SETTINGS, celery_args) == cores
    with_variable = Settings.from_environment({"PARLEY_WORKER_PROCESSES": "3"})
    assert process_count(None, with_variable, celery_args) == 3
    assert process_count(1, with_variable, celery_args) == 1  # the option wins


def test_prefork_is_one_process_and_refuses_more() -> None:
    assert process_count(None, NO_SETTINGS, ["--concurrency", "4"]) == 1
    assert process_count(1, NO_SETTINGS, ["-P", "prefork"]) == 1
    for args in (["--concurrency", "4"], ["--pool=prefork"]):
        with pytest.raises(Exception, match="needs a pool other than prefork"):
            process_count(2, NO_SETTINGS, args)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_bad_processes_value_stops_the_command_before_it_starts(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["worker", "--processes", value, "--pool", "threads"])
    assert exit.value.code == 2
    assert f"--processes: must be a positive whole number, not {value!r}" in capsys.readouterr().err


def test_processes_with_prefork_stops_the_command_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "--processes", "2", "--concurrency", "2"]) == 2
    err = capsys.readouterr().err
    assert "--processes 2" in err and "needs a pool other than prefork" in err


def test_the_pool_is_read_as_celery_reads_it() -> None:
    assert pool_of([]) == "prefork"
    assert pool_of(["--pool", "threads"]) == "threads"
    assert pool_of(["-P", "gevent"]) == "gevent"
    assert pool_of(["-Pthreads"]) == "threads"
    assert pool_of(["--pool=solo", "-c", "3"]) == "solo"


def test_each_child_has_a_node_name_of_its_own() -> None:
    rest, names = child_names(["--pool", "threads", "--hostname", "w@%h", "-c", "9"], 3)
    assert rest == ["--pool", "threads", "-c", "9"]
    assert names == ["w-1@%h", "w-2@%h", "w-3@%h"]
    assert child_names(["-nbox", "-c", "2"], 2) == (["-c", "2"], ["box-1", "box-2"])
    assert child_names(["--hostname=a@b"], 1)[1] == ["a-1@b"]
    assert child_names([], 2)[1] == [f"parley-{os.getpid()}-{n}@%h" for n in (1, 2)]
