"""Typed config end to end: ``TrainConfig`` declares every section with its owner's class, loading
a YAML file imports no Ray, a section survives the trip to an actor as the same validated object,
and no function takes its config as ``Any``."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import launch.config
from actors.executors.config import ExecutorConfig
from actors.learner.config import LearnerConfig
from actors.rollout.config import RolloutConfig
from actors.user_sim.config import UserSimConfig
from launch.config import TrainConfig, load_config
from launch.eval_config import EvalConfig
from launch.loggers import LoggingConfig

REPO = Path(__file__).resolve().parents[2]
SOURCE = ("actors", "launch", "scheduling", "envs", "sandbox")


@pytest.mark.parametrize("name", ["cpu_demo.yaml", "gpu_single_node.yaml", "multi_node.yaml"])
def test_loading_a_config_imports_no_ray(name):
    code = ("import sys; from launch.config import load_config; "
            f"load_config({str(REPO / 'configs' / name)!r}); "
            "bad = sorted(m for m in ('ray', 'torch') if m in sys.modules); "
            "assert not bad, f'loading a config imported {bad}'")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_section_is_a_declared_field_of_its_owners_class():
    owners = {"executors": ExecutorConfig, "rollout": RolloutConfig, "learner": LearnerConfig,
              "logging": LoggingConfig, "user_sim": UserSimConfig, "eval": EvalConfig}
    for section, cls in owners.items():
        assert TrainConfig.model_fields[section].annotation is cls, section
        assert type(getattr(TrainConfig(), section)) is cls, section
    assert not hasattr(launch.config, "train_config_model")   # no run-time model building
    assert "create_model" not in Path(launch.config.__file__).read_text()


def test_a_section_pickles_as_the_validated_object():
    """What Ray does to an actor's arguments: the section arrives equal, its resolved values
    and its set-fields record intact (``learner.total_steps`` resolved, the section's unset),
    and the receiving side's ``model_validate`` keeps the object as it is (no second
    validation)."""
    import ray.cloudpickle

    cfg = load_config(None, ["run.steps=7", "rollout.k=3"])
    assert cfg.learner_settings().total_steps == 7
    assert "total_steps" not in cfg.learner.model_fields_set
    for section in (cfg.learner, cfg.learner_settings(), cfg.rollout, cfg.rollout_settings(),
                    cfg.executors, cfg.user_sim):
        for dumps, loads in ((pickle.dumps, pickle.loads),
                             (ray.cloudpickle.dumps, ray.cloudpickle.loads)):
            back = loads(dumps(section))
            assert back == section and back.model_fields_set == section.model_fields_set
            assert type(back).model_validate(back) is back
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def _config_params(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.arg in ("cfg", "config"):
                    yield node, a


def test_no_function_takes_its_config_as_any():
    bad = []
    for top in SOURCE:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for fn, arg in _config_params(ast.parse(path.read_text(), rel)):
                ann = ast.unparse(arg.annotation) if arg.annotation is not None else None
                if ann is None or ann == "Any" or "Any" in ann.replace("Any]", "").split("|"):
                    bad.append(f"{rel}:{fn.lineno} {fn.name}({arg.arg}: {ann})")
    assert not bad, "config parameters typed Any or not at all:\n" + "\n".join(bad)
