"""The static dual-relation graph: Eq. 1 with Appendix D's views and weights, the abstract view,
candidate lists, the cache, and errors."""

from __future__ import annotations

import numpy as np
import pytest

from envs.spec import Check, Environment, TaskSpec
from scheduling.abstraction import abstract_text
from scheduling.graph import DualGraph, GraphConfig, GraphError, content_hash
from scheduling.views import VIEW_WEIGHTS, encode, make_vectorizer


def _env(env_id: str, tools: tuple[str, ...] = ("get_item",)) -> Environment:
    return Environment(env_id=env_id, class_name="C", source="class C: pass", tools=[
        {"type": "function", "function": {"name": t, "parameters": {"type": "object",
                                                                     "properties": {}}}}
        for t in tools])


def _task(tid: str, env: str, instruction: str, check_desc: str = "record is right",
          **kw) -> TaskSpec:
    return TaskSpec(task_id=tid, env_id=env, instruction=instruction,
                    initial_state={"items": {"I-1": {"label": "zzz"}}},
                    checks=[Check(check_id="c1", description=check_desc,
                                  code="def check_func(final_state):\n    return True")], **kw)


def test_word_view_cosine_matches_hand_computed_tfidf():
    # two documents: idf(alpha) = ln(3/3) + 1 = 1, every other term ln(3/2) + 1 = 1.405465;
    # cos = 1 / (1 + 2 * 1.405465^2) = 1 / 4.950664 = 0.201993
    X = encode(["alpha beta", "alpha gamma"], make_vectorizer("instruction_words", 35000, 1, True))
    assert float((X[0] @ X[1].T).toarray()[0, 0]) == pytest.approx(0.201993, abs=1e-6)


def test_s_full_is_the_weighted_sum_of_view_cosines():
    # t1, t2 share every view except the two instruction views (disjoint words and characters):
    # S_full = 1 - 0.28 - 0.08 = 0.64. t1, t3 differ only in the verifier-check text: 1 - 0.16.
    tasks = [_task("t1", "e", "qqq www"), _task("t2", "e", "xxx yyy"),
             _task("t3", "e", "qqq www", check_desc="totally different words")]
    g = DualGraph.build(tasks, {"e": _env("e")})
    assert g.sim_full(0, [0, 1, 2]) == pytest.approx([1.0, 0.64, 0.84], abs=1e-6)
    assert sum(VIEW_WEIGHTS) == pytest.approx(1.0)
    # the lists hold the same numbers, descending
    assert g.within_idx[0].tolist() == [2, 1]
    assert g.within_sim[0] == pytest.approx([0.84, 0.64], abs=1e-6)
    assert g.within_complete.all()


def test_mean_within_similarity_for_cold_start():
    tasks = [_task("t1", "e", "qqq www"), _task("t2", "e", "xxx yyy"),
             _task("t3", "e", "qqq www", check_desc="totally different words"),
             _task("t4", "f", "alone here")]
    g = DualGraph.build(tasks, {"e": _env("e"), "f": _env("f")})
    s12, s13 = g.sim_full(0, [1, 2])
    s23 = g.sim_full(1, [2])[0]
    assert g.mean_within_similarity() == pytest.approx(
        [(s12 + s13) / 2, (s12 + s23) / 2, (s13 + s23) / 2, 0.0], abs=1e-6)


def test_abstraction_follows_appendix_e_example():
    # "update user Alice's status to active":
    # [lookup(get_user_by_name, input=Alice), update(set_user_status, target=user_id, value=active)]
    desc = {"operations": [
        {"op_id": "op0", "type": "lookup", "tool": "get_user_by_name", "entity": "user",
         "arguments": [{"name": "name", "value": "Alice", "category": "<name>"}]},
        {"op_id": "op1", "type": "update", "tool": "set_user_status", "entity": "user",
         "arguments": [{"name": "user_id", "value": "u1", "category": "<id>"},
                       {"name": "status", "value": "active", "category": "<string>"}]}],
        "dependencies": [{"source": "op0", "target": "op1"}],
        "gates": [{"gate_id": "g0", "kind": "identifier_resolution",
                   "provenance": "unique_lookup", "blocks": ["op1"]}],
        "reward_groups": [{"group_id": "r0", "relation": "shared_gate", "checks": ["a", "b"],
                           "controller": "g0"}], "conflicts": []}
    text = abstract_text(desc)
    assert text == ("ops:2 lookup(type=entity_by_name) lookup.value=<name> "
                    "update(type=entity_field) update.value=<string> dep:lookup>update "
                    "gate:identifier_resolution:unique_lookup gate:identifier_resolution>update "
                    "gates:1 group:shared_gate:gate group:shared_gate:size=2")
    for concrete in ("Alice", "user", "status", "active", "get_user", "u1"):
        assert concrete not in text


def test_same_shape_in_different_domains_is_a_cross_edge(tmp_path):
    from envs.spec import ToolCall

    def op_task(tid, env, lookup, update, who, field):
        return _task(tid, env, f"set {who}'s {field} to open", reference_solution=[
            ToolCall(name=lookup, arguments={"name": who}),
            ToolCall(name=update, arguments={f"{env}_id": f"{env[0].upper()}-1", field: "open"})])

    tasks = [op_task("h1", "hotel", "get_guest_by_name", "set_guest_tier", "Ann", "tier"),
             op_task("c1", "clinic", "fetch_patient_by_name", "update_patient_ward", "Bo", "ward"),
             _task("c2", "clinic", "list everything", reference_solution=[
                 ToolCall(name="list_wards", arguments={})])]
    envs = {"hotel": _env("hotel"), "clinic": _env("clinic")}
    g = DualGraph.build(tasks, envs)
    assert g.sim_abs(0, [1])[0] == pytest.approx(1.0, abs=1e-6)
    assert g.sim_abs(0, [2])[0] < 0.5
    assert g.cross_idx[0].tolist() == [1, 2] and g.cross_idx[1].tolist() == [0, -1]
    assert g.cross_complete.all()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from envs.generator import generate_pool
    from envs.pool import load_pool

    return load_pool(generate_pool(tmp_path_factory.mktemp("pool") / "p", 5, 10, seed=3))


@pytest.fixture(scope="module")
def graph(pool):
    return DualGraph.build(pool.tasks, pool.environments, GraphConfig(within_candidates=4,
                           cross_candidates=5), state_of=pool.initial_state)


def _dense(graph, relation):
    X = graph.X_full if relation == "within" else graph.X_abs
    return (X @ X.T).toarray()


def test_candidate_lists_are_the_exact_top_of_their_relation(graph):
    same = graph.env_of[:, None] == graph.env_of[None, :]
    for rel, mask in (("within", same & ~np.eye(graph.n, dtype=bool)), ("cross", ~same)):
        S = _dense(graph, rel)
        idx, sim = getattr(graph, f"{rel}_idx"), getattr(graph, f"{rel}_sim")
        for i in range(graph.n):
            want = np.sort(S[i][mask[i]])[::-1][:idx.shape[1]]
            assert sim[i] == pytest.approx(want, abs=1e-5), (rel, i)
            assert mask[i, idx[i]].all() and (np.diff(sim[i]) <= 1e-7).all()
            assert S[i, idx[i]] == pytest.approx(sim[i], abs=1e-5)
        assert not getattr(graph, f"{rel}_complete").any()


def test_x_full_rows_combine_six_unit_views(graph):
    # each non-empty view contributes alpha_a to ||x_i||^2 (Eq. 1 with i = j)
    norms = np.asarray(graph.X_full.multiply(graph.X_full).sum(axis=1)).ravel()
    assert norms == pytest.approx(np.ones(graph.n), abs=1e-5)
    assert graph.info["description_sources"] == {"static": graph.n}


def test_cache_round_trip_and_stale_detection(graph, pool, tmp_path):
    path = graph.save(tmp_path / "g.npz")
    cfg = graph.config
    h = content_hash(pool.tasks, pool.environments, cfg)
    assert graph.content_hash == h
    g2 = DualGraph.load(path, expected_hash=h)
    assert g2.task_ids == graph.task_ids and g2.env_ids == graph.env_ids
    for name in ("within_idx", "within_sim", "cross_idx", "cross_sim", "env_of", "abs_group"):
        assert np.array_equal(getattr(g2, name), getattr(graph, name)), name
    assert (g2.X_full != graph.X_full).nnz == 0 and g2.config == cfg
    changed = [pool.tasks[0].model_copy(update={"instruction": "something else"})] + pool.tasks[1:]
    stale = content_hash(changed, pool.environments, cfg)
    assert stale != h
    with pytest.raises(GraphError, match="stale graph cache"):
        DualGraph.load(path, expected_hash=stale)
    with pytest.raises(GraphError, match="no graph cache"):
        DualGraph.load(tmp_path / "missing.npz")


def test_bad_input_is_named():
    with pytest.raises(GraphError, match="task t1: unknown env_id 'nope'"):
        DualGraph.build([_task("t1", "nope", "x")], {"e": _env("e")})
    with pytest.raises(GraphError, match="the weights parameter of GraphConfig"):
        GraphConfig(weights=(1.0, 2.0))
    with pytest.raises(GraphError, match="the cross_candidates parameter"):
        GraphConfig(cross_candidates=0)


def test_graph_build_command_prints_size_and_writes_the_cache(pool, tmp_path, capsys):
    from launch.cli import main

    out = tmp_path / "graph.npz"
    assert main(["graph", "build", "--pool", str(pool.root), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"nodes {len(pool.tasks)}" in text and "seconds" in text
    assert DualGraph.load(out).n == len(pool.tasks)
    assert main(["graph", "build", "--pool", str(tmp_path / "nowhere")]) == 2
    assert "not a pool directory" in capsys.readouterr().err


def test_from_pool_reuses_a_fresh_cache_and_rebuilds_a_stale_one(pool, graph, tmp_path):
    cache = tmp_path / "g.npz"
    cfg = graph.config
    built = DualGraph.from_pool(pool, cfg, cache)
    assert cache.is_file() and built.content_hash == graph.content_hash
    assert DualGraph.from_pool(pool, cfg, cache).info == built.info  # loaded, not rebuilt
    other = DualGraph.from_pool(pool, GraphConfig(within_candidates=3, cross_candidates=5), cache)
    assert other.within_idx.shape[1] == 3 and DualGraph.load(cache).within_idx.shape[1] == 3


def test_initial_context_holds_the_records_the_instruction_names():
    from scheduling.views import context_text

    state = {"users": {"U-1": {"name": "Ann Lee", "status": "active"},
                       "U-2": {"name": "Bo Chan", "status": "active"},
                       "U-3": {"name": "Cy Dorn", "status": "active"}}, "today": "2024-01-01"}
    text = context_text(_task("t", "e", "Set Ann Lee's status to active; leave U-3 alone."),
                        state, {})
    lines = text.splitlines()
    assert lines[0] == "users today"
    assert "users name Ann Lee status active" in lines
    assert "users name Cy Dorn status active" in lines
    assert not any("Bo Chan" in line for line in lines)  # "active" is common: it names no record
