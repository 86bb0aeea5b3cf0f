"""Published-format pools built from a generated one, for the simulator's four-world comparison
(docs/simulator.md), with the generator's truth kept beside them (``truth.jsonl``) to score the
inferred world against.

- ``to_envscaler(src, out_dir)``: EnvScaler's published JSON (environment and RL-scenario files,
  no reference solutions, no metadata), imported with ``envsched pool import --format envscaler``.
- ``to_tau_shape(src, out_dir, n_envs)``: a tau-bench-shaped pool: the first ``n_envs``
  environments' tasks, each with ONE check passing only if all of its checks pass (binary reward),
  reference solutions kept, no metadata.

    python -m envs.generator.reshape envscaler SRC_POOL OUT_DIR
    python -m envs.generator.reshape tau SRC_POOL OUT_DIR [N_ENVS]

May import: envs.pool, envs.spec, the standard library.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from envs.pool import load_pool, write_pool
from envs.spec import Check, PoolMeta

TRUTH_FILE = "truth.jsonl"


def _truth(out: Path, tasks) -> None:
    with open(out / TRUTH_FILE, "w") as f:
        for t in tasks:
            f.write(json.dumps({"task_id": t.task_id, "metadata": t.metadata}) + "\n")


def to_envscaler(src: str | Path, out_dir: str | Path) -> Path:
    pool, out = load_pool(src), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    envs = [{"env_id": e.env_id, "env_class_name": e.class_name, "env_class_code": e.source,
             "tools": e.tools, "environment_introduction": e.introduction,
             "constraints_rules": e.rules, "environment_summary": e.domain}
            for e in pool.environments.values()]
    tasks = [{"env_id": t.env_id, "env_class_name": pool.environments[t.env_id].class_name,
              "task_id": t.task_id, "task": t.instruction,
              "init_config": json.dumps(pool.initial_state(t)),
              "checklist": [c.description for c in t.checks],
              "checklist_with_func": [{"check_item": c.description, "check_func": c.code}
                                      for c in t.checks]} for t in pool.tasks]
    (out / "EnvScaler-191-Env.json").write_text(json.dumps(envs))
    (out / "EnvScaler-RL-Scenario.json").write_text(json.dumps(tasks))
    _truth(out, pool.tasks)
    return out


def all_of(checks: list[Check]) -> Check:
    """One check that passes only if every one of ``checks`` passes."""
    parts = []
    for k, c in enumerate(checks):
        parts.append(re.sub(r"^def check_func\(", f"def _check_{k}(", c.code, count=1,
                            flags=re.M))
    names = ", ".join(f"_check_{k}" for k in range(len(checks)))
    body = (f"def check_func(final_state):\n"
            f"    return all(f(final_state) is True for f in ({names},))\n")
    return Check(check_id="c1", description="all of: " + "; ".join(c.description for c in checks),
                 code="\n".join(parts) + "\n" + body)


def to_tau_shape(src: str | Path, out_dir: str | Path, n_envs: int = 2) -> Path:
    pool = load_pool(src)
    keep = sorted(pool.environments)[:n_envs]
    tasks = [t.model_copy(update={"checks": [all_of(t.checks)], "metadata": {}})
             for t in pool.tasks if t.env_id in keep]
    states = {t.initial_state_ref: pool.initial_state(t) for t in tasks if t.initial_state_ref}
    meta = PoolMeta(name=f"tau-shaped-{len(tasks)}", version="1", licence="Apache-2.0",
                    source=f"envsched reshape of {src}", adapter="builtin",
                    description="binary reward (all checks), gold actions, no metadata")
    out = write_pool(out_dir, meta, [pool.environments[e] for e in keep], tasks, states)
    _truth(Path(out), [t for t in pool.tasks if t.env_id in keep])
    return out


if __name__ == "__main__":
    kind, src, dst = sys.argv[1:4]
    if kind == "envscaler":
        print(to_envscaler(src, dst))
    else:
        print(to_tau_shape(src, dst, int(sys.argv[4]) if len(sys.argv) > 4 else 2))
