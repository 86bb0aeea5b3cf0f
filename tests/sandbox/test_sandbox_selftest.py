"""The hostile suite: every attack contained, answered with a typed error, next call served."""

import json

import pytest

from launch.cli import main
from sandbox.backends import backend_problem
from sandbox.config import SandboxConfig
from sandbox.selftest import CASES, run_selftest

FAST = dict(call_timeout_s=2.0, tool_timeout_s=0.5, memory_mb=1024)


def test_suite_has_at_least_fifteen_distinct_attacks():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names) >= 15


def test_every_hostile_case_is_contained_on_the_default_backend():
    reports = run_selftest(SandboxConfig(**FAST))
    failed = [(r.name, r.outcome, r.expected, r.contained, r.served, r.detail)
              for r in reports if not r.passed]
    assert not failed, failed
    assert len(reports) == len(CASES)


@pytest.mark.skipif(backend_problem("unshare") is not None, reason="unshare cannot run here")
def test_unshare_backend_contains_the_escape_attempts():
    names = ["network", "host_secret_file", "host_secret_env", "write_outside", "shell",
             "fork_bomb", "kill_parent", "ctypes_setuid", "exit"]
    reports = run_selftest(SandboxConfig(backend="unshare", **FAST), names)
    assert [r.name for r in reports if not r.passed] == []


def test_selftest_command_prints_json_and_exit_status(capsys):
    assert main(["sandbox", "selftest", "--cases", "network,exit", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and [c["name"] for c in out["cases"]] == ["network", "exit"]


def test_selftest_command_rejects_unknown_case_in_one_line(capsys):
    assert main(["sandbox", "selftest", "--cases", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown selftest case(s) ['nope']" in err and len(err.strip().splitlines()) == 1


def test_backends_command_lists_every_backend(capsys):
    assert main(["sandbox", "backends", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert set(status) == {"bwrap", "unshare", "docker", "none"} and status["none"]["works"]
