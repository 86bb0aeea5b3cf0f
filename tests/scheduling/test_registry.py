"""The scheduler registry: one table of names, classes and typed params, used by training,
the simulator, the CLI and config validation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from fakes import FakeGraph
from scheduling import registry
from scheduling.base import Scheduler, TaskInfo
from scheduling.baselines.dapo import DAPOFilter


def _tasks(g):
    return [TaskInfo(t, g.env_ids[g.env_of[i]], f"do {t}") for i, t in enumerate(g.task_ids)]


def test_every_name_and_its_dapo_composition_builds_a_scheduler_with_run_level_b_k_seed():
    g = FakeGraph(10, 8, seed=1)
    for name in registry.names() + [f"dapo+{n}" for n in registry.names()]:
        s = registry.build(name, {}, tasks=_tasks(g), batch_size=8, k=4, seed=3, graph=g)
        assert isinstance(s, Scheduler), name
        assert isinstance(s, DAPOFilter) == name.startswith("dapo+")
        assert len(s.select(0)) == 8, name


def test_params_are_typed_and_exclude_run_level_settings():
    with pytest.raises(ValidationError, match="rhoo"):
        registry.validate_params("envsched", {"rhoo": 0.3})
    with pytest.raises(ValidationError, match="c1"):
        registry.validate_params("envsched", {"c1": "four"})
    for name in registry.names():
        fields = registry.params_model(name).model_fields
        assert not {"batch_size", "seed", "k", "rollouts"} & set(fields), name
    assert registry.validate_params("dapo+mopps", {"max_draws": 2, "lam": 0.3}).max_draws == 2


def test_unknown_name_suggests_the_closest():
    with pytest.raises(registry.UnknownSchedulerError, match="did you mean 'mopps'"):
        registry.get("moops")


def test_leeps_reads_the_graph_embedding_the_same_way_everywhere():
    g = FakeGraph(10, 8, seed=2)
    s = registry.build("leeps", {}, tasks=_tasks(g), batch_size=8, k=4, seed=0, graph=g)
    assert abs(s.H - g.X_full).max() < 1e-9          # X_full rows (already unit length)


def test_graph_is_built_lazily_only_for_schedulers_that_need_it():
    g = FakeGraph(10, 8, seed=3)
    calls = []
    source = lambda: calls.append(1) or g  # noqa: E731
    registry.build("mopps", {}, tasks=_tasks(g), batch_size=8, k=4, seed=0, graph=source)
    assert not calls
    registry.build("envsched", {}, tasks=_tasks(g), batch_size=8, k=4, seed=0, graph=source)
    assert calls == [1]


def test_a_typo_in_scheduler_params_fails_at_config_load_naming_the_field():
    from launch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"scheduler\.params\.rhoo.*did you mean 'rho'"):
        load_config(None, ["scheduler.params.rhoo=0.3"])
    with pytest.raises(ConfigError, match=r"scheduler\.params\.c1.*valid integer"):
        load_config(None, ["scheduler.params.c1=four"])
    with pytest.raises(ConfigError, match=r"scheduler\.params\.batch_size.*run\.batch_size"):
        load_config(None, ["scheduler.params.batch_size=16"])
    with pytest.raises(ConfigError, match=r"scheduler\.name.*did you mean 'mopps'"):
        load_config(None, ["scheduler.name=moops"])
    cfg = load_config(None, ["scheduler.name=leeps", "scheduler.params={window: 4}"])
    assert cfg.scheduler.typed_params().window == 4


def test_train_refuses_a_simulator_only_dapo_name_at_config_load(tmp_path, capsys):
    from launch.cli import main
    from launch.config import ConfigError, load_config

    assert "dapo+mopps" not in registry.train_names()
    assert set(registry.train_names()) == set(registry.names())
    with pytest.raises(ConfigError, match=r"scheduler\.name.*simulator-only.*envsched simulate"):
        load_config(None, ["scheduler.name=dapo+mopps"])
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "scheduler.name=dapo+envsched"]) == 2
    err = capsys.readouterr().err
    assert "simulator-only" in err and len(err.strip().splitlines()) == 1
    assert not (out / "pool").exists()
    registry.build("dapo+mopps", {}, tasks=[TaskInfo(f"t{i}", "e") for i in range(16)],
                   batch_size=8, k=4, seed=0)            # the simulator still builds it


def test_train_refuses_bad_scheduler_params_before_generating_a_pool(tmp_path, capsys):
    from launch.cli import main

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "scheduler.params.rhoo=0.3"]) == 2
    assert "scheduler.params.rhoo" in capsys.readouterr().err
    assert not (out / "pool").exists()


def test_simulate_cli_accepts_registry_names_only():
    from launch.errors import UserError
    from launch.commands.simulate import _settings

    args = SimpleNamespace(schedulers="envsched,dapo+mopps", steps=1, seeds=1, batch_size=8,
                           workers=1, t4_runs=0, quick=False, ablations=False)
    assert list(_settings(args).schedulers) == ["envsched", "dapo+mopps"]
    with pytest.raises(UserError, match="did you mean 'mopps'"):
        _settings(SimpleNamespace(**{**vars(args), "schedulers": "moops"}))


def test_identifier_filter_settings_are_asked_the_same_way_for_every_scheduler():
    from scheduling.config import EnvSchedParams

    got = registry.identifier_filter_settings("envsched", {"identifier_max_checks": 3})
    assert isinstance(got, EnvSchedParams) and got.identifier_max_checks == 3
    bayes = registry.identifier_filter_settings(
        "envsched-bayes", {"envsched": {"identifier_max_checks": 5}})
    assert isinstance(bayes, EnvSchedParams) and bayes.identifier_max_checks == 5
    assert registry.identifier_filter_settings(
        "envsched-bayes", {"envsched": {"identifier_filter": False}}) is None
    for name in ("random", "dps", "mopps", "leeps"):
        assert registry.identifier_filter_settings(name, {}) is None, name
    assert registry.identifier_filter_settings("dapo+envsched", {"max_draws": 2}) is not None
