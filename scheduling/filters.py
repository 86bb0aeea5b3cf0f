"""EnvSched's progress filter (Appendix C); the identifier filter is scheduling/identifier_filter.py.

Training transitions are adjacent observations (s -> s') of the same task. A ridge predictor
estimates the later mean reward m' from x = (1, m, m^2, v, s, n_obs up to s, one-hot environment
category), fitted only on transitions completed before s'; a transition is *scorable* when that
fit has at least ``progress_min_fit`` transitions. Residual r = m' - pred, fused as in Eq. 4:
    est_i = (n_i rbar_i + lambda_s ref_i) / (n_i + lambda_s),
    ref_i = mean of (environment mean residual, mean of the neighbours' mean residuals)
(within and cross top-K observed neighbours; missing references dropped; 0 when none).
``progress_min_transitions`` scorable transitions and est <= 0 remove the task from exploitation
only. Our choices where the paper is silent: docs/scheduler.md, "Progress filter".

The filter is soft (Appendix C: it "temporarily excludes"): scheduling/batch.py relaxes it before
any hard cap.

May import: numpy, the standard library, scheduling.config, scheduling.estimator.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from scheduling.config import EnvSchedConfig
from scheduling.estimator import History


# ----------------------------------------------------------------------------- progress filter
def transitions(history: History, t: int) -> dict[str, np.ndarray]:
    """Adjacent observations of each task among those credited to steps < t."""
    task, step, y = history.arrays()
    keep = step < t
    task, step, y = task[keep], step[keep], y[keep]
    order = np.lexsort((np.arange(task.size), step, task))
    task, step, y = task[order], step[order], y[order]
    same = task[1:] == task[:-1]
    first = np.r_[True, ~same]
    run_start = np.maximum.accumulate(np.where(first, np.arange(task.size), 0))
    count = np.arange(task.size) - run_start + 1          # observations of the task up to here
    a, b = np.flatnonzero(same), np.flatnonzero(same) + 1
    return {"task": task[a], "m": y[a, 1], "v": y[a, 0], "step": step[a].astype(float),
            "count": count[a].astype(float), "target": y[b, 1], "done": step[b]}


def _features(tr: dict[str, np.ndarray], cat: np.ndarray, n_cat: int) -> np.ndarray:
    base = np.stack([np.ones_like(tr["m"]), tr["m"], tr["m"] ** 2, tr["v"], tr["step"],
                     tr["count"]], axis=1)
    onehot = np.zeros((base.shape[0], n_cat))
    onehot[np.arange(base.shape[0]), cat] = 1.0
    return np.hstack([base, onehot])


class RidgeCache:
    """Ridge residuals of earlier calls, reused exactly (``progress_estimates(cache=...)``).

    The residuals of transitions completed at step s depend only on transitions completed at steps
    <= s, so they are reused when s < t_prev and no observation added since is credited to a step
    <= s. Reused entries are the stored values, so results are bit-identical to recomputing.
    """

    def __init__(self) -> None:
        self.history: Optional[History] = None
        self.size = 0
        self.t = -1
        self.fits: dict[int, Optional[tuple[np.ndarray, np.ndarray]]] = {}

    def start(self, history: History, t: int) -> None:
        """Drop the entries the observations added since the last call may have changed."""
        if history is not self.history or history.size < self.size:
            self.fits, self.size, self.t = {}, 0, -1
        new = history.step[self.size:history.size]
        limit = min(self.t, int(new.min()) if new.size else self.t)
        self.fits = {s: f for s, f in self.fits.items() if s < limit}
        self.history, self.size, self.t = history, history.size, t


def ridge_residuals(tr: dict[str, np.ndarray], cat: np.ndarray, n_cat: int,
                    cfg: EnvSchedConfig, cache: Optional[RidgeCache] = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(residual, scorable) per transition; each fitted on transitions done at earlier steps."""
    X = _features(tr, cat, n_cat)
    y = tr["target"]
    resid = np.zeros(y.size)
    scorable = np.zeros(y.size, dtype=bool)
    pen = cfg.progress_ridge_alpha * np.eye(X.shape[1])
    pen[0, 0] = 0.0
    fits = cache.fits if cache is not None else {}
    for s in np.unique(tr["done"]).tolist():
        now = tr["done"] == s
        if s in fits:
            kept = fits[s]
            if kept is None:
                continue
            if np.array_equal(kept[0], tr["task"][now]):   # defensive: same transitions
                resid[now], scorable[now] = kept[1], True
                continue
        fit = tr["done"] < s
        if fit.sum() < cfg.progress_min_fit:
            fits[s] = None
            continue
        beta = np.linalg.solve(X[fit].T @ X[fit] + pen, X[fit].T @ y[fit])
        resid[now] = y[now] - X[now] @ beta
        scorable[now] = True
        fits[s] = (tr["task"][now].copy(), resid[now].copy())
    return resid, scorable


def progress_estimates(history: History, t: int, env_of: np.ndarray, category_of_env: np.ndarray,
                       neighbours: Sequence[np.ndarray], cfg: EnvSchedConfig,
                       cache: Optional[RidgeCache] = None) -> tuple[np.ndarray, np.ndarray]:
    """(estimate (n,), scorable transition count (n,)) as in the module docstring."""
    n = env_of.size
    if cache is not None:
        cache.start(history, t)
    tr = transitions(history, t)
    est, cnt = np.zeros(n), np.zeros(n, dtype=np.int64)
    if tr["task"].size == 0:
        return est, cnt
    n_cat = min(int(category_of_env.max()) + 1, cfg.progress_max_categories)
    cat = category_of_env[env_of[tr["task"]]] % cfg.progress_max_categories
    resid, ok = ridge_residuals(tr, cat, n_cat, cfg, cache)
    task, resid = tr["task"][ok], resid[ok]
    cnt = np.bincount(task, minlength=n)
    own = np.divide(np.bincount(task, weights=resid, minlength=n), cnt,
                    out=np.zeros(n), where=cnt > 0)
    env_cnt = np.bincount(env_of[task], minlength=int(env_of.max()) + 1)
    env_sum = np.bincount(env_of[task], weights=resid, minlength=env_cnt.size)
    refs, have = [], []
    refs.append(np.divide(env_sum, env_cnt, out=np.zeros(env_cnt.size), where=env_cnt > 0)[env_of])
    have.append(env_cnt[env_of] > 0)
    idx = np.hstack([nb for nb in neighbours]) if neighbours else np.zeros((n, 0), np.int32)
    valid = (idx >= 0) & (cnt[np.maximum(idx, 0)] > 0)
    nb_cnt = valid.sum(axis=1)
    refs.append(np.divide(np.where(valid, own[np.maximum(idx, 0)], 0.0).sum(axis=1), nb_cnt,
                          out=np.zeros(n), where=nb_cnt > 0))
    have.append(nb_cnt > 0)
    h = np.stack(have).astype(float)
    ref = np.divide((np.stack(refs) * h).sum(axis=0), h.sum(axis=0), out=np.zeros(n),
                    where=h.sum(axis=0) > 0)
    est = (cnt * own + cfg.lambda_s * ref) / (cnt + cfg.lambda_s)
    return est, cnt


def progress_blocked(est: np.ndarray, cnt: np.ndarray, cfg: EnvSchedConfig) -> np.ndarray:
    """Tasks removed from exploitation: >= min_transitions scorable and estimate <= 0."""
    return (cnt >= cfg.progress_min_transitions) & (est <= 0.0)
