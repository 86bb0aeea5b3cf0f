"""EnvSched's first batch, from static structure only: Appendix C's cold start.

One representative per environment, the task with the highest mean within-environment S_full
(more environments than B: B representatives chosen greedily by global novelty 1 - max S_full to
those already chosen); the remaining slots by novelty = 0.5 (1 - max S_full to the batch) + 0.5
(1 - max S_full to the batch's tasks of the same environment), at most ``cold_start_env_cap`` (2)
tasks per environment (relaxed, with a note, if B cannot be filled so). The equal 0.5 / 0.5 mix is
our choice. Ranked with Eq. 5's machinery (``scheduling.penalty``).

May import: numpy, the standard library, scheduling.base, scheduling.config, scheduling.penalty.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from scheduling.base import SchedulerError, Selection
from scheduling.config import EnvSchedConfig
from scheduling.penalty import BatchPenalty, penalised_argmax, sort_desc


def cold_start_batch(graph: Any, eligible: np.ndarray, cfg: EnvSchedConfig,
                     tiebreak: Optional[np.ndarray] = None) -> tuple[list[Selection], list[str]]:
    """Appendix C initialisation from static structure only (module docstring)."""
    notes: list[str] = []
    tb = np.arange(graph.n) if tiebreak is None else tiebreak
    mean_sim = graph.mean_within_similarity()
    reps = []
    for members in graph.env_members:
        members = members[eligible[members]]
        if members.size:
            reps.append(int(members[np.lexsort((tb[members], -mean_sim[members]))[0]]))
    reps_arr = np.array(reps, dtype=np.int64)
    B = cfg.batch_size
    if reps_arr.size >= B:
        batch: list[int] = []
        novelty = np.ones(reps_arr.size)
        sub = SimpleNamespace(X_full=graph.X_full[reps_arr], n=reps_arr.size)   # local indices
        penalty = BatchPenalty(sub, B)
        for _ in range(B):
            cands = sort_desc(np.flatnonzero(novelty > -np.inf), novelty, tb[reps_arr])
            k, _ = penalised_argmax(cands, novelty, penalty, 1.0)
            batch.append(k)
            penalty.add(k)
            novelty[k] = -np.inf
        chosen = [int(reps_arr[k]) for k in batch]
        return [_cold(graph, i, r, {"representative": 1.0}) for r, i in enumerate(chosen)], notes
    return _cold_fill(graph, reps, eligible, mean_sim, cfg, notes, tb), notes


def _cold(graph: Any, i: int, rank: int, scores: dict[str, float]) -> Selection:
    return Selection(task_id=graph.task_ids[i], phase="cold-start", rank=rank, scores=scores)


def _cold_fill(graph: Any, reps: list[int], eligible: np.ndarray, mean_sim: np.ndarray,
               cfg: EnvSchedConfig, notes: list[str], tb: np.ndarray) -> list[Selection]:
    out = [_cold(graph, i, r, {"representative": 1.0, "mean_within_similarity":
                               float(mean_sim[i])}) for r, i in enumerate(reps)]
    taken = np.zeros(graph.n, dtype=bool)
    taken[reps] = True
    env_count = np.bincount(graph.env_of[reps], minlength=len(graph.env_members))
    gmax = np.zeros(graph.n)
    emax = np.zeros(graph.n)
    for j in reps:
        _absorb(graph, j, gmax, emax)
    cap = cfg.cold_start_env_cap
    while len(out) < cfg.batch_size:
        ok = eligible & ~taken & (env_count[graph.env_of] < cap)
        if not ok.any():
            if not (eligible & ~taken).any():
                raise SchedulerError(f"cold start: only {len(out)} eligible tasks, B = "
                                     f"{cfg.batch_size}")
            cap += 1
            notes.append(f"cold start: environment cap raised to {cap} to fill B")
            continue
        nov = 0.5 * (1.0 - gmax) + 0.5 * (1.0 - emax)
        i = int(sort_desc(np.flatnonzero(ok), nov, tb)[0])
        out.append(_cold(graph, i, len(out), {"novelty": float(nov[i]),
                                               "global_novelty": float(1.0 - gmax[i]),
                                               "within_novelty": float(1.0 - emax[i])}))
        taken[i] = True
        env_count[graph.env_of[i]] += 1
        _absorb(graph, i, gmax, emax)
    return out


def _absorb(graph: Any, j: int, gmax: np.ndarray, emax: np.ndarray) -> None:
    """Update max-similarity-to-batch (global and same-environment) after adding task j."""
    s = np.asarray((graph.X_full @ graph.X_full[j].T).todense()).ravel()
    np.maximum(gmax, s, out=gmax)
    members = graph.env_members[graph.env_of[j]]
    emax[members] = np.maximum(emax[members], s[members])

