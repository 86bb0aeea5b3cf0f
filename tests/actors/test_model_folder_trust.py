"""A model folder is data, never code (``actors.checkpoints.remote_code``): a folder whose config
has ``auto_map`` next to a ``.py`` that would write a marker file is refused in one line naming
the file, by every loader and by ``envsched rollout``/``train`` before Ray starts, even with
``y`` waiting on stdin; only ``policy.trust_remote_code: true`` lets it load (with a warning).
Bad ``.gguf`` files are one line naming the file."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actors.checkpoints import PolicyPathError, RemoteCodeError, remote_code, resolve_policy_path
from actors.policy import build_tiny_policy, load_policy, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
EVIL = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import Qwen3Config as EvilConfig, Qwen3ForCausalLM as EvilModel
"""


@pytest.fixture
def evil(tmp_path):
    """(model folder with auto_map in config.json, the marker its code would write)."""
    folder = tmp_path / "evil-model"
    shutil.copytree(build_tiny_policy(), folder)
    marker = tmp_path / "MARKER"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig",
                          "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_every_loader_refuses_a_folder_with_auto_map_in_one_line(evil):
    folder, marker = evil
    for load in (load_policy, load_tokenizer, remote_code):
        with pytest.raises(RemoteCodeError) as e:
            load(folder)
        line = _one_line(str(e.value))
        assert f"{folder / 'config.json'}: auto_map names code" in line
        assert "policy.trust_remote_code=true" in line
    assert not marker.exists()


def test_transformers_itself_is_told_no_explicitly(evil):
    """The flag every load passes: even past our check, transformers never runs the folder's
    code (a known ``model_type`` loads transformers' own class; an unknown one is refused)."""
    from transformers import AutoConfig

    folder, marker = evil
    assert type(AutoConfig.from_pretrained(folder, trust_remote_code=False)).__name__ == \
        "Qwen3Config"
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoConfig.from_pretrained(folder, trust_remote_code=False)
    assert not marker.exists()


def test_auto_map_in_the_tokenizer_config_is_refused_naming_that_file(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(build_tiny_policy(), folder)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    with pytest.raises(RemoteCodeError, match="tokenizer_config.json: auto_map names code"):
        load_tokenizer(folder)


def test_trusting_the_folder_is_explicit_and_logged(evil, caplog):
    folder, marker = evil
    with caplog.at_level(logging.WARNING, logger="actors.checkpoints"):
        assert remote_code(folder, trust=True) is True
    assert "policy.trust_remote_code is true" in caplog.text and "evil.EvilModel" in caplog.text
    assert remote_code(build_tiny_policy()) is False   # a plain folder: False, explicitly


def test_a_broken_config_is_one_line(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("[" * 100_000)
    with pytest.raises(PolicyPathError, match="config.json: not valid JSON"):
        remote_code(folder)
    (folder / "config.json").write_text("[1]")
    with pytest.raises(PolicyPathError, match="config.json: not a JSON object"):
        remote_code(folder)


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO), "ENVSCHED_CACHE": os.environ.get(
        "ENVSCHED_CACHE", str(REPO / ".cache"))}
    return subprocess.run([sys.executable, "-m", "launch.cli", *args], input=b"y\n",
                          capture_output=True, cwd=cwd, env=env, timeout=300)


def test_rollout_with_yes_on_stdin_refuses_before_ray_and_runs_nothing(evil, tmp_path):
    """``printf 'y\\n' | envsched rollout --engine hf --model DIR``."""
    from envs.generator import generate_pool

    folder, marker = evil
    pool = generate_pool(tmp_path / "pool", 1, 1, 0)
    done = _cli(["rollout", "--pool", str(pool), "--engine", "hf", "--model", str(folder)],
                tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    line = _one_line(err)
    assert line.startswith(f"envsched rollout: error: --model {folder}: {folder}/config.json: "
                           "auto_map names code"), line
    assert not marker.exists()
    # the engine kwarg cannot switch it on behind the flag's back
    done = _cli(["rollout", "--pool", str(pool), "--engine", "hf", "--model", str(folder),
                 "--set", "engine_kwargs.trust_remote_code=true"], tmp_path)
    assert done.returncode == 2 and "follows --trust-remote-code" in _one_line(
        done.stderr.decode())
    assert not marker.exists()


def test_train_with_yes_on_stdin_refuses_before_ray(evil, tmp_path):
    folder, marker = evil
    done = _cli(["train", "--out", str(tmp_path / "run"), f"policy.path={folder}",
                 "policy.engine=hf", "run.steps=1"], tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert f"{folder}/config.json: auto_map names code" in _one_line(err)
    assert not marker.exists() and not (tmp_path / "run" / "pool").exists()


def test_the_config_key_is_the_one_switch():
    from launch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.engine_kwargs.trust_remote_code would run code "
                                          "from the model folder; it follows "
                                          "policy.trust_remote_code"):
        load_config(None, ["policy.engine=hf", "rollout.engine_kwargs.trust_remote_code=true"])
    with pytest.raises(ConfigError, match="learner.trust_remote_code follows"):
        load_config(None, ["learner.trust_remote_code=true"])
    cfg = load_config(None, ["policy.engine=hf", "policy.trust_remote_code=true"])
    assert cfg.engine_kwargs()["trust_remote_code"] is True
    assert cfg.learner_settings().trust_remote_code is True
    assert "trust_remote_code" not in cfg.rollout.engine_kwargs   # the sections as given
    again = load_config(None, ["policy.engine=hf", "policy.trust_remote_code=true",
                               "rollout.engine_kwargs.trust_remote_code=true"])
    assert again.engine_kwargs() == cfg.engine_kwargs()   # a saved config reloads
    plain = load_config(None, ["policy.engine=hf"])
    assert "trust_remote_code" not in plain.engine_kwargs()
    assert plain.learner_settings().trust_remote_code is False


@pytest.mark.parametrize("content, says", [
    (b"", "empty file, not a GGUF model"),
    (b"PK\x03\x04 not a gguf at all" * 10, "not a GGUF file (it starts with b'PK\\x03\\x04'"),
    (b"GGUF\x03\x00", "truncated GGUF file (6 bytes"),
    (b"GGUF" + (3).to_bytes(4, "little") + (2 ** 40).to_bytes(8, "little") * 2 + b"\x00" * 64,
     "not a usable GGUF model"),
])
def test_a_bad_gguf_is_one_line_naming_the_file(tmp_path, monkeypatch, content, says):
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(content)
    with pytest.raises(PolicyPathError) as e:
        resolve_policy_path(gguf)
    line = _one_line(str(e.value))
    assert line.startswith(str(gguf)) and says in line, line
    assert not list((tmp_path / "cache").glob("models/*/config.json"))
