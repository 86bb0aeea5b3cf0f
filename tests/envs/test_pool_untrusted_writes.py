"""Writes into a pool never follow a planted symlink: ``graph build`` (``graph.npz``) and ``graph
describe`` (``op_descriptions.jsonl``, ``.cache/`` and its answer cache) refuse a link at the
file or at a folder above it, naming the link, and the host file it points at is unchanged (or,
when missing, never created); what they do write is a regular file, put in place atomically.
Also: ``pool validate --workers N`` reaches the validator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import envs.validate
from broken_pools import good_pool
from envs.generator import generate_pool
from envs.opdesc import read_descriptions
from envs.opdesc_llm import LLMDescriber
from envs.pool import load_pool
from envs.untrusted import (UntrustedFileError, atomic_writer, open_for_append,
                            write_bytes_atomic)
from launch.cli import main
from scheduling.graph import DualGraph

HOST = "HOST FILE - must stay as it is\n"
SERVER = Path(__file__).resolve().parents[1] / "servers" / "scripted_openai_server.py"


@pytest.fixture(scope="module")
def built_pool(tmp_path_factory) -> Path:
    return generate_pool(tmp_path_factory.mktemp("gen") / "p", 2, 2, 0)


@pytest.fixture
def pool(built_pool, tmp_path) -> Path:
    """A fresh copy of a small generated pool, to plant links in."""
    return Path(shutil.copytree(built_pool, tmp_path / "pool"))


@pytest.fixture
def host(tmp_path) -> Path:
    """A folder outside the pool standing for the host, with one file in it."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "crontab").write_text(HOST)
    return d


def _host_unchanged(host: Path) -> None:
    assert sorted(p.name for p in host.iterdir()) == ["crontab"]
    assert (host / "crontab").read_text() == HOST


def _refused(capsys, argv: list[str], link: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"symlink {link} -> " in err and "refused" in err, err
    return err


@pytest.mark.parametrize("target", ["crontab", "missing"])
def test_graph_build_refuses_a_graph_npz_linked_to_a_host_file(pool, host, capsys, target):
    (pool / "graph.npz").symlink_to(host / target)
    err = _refused(capsys, ["graph", "build", "--pool", str(pool)], "graph.npz")
    assert str(host / target) in err and "nothing is written through a link" in err
    _host_unchanged(host)
    assert (pool / "graph.npz").is_symlink()


def test_graph_build_refuses_a_linked_folder_on_the_way_to_out(pool, host, capsys):
    (pool / ".cache").symlink_to(host)
    _refused(capsys, ["graph", "build", "--pool", str(pool), "--out",
                      str(pool / ".cache" / "graph.npz")], ".cache")
    _host_unchanged(host)


def test_graph_build_writes_a_regular_file_and_replaces_an_old_one(pool):
    for _ in range(2):
        assert main(["graph", "build", "--pool", str(pool), "--json"]) == 0
    path = pool / "graph.npz"
    assert path.is_file() and not path.is_symlink()
    assert DualGraph.load(path).n == len(load_pool(pool).tasks)
    assert not [p for p in os.listdir(pool) if p.endswith(".tmp")]


def test_describe_refuses_a_cache_folder_linked_to_the_host(pool, host, capsys, free_port):
    (pool / ".cache").symlink_to(host)
    _refused(capsys, ["graph", "describe", "--pool", str(pool), "--endpoint",
                      f"http://127.0.0.1:{free_port}/v1", "--model", "m", "--retries", "0",
                      "--no-progress"], ".cache")
    _host_unchanged(host)
    assert not (pool / "op_descriptions.jsonl").exists()


@pytest.mark.parametrize("target", ["crontab", "missing"])
def test_describe_refuses_op_descriptions_linked_to_a_host_file(pool, host, capsys, free_port,
                                                               target):
    (pool / "op_descriptions.jsonl").symlink_to(host / target)
    # nothing listens on free_port: every task falls back to the static extractor, then the
    # descriptions are written
    err = _refused(capsys, ["graph", "describe", "--pool", str(pool), "--endpoint",
                            f"http://127.0.0.1:{free_port}/v1", "--model", "m", "--retries",
                            "0", "--timeout", "2", "--no-progress"], "op_descriptions.jsonl")
    assert str(pool) in err
    _host_unchanged(host)


def test_describe_writes_its_descriptions_as_a_regular_file(pool, free_port):
    assert main(["graph", "describe", "--pool", str(pool), "--endpoint",
                 f"http://127.0.0.1:{free_port}/v1", "--model", "m", "--retries", "0",
                 "--timeout", "2", "--no-progress"]) == 0
    out = pool / "op_descriptions.jsonl"
    assert not out.is_symlink() and len(read_descriptions(out)) == len(load_pool(pool).tasks)


@pytest.fixture
def scripted_server(free_port):
    proc = subprocess.Popen([sys.executable, str(SERVER), str(free_port)])
    base = f"http://127.0.0.1:{free_port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield base
    finally:
        proc.kill()
        proc.wait(10)


def test_the_answer_cache_append_refuses_a_link_planted_after_it_was_read(pool, host,
                                                                          scripted_server):
    cache = pool / ".cache" / "op_descriptions_cache.jsonl"
    describer = LLMDescriber(scripted_server, "scripted", cache_path=cache, cache_root=pool,
                             retries=1)
    cache.parent.mkdir()
    cache.symlink_to(host / "crontab")
    with pytest.raises(UntrustedFileError, match=r"symlink \.cache/op_descriptions_cache\.jsonl "
                                                 r"-> .*crontab in the pool; refused"):
        describer.describe_pool(load_pool(pool), progress=False)
    _host_unchanged(host)


def test_the_answer_cache_is_read_through_the_bounded_reader(pool, host, caplog):
    cache = pool / ".cache" / "op_descriptions_cache.jsonl"
    cache.parent.mkdir()
    cache.write_text('{"key": "k1", "description": {"operations": []}}\n'
                     + "[" * 100 + "\n" + '{"key": NaN}\n\n')
    describer = LLMDescriber("http://127.0.0.1:9/v1", "m", cache_path=cache, cache_root=pool)
    assert describer._cache == {"k1": {"operations": []}}
    assert "op_descriptions_cache.jsonl:2" in caplog.text and ".jsonl:3" in caplog.text
    cache.unlink()
    cache.symlink_to(host / "crontab")
    with pytest.raises(UntrustedFileError, match="leaves the pool"):
        LLMDescriber("http://127.0.0.1:9/v1", "m", cache_path=cache, cache_root=pool)


def test_a_link_that_stays_inside_the_pool_is_refused_too(pool):
    (pool / "graph.npz").symlink_to(pool / "tasks.jsonl")
    before = (pool / "tasks.jsonl").read_bytes()
    with pytest.raises(UntrustedFileError, match="symlink graph.npz -> "):
        write_bytes_atomic(pool, "graph.npz", b"x")
    assert (pool / "tasks.jsonl").read_bytes() == before


def test_a_fifo_or_a_folder_at_the_destination_is_refused_without_blocking(pool):
    os.mkfifo(pool / "fifo")
    (pool / "dir").mkdir()
    with pytest.raises(UntrustedFileError, match="fifo: not a regular file"):
        open_for_append(pool, "fifo")
    with pytest.raises(UntrustedFileError, match="dir: a directory"):
        write_bytes_atomic(pool, "dir", b"x")


@pytest.mark.parametrize("rel", ["../outside", "a/../../outside", "/etc/x", ""])
def test_a_path_that_is_not_plainly_inside_the_tree_is_refused(pool, rel):
    with pytest.raises(UntrustedFileError, match="not a file path inside the pool"):
        write_bytes_atomic(pool, rel, b"x")
    assert not (pool.parent / "outside").exists()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(pool):
    (pool / "graph.npz").write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_writer(pool, "graph.npz") as f:
            f.write(b"half")
            raise RuntimeError("disk full")
    assert (pool / "graph.npz").read_bytes() == b"old"
    assert not [p for p in os.listdir(pool) if p.endswith(".tmp")]


def test_appends_create_folders_and_keep_earlier_lines(pool):
    for line in (b"a\n", b"b\n"):
        with open_for_append(pool, ".cache/deep/log.jsonl") as f:
            f.write(line)
    assert (pool / ".cache" / "deep" / "log.jsonl").read_bytes() == b"a\nb\n"


def test_pool_validate_workers_reaches_the_validator(tmp_path, monkeypatch, capsys):
    root = good_pool(tmp_path / "p")  # one environment: one worker by default
    started = []
    real = envs.validate.sandbox_runner

    def counting_runner():
        started.append(1)
        return real()

    monkeypatch.setattr(envs.validate, "sandbox_runner", counting_runner)
    assert main(["pool", "validate", str(root), "--workers", "2"]) == 0
    assert len(started) == 2
    assert main(["pool", "validate", str(root), "--workers", "0"]) == 2
    assert "--workers must be >= 1, got 0" in capsys.readouterr().err
