"""``graph describe`` against a hostile endpoint and a planted cache (real HTTP servers on
threads, ``tests/servers/hostile_http.py``): an unusable reply falls back to the static extractor
for that task only, a cached answer is checked like a fresh one, bad CLI values are one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envs.generator import generate_pool
from envs.opdesc import read_descriptions
from envs.opdesc_llm import LLMDescriber, user_message
from envs.opdesc_static import static_description
from envs.pool import load_pool
from launch.cli import main as cli_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))

from hostile_http import Recorder, chat, reply, serve  # noqa: E402

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    return generate_pool(tmp_path_factory.mktemp("pool"), 1, 2, 0)


def _answer_for(pool, task) -> str:
    return json.dumps({k: v for k, v in static_description(
        task, pool.environment(task.env_id)).model_dump().items() if k != "source"})


def test_an_unusable_reply_falls_back_for_that_task_only(pool_dir, tmp_path):
    pool = load_pool(pool_dir)
    good, bad = pool.tasks
    good_msg = user_message(good, pool.environment(good.env_id), pool.initial_state(good))

    def respond(h):   # a valid answer for one task, JSON nested 200,000 deep for the other
        sent = json.loads(h.request_body)
        if sent["messages"][1]["content"] == good_msg:
            chat(_answer_for(pool, good))(h)
        else:
            reply(DEEP)(h)

    with serve(respond) as base:
        out = tmp_path / "d.jsonl"
        rc = cli_main(["graph", "describe", "--pool", str(pool_dir), "--endpoint", base,
                       "--model", "m", "--out", str(out), "--cache", str(tmp_path / "c.jsonl"),
                       "--retries", "0", "--no-progress"])
    assert rc == 0
    descs = read_descriptions(out)
    assert descs[good.task_id]["source"] == "llm" and descs[bad.task_id]["source"] == "static"


def test_a_planted_cache_line_is_checked_like_a_fresh_answer(pool_dir, tmp_path):
    pool = load_pool(pool_dir)
    task = pool.tasks[0]
    env = pool.environment(task.env_id)
    cache = tmp_path / "cache.jsonl"
    describer = LLMDescriber("http://127.0.0.1:9/v1", "m", cache_path=cache)
    key = describer._key(user_message(task, env, pool.initial_state(task)))
    planted = static_description(task, env).model_dump()
    planted["source"] = "llm"
    planted["reward_groups"][0]["checks"].append("no_such_check")
    cache.write_text("\n".join([
        json.dumps({"key": key, "task_id": task.task_id, "description": planted}),
        "[1, 2, 3]", '"a string"', json.dumps({"key": "k", "description": [1]}),
        json.dumps({"key": ["unhashable"], "description": {}}), "{" * 100_000]) + "\n")
    answers = {user_message(t, pool.environment(t.env_id), pool.initial_state(t)):
               _answer_for(pool, t) for t in pool.tasks}
    rec = Recorder()
    with serve(lambda h: chat(answers[json.loads(h.request_body)["messages"][1]["content"]])(h),
               rec) as base:
        again = LLMDescriber(base, "m", cache_path=cache, retries=0)
        descs, stats = again.describe_pool(pool, progress=False)
    assert stats.cached == 0 and stats.valid == 2    # both asked, the planted answer rejected
    assert len(rec.requests) == 2
    assert "no_such_check" not in json.dumps(descs[task.task_id])


@pytest.mark.parametrize("flag, value, says", [
    ("--concurrency", "0", "--concurrency must be >= 1, got 0"),
    ("--timeout", "0", "--timeout must be a positive number of seconds, got 0"),
    ("--timeout", "nan", "--timeout must be a positive number of seconds"),
    ("--retries", "-1", "--retries must be >= 0, got -1"),
    ("--max-tokens", "0", "--max-tokens must be >= 1, got 0"),
])
def test_bad_cli_values_are_one_line(pool_dir, capsys, flag, value, says):
    rc = cli_main(["graph", "describe", "--pool", str(pool_dir), "--endpoint",
                   "http://127.0.0.1:9/v1", "--model", "m", flag, value, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err
