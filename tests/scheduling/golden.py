"""Golden selection trace of EnvSched, recorded before the performance work.

``trace(graph, steps)`` runs EnvSched on a graph with a fixed synthetic reward process (task i's
K = 8 rewards at step s are Bernoulli(p_i) draws from ``default_rng([seed, i, s])``, p_i ~ Beta(0.7,
0.7) from the seed) and returns, per step, the selected task ids and phases in batch order, the
selected tasks' q and penalty, q at a fixed sample of tasks and sum(q). Recording it and comparing
later (tests/scheduling/test_golden.py) proves an optimisation changed no selection.

    python -m tests.scheduling.golden      # (re)writes tests/scheduling/data/golden_trace.json
Only rewrite the fixture from a version whose selections are known to be the reference ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "golden_trace.json"
FAKE = {"n_envs": 40, "tasks_per_env": 30, "seed": 3, "steps": 30}
REAL = {"n_envs": 17, "tasks_per_env": 6, "seed": 0, "steps": 12}


def trace(graph, steps: int, seed: int = 0, tasks=None) -> list[dict]:
    from scheduling.base import GroupResult, TaskInfo
    from scheduling.config import EnvSchedConfig
    from scheduling.envsched import EnvSched

    if tasks is None:
        tasks = [TaskInfo(t, graph.env_ids[graph.env_of[i]], t, ())
                 for i, t in enumerate(graph.task_ids)]
    s = EnvSched(tasks, graph, EnvSchedConfig())
    p = np.random.default_rng(seed).beta(0.7, 0.7, graph.n)
    sample = np.random.default_rng(seed + 1).choice(graph.n, size=min(40, graph.n), replace=False)
    out = []
    for step in range(steps):
        batch = s.select(step)
        rec = {"step": step, "ids": list(batch.task_ids),
               "phases": [x.phase for x in batch.selections],
               "penalty": [x.scores.get("penalty", 0.0) for x in batch.selections],
               "notes": list(batch.notes)}
        pred = s.prediction
        if pred is not None:
            rec["q_sel"] = [float(pred.q[graph.index[t]]) for t in batch.task_ids]
            rec["q_sample"] = [float(v) for v in pred.q[sample]]
            rec["q_sum"] = float(pred.q.sum())
        out.append(rec)
        for tid in batch.task_ids:
            i = graph.index[tid]
            r = (np.random.default_rng([seed, i, step]).random(8) < p[i]).astype(float)
            s.observe(step, GroupResult(tid, step, r))
    return out


def fake_graph():
    try:                                   # pytest puts tests/scheduling on sys.path
        from fakes import FakeGraph
    except ImportError:                    # python -m tests.scheduling.golden
        from tests.scheduling.fakes import FakeGraph
    return FakeGraph(FAKE["n_envs"], FAKE["tasks_per_env"], seed=FAKE["seed"])


def real_graph(tmp: Path):
    from envs.generator import generate_pool
    from envs.pool import load_pool
    from scheduling.graph import DualGraph

    generate_pool(tmp / "pool", REAL["n_envs"], REAL["tasks_per_env"], seed=REAL["seed"])
    pool = load_pool(tmp / "pool")
    return DualGraph.build(list(pool.tasks), pool.environments), list(pool.tasks)


def record() -> dict:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        g, tasks = real_graph(Path(d))
        real = trace(g, REAL["steps"], tasks=tasks)
    return {"fake": {"params": FAKE, "trace": trace(fake_graph(), FAKE["steps"])},
            "real": {"params": REAL, "trace": real}}


if __name__ == "__main__":
    DATA.write_text(json.dumps(record(), separators=(",", ":")))
    print(f"wrote {DATA} ({DATA.stat().st_size} bytes)")
