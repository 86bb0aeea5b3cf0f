"""The static dual-relation graph of Section 2.2 (Eq. 1, Appendix D), built once and cached.

    S_full(i, j) = sum_a alpha_a cos(h_i^(a), h_j^(a))      (six concrete views, scheduling.views)
    S_abs(i, j)  = cos(g_i, g_j)                             (abstract view, scheduling.abstraction)

Representation (never a dense N x N matrix):

- ``X_full`` (n, F) csr: the six L2-normalised TF-IDF views, view a scaled by sqrt(alpha_a) and
  concatenated, so ``X_full[i] @ X_full[j].T == S_full(i, j)``; ``X_abs`` (n, G) csr, L2-normalised,
  so ``X_abs[i] @ X_abs[j].T == S_abs(i, j)``. float32.
- Ranked candidate lists (``scheduling.candidates``): ``within_*`` (n, Lw) same-environment tasks by
  S_full, ``cross_*`` (n, Lc) other-environment tasks by S_abs; descending, ties by task index,
  padding -1 / 0.0; ``*_complete[i]`` says the list holds every candidate of row i.
- ``topk_observed`` reads the top-k observed neighbours (|N_in| <= K_within, |N_cross| <= K_cross)
  from the lists, recomputing exactly only rows whose list runs out; the cross answer is memoised
  per k and merged with up to MERGE_LIMIT new nodes (top-k(A + D) = top-k(top-k(A) + D)).

Decisions where the paper is silent: docs/graph.md.

``GraphConfig``, ``GraphError`` and ``content_hash`` live in ``scheduling.graph_config`` (so that
``scheduling.graph_io`` reads them without importing this module) and are re-exported here.

May import: numpy, scipy, scikit-learn, pydantic, the standard library, envs.spec, envs.opdesc,
envs.describe and the other scheduling modules (never Ray or torch).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import scipy.sparse as sp

from pydantic import ValidationError

from envs.describe import describe_task
from envs.opdesc import (Extractor, OpDescription, OpDescriptionError, check_against_task,
                         pool_descriptions)
from envs.spec import Environment, TaskSpec
from scheduling.abstraction import abstract_text
from scheduling import topk_kernel
from scheduling.candidates import (one_blas_thread, rank_cross, rank_within,
                                   topk_cross_vectorised)
from scheduling.graph_config import GraphConfig, GraphError, content_hash
from scheduling.graph_io import load_graph, save_graph
from scheduling.views import VIEW_NAMES, StateOf, encode, make_vectorizer, view_texts

MERGE_LIMIT = 1024  # newly observed nodes answered incrementally (else from the lists)
DENSE_ABS_LIMIT = 1 << 26  # entries (256 MiB float32) of the distinct abstract vectors
log = logging.getLogger(__name__)


@dataclass
class DualGraph:
    task_ids: list[str]
    env_ids: list[str]
    env_of: np.ndarray
    X_full: sp.csr_matrix
    X_abs: sp.csr_matrix
    abs_group: np.ndarray
    within_idx: np.ndarray
    within_sim: np.ndarray
    within_complete: np.ndarray
    cross_idx: np.ndarray
    cross_sim: np.ndarray
    cross_complete: np.ndarray
    config: GraphConfig = field(default_factory=GraphConfig)
    content_hash: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.n = len(self.task_ids)
        self.index = {t: k for k, t in enumerate(self.task_ids)}
        order = np.argsort(self.env_of, kind="stable")
        bounds = np.searchsorted(self.env_of[order], np.arange(len(self.env_ids) + 1))
        self.env_members = [order[bounds[e]:bounds[e + 1]] for e in range(len(self.env_ids))]
        first = np.unique(self.abs_group, return_index=True)[1]
        self._X_abs_groups = self.X_abs[first]
        if self._X_abs_groups.shape[0] * self._X_abs_groups.shape[1] <= DENSE_ABS_LIMIT:
            # the abstract vocabulary is small: dense BLAS products beat sparse x sparse ones
            self._X_abs_groups = self._X_abs_groups.toarray()
        self._mean_within: Optional[np.ndarray] = None
        # k -> cross answer, -1 - k -> within answer: (observed mask, idx, sim)
        self._topk_memo: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # --- building -------------------------------------------------------------------------

    @classmethod
    def build(cls, tasks: list[TaskSpec], environments: dict[str, Environment],
              config: Optional[GraphConfig] = None,
              op_descriptions: Optional[dict[str, dict]] = None, *,
              state_of: Optional[StateOf] = None,
              extractor: Optional[Extractor] = None) -> "DualGraph":
        """Encode the views, rank the candidates. ``state_of(task)`` resolves
        ``initial_state_ref`` (e.g. ``pool.initial_state``); without it such tasks get an empty
        initial-context view."""
        config = config or GraphConfig()
        t0 = time.perf_counter()
        env_ids = _check_tasks(tasks, environments)
        descs = {t.task_id: _description(t, environments[t.env_id], op_descriptions, extractor)
                 for t in tasks}
        t_desc = time.perf_counter()
        log.info("graph: %d operation descriptions in %.1f s", len(descs), t_desc - t0)
        texts = view_texts(tasks, descs, state_of)
        blocks = []
        for name, w in zip(VIEW_NAMES, config.weights):
            vec = make_vectorizer(name, config.max_features, config.min_df, config.sublinear_tf)
            blocks.append(encode(texts[name], vec) * np.float32(np.sqrt(w)))
        X_full = sp.csr_matrix(sp.hstack(blocks, format="csr"), dtype=np.float32)
        abstract = [abstract_text(descs[t.task_id]) for t in tasks]
        X_abs = encode(abstract, make_vectorizer("abstract", config.max_features, config.min_df,
                                                 config.sublinear_tf))
        _, abs_group = np.unique(np.array(abstract, dtype=object), return_inverse=True)
        t_enc = time.perf_counter()
        log.info("graph: views encoded in %.1f s (nnz %d, %d distinct abstract vectors)",
                 t_enc - t_desc, X_full.nnz, int(abs_group.max()) + 1)
        env_index = {e: k for k, e in enumerate(env_ids)}
        env_of = np.array([env_index[t.env_id] for t in tasks], dtype=np.int32)
        graph = cls(task_ids=[t.task_id for t in tasks], env_ids=env_ids, env_of=env_of,
                    X_full=X_full, X_abs=X_abs, abs_group=abs_group.astype(np.int32),
                    **_empty_lists(len(tasks), 0, 0), config=config,
                    content_hash=content_hash(tasks, environments, config, op_descriptions))
        graph._rank_candidates()
        t_end = time.perf_counter()
        graph.info = {"seconds_total": t_end - t0, "seconds_descriptions": t_desc - t0,
                      "seconds_encode": t_enc - t_desc, "seconds_candidates": t_end - t_enc,
                      "abstract_groups": int(abs_group.max()) + 1,
                      "description_sources": _count_sources(descs)}
        return graph

    @classmethod
    def from_pool(cls, pool: Any, config: Optional[GraphConfig] = None,
                  cache: Optional[str | Path] = None) -> "DualGraph":
        """Build over an ``envs.pool.Pool`` (shared initial states resolved; descriptions from an
        LLM pre-pass in ``POOL/op_descriptions.jsonl`` used when present), or load ``cache`` when
        it was built from the same content, descriptions and config; a fresh build is written
        there."""
        config = config or GraphConfig()
        tasks = list(pool.tasks)
        descs = pool_descriptions(pool)
        if cache is not None and Path(cache).is_file():
            expected = content_hash(tasks, pool.environments, config, descs)
            try:
                return cls.load(cache, expected_hash=expected)
            except GraphError as e:
                log.info("graph: rebuilding: %s", e)
        graph = cls.build(tasks, pool.environments, config, descs, state_of=pool.initial_state)
        if cache is not None:
            graph.save(cache)
        return graph

    def _rank_candidates(self) -> None:
        sizes = np.bincount(self.env_of, minlength=len(self.env_ids))
        Lw = int(min(self.config.within_candidates, sizes.max() - 1))
        Lc = int(min(self.config.cross_candidates, self.n - sizes.min()))
        lists = _empty_lists(self.n, Lw, Lc)
        for members in self.env_members:
            rank_within(self.X_full, members, members, Lw, lists["within_idx"],
                        lists["within_sim"])
        everyone = np.arange(self.n)
        rank_cross(self._X_abs_groups, self.abs_group, self.env_of, everyone, everyone, Lc,
                   lists["cross_idx"], lists["cross_sim"])
        lists["within_complete"] = (sizes[self.env_of] - 1) <= Lw
        lists["cross_complete"] = (self.n - sizes[self.env_of]) <= Lc
        for k, v in lists.items():
            setattr(self, k, v)

    # --- queries --------------------------------------------------------------------------

    def sim_full(self, i: int, js: np.ndarray) -> np.ndarray:
        """Exact S_full(i, j) for each j in ``js`` (Eq. 1)."""
        js = np.asarray(js, dtype=np.int64).ravel()
        return (self.X_full[js] @ self.X_full[int(i)].T).toarray().ravel()

    def sim_abs(self, i: int, js: np.ndarray) -> np.ndarray:
        """Exact S_abs(i, j) for each j in ``js`` (Eq. 1)."""
        js = np.asarray(js, dtype=np.int64).ravel()
        return (self.X_abs[js] @ self.X_abs[int(i)].T).toarray().ravel()

    def topk_observed(self, relation: str, observed: np.ndarray,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row's top-k observed neighbours of ``relation`` ("within" | "cross"):
        ``idx`` (n, k) int32 padded with -1, ``sim`` (n, k) float32 padded with 0."""
        if relation not in ("within", "cross"):
            raise GraphError(f"relation must be 'within' or 'cross', got {relation!r}")
        obs = np.asarray(observed, dtype=bool)
        if obs.shape != (self.n,):
            raise GraphError(f"observed must be a bool array of shape ({self.n},), "
                             f"got shape {obs.shape}")
        if not isinstance(k, (int, np.integer)) or k < 0:
            raise GraphError(f"k must be an int >= 0, got {k!r}")
        with one_blas_thread():             # machine-independent bits (candidates.py)
            out_idx, out_sim = self._topk(relation, obs, int(k))
        return out_idx.copy(), out_sim.copy()

    def _topk(self, relation: str, obs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if relation == "within":
            return self._within_update(obs, k)
        memo = self._topk_memo.get(k)
        if memo is not None and not (memo[0] & ~obs).any() and \
                int((obs & ~memo[0]).sum()) <= MERGE_LIMIT:
            out_idx, out_sim = self._cross_merge(memo, obs, k)
        else:
            out_idx, out_sim = self._topk_lists(relation, obs, k)
        self._topk_memo[k] = (obs.copy(), out_idx, out_sim)
        return out_idx, out_sim

    def reset_topk_memo(self) -> None:
        """Forget the memoised answers (the next call reads the lists)."""
        self._topk_memo.clear()

    def _within_update(self, obs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Within answer, recomputing only the rows of environments whose observed set changed.

        A row's within answer depends only on which tasks of its own environment are observed
        (its list and the exact fallback both stay inside the environment), so the other rows
        keep the memoised answer, which equals recomputing them.
        """
        memo = self._topk_memo.get(-1 - k)           # negative keys: within answers
        if memo is None:
            out_idx, out_sim = self._topk_lists("within", obs, k)
        else:
            changed = np.zeros(len(self.env_ids), dtype=bool)
            changed[self.env_of[memo[0] != obs]] = True
            out_idx, out_sim = memo[1].copy(), memo[2].copy()
            rows = np.flatnonzero(changed[self.env_of])
            if rows.size:
                out_idx[rows] = -1
                out_sim[rows] = 0.0
                self._topk_lists("within", obs, k, rows, (out_idx, out_sim))
        self._topk_memo[-1 - k] = (obs.copy(), out_idx, out_sim)
        return out_idx, out_sim

    def _topk_lists(self, relation: str, obs: np.ndarray, k: int,
                    rows: Optional[np.ndarray] = None,
                    out: Optional[tuple[np.ndarray, np.ndarray]] = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Read the candidate lists; rows that run out go to the exact fallback. With ``rows``,
        only those rows of ``out`` (full-size, their entries reset to padding) are filled."""
        idx, sim, complete = (getattr(self, f"{relation}_{x}") for x in ("idx", "sim",
                                                                          "complete"))
        sel = np.arange(self.n) if rows is None else rows
        if rows is not None:
            idx, sim, complete = idx[rows], sim[rows], complete[rows]
        if out is None:
            out = (np.full((self.n, k), -1, dtype=np.int32), np.zeros((self.n, k), np.float32))
        out_idx, out_sim = out
        found = topk_kernel.first_observed(idx, sim, obs, sel.astype(np.int64), k, out_idx,
                                           out_sim)
        env_obs = np.bincount(self.env_of[obs], minlength=len(self.env_ids))
        if relation == "within":
            avail = env_obs[self.env_of[sel]] - obs[sel]
        else:
            avail = int(obs.sum()) - env_obs[self.env_of[sel]]
        fb = sel[np.nonzero(~complete & (found < k) & (found < avail))[0]]
        if fb.size:
            self._exact_topk(relation, fb, obs, k, out_idx, out_sim)
        return out_idx, out_sim

    def _cross_merge(self, memo, obs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The previous cross answer merged with the newly observed nodes, on the rows whose
        k-th neighbour a new node can displace (or that have fewer than k)."""
        _, prev_idx, prev_sim = memo
        new = np.nonzero(obs & ~memo[0])[0]
        if new.size == 0 or k == 0:
            return prev_idx.copy(), prev_sim.copy()
        gram = np.ascontiguousarray(_gram_groups(self._X_abs_groups, self.abs_group[new]),
                                    dtype=np.float32)
        out_idx, out_sim = prev_idx.copy(), prev_sim.copy()
        topk_kernel.cross_merge(out_idx, out_sim, new.astype(np.int64), gram, self.abs_group,
                                self.env_of)
        return out_idx, out_sim

    def _exact_topk(self, relation: str, rows: np.ndarray, obs: np.ndarray, k: int,
                    out_idx: np.ndarray, out_sim: np.ndarray) -> None:
        out_idx[rows] = -1
        out_sim[rows] = 0.0
        if relation == "cross":
            topk_cross_vectorised(self._X_abs_groups, self.abs_group, self.env_of, rows,
                                  np.nonzero(obs)[0], k, out_idx, out_sim)
            return
        row_env = self.env_of[rows]
        for e in np.unique(row_env):
            members = self.env_members[e]
            rank_within(self.X_full, rows[row_env == e], members[obs[members]], k, out_idx,
                        out_sim)

    def mean_within_similarity(self) -> np.ndarray:
        """Mean S_full(i, j) over the other tasks j of i's environment (0 when i is alone)."""
        if self._mean_within is None:
            out = np.zeros(self.n)
            self_sim = np.asarray(self.X_full.multiply(self.X_full).sum(axis=1)).ravel()
            for members in self.env_members:
                if members.size < 2:
                    continue
                Xe = self.X_full[members]
                total = np.asarray(Xe.sum(axis=0), dtype=np.float64).ravel()
                dots = Xe @ total
                out[members] = (dots - self_sim[members]) / (members.size - 1)
            self._mean_within = out
        return self._mean_within

    def size(self) -> dict[str, Any]:
        arrays = [self.within_idx, self.within_sim, self.cross_idx, self.cross_sim,
                  self.env_of, self.abs_group]
        mats = [self.X_full, self.X_abs]
        nbytes = sum(a.nbytes for a in arrays) + sum(m.data.nbytes + m.indices.nbytes +
                                                     m.indptr.nbytes for m in mats)
        return {"nodes": self.n, "environments": len(self.env_ids),
                "features_full": self.X_full.shape[1], "features_abs": self.X_abs.shape[1],
                "nnz_full": int(self.X_full.nnz), "nnz_abs": int(self.X_abs.nnz),
                "abstract_groups": int(self._X_abs_groups.shape[0]),
                "within_list": int(self.within_idx.shape[1]),
                "cross_list": int(self.cross_idx.shape[1]),
                "within_complete": float(self.within_complete.mean()) if self.n else 0.0,
                "cross_complete": float(self.cross_complete.mean()) if self.n else 0.0,
                "bytes": int(nbytes)}

    # --- persistence ----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        return save_graph(self, Path(path))

    @classmethod
    def load(cls, path: str | Path, expected_hash: Optional[str] = None) -> "DualGraph":
        return load_graph(cls, Path(path), expected_hash)


def _gram_groups(Xu, groups: np.ndarray) -> np.ndarray:
    """(distinct abstract vectors) x (the given groups) similarities."""
    if isinstance(Xu, np.ndarray):
        return Xu @ Xu[groups].T
    return (Xu @ Xu[groups].T).toarray()


def _empty_lists(n: int, Lw: int, Lc: int) -> dict[str, np.ndarray]:
    return {"within_idx": np.full((n, Lw), -1, dtype=np.int32),
            "within_sim": np.zeros((n, Lw), dtype=np.float32),
            "within_complete": np.zeros(n, dtype=bool),
            "cross_idx": np.full((n, Lc), -1, dtype=np.int32),
            "cross_sim": np.zeros((n, Lc), dtype=np.float32),
            "cross_complete": np.zeros(n, dtype=bool)}


def _check_tasks(tasks: list[TaskSpec], environments: dict[str, Environment]) -> list[str]:
    if not tasks:
        raise GraphError("cannot build a graph over zero tasks")
    seen: set[str] = set()
    for t in tasks:
        if t.task_id in seen:
            raise GraphError(f"task {t.task_id}: duplicate task_id")
        seen.add(t.task_id)
        if t.env_id not in environments:
            raise GraphError(f"task {t.task_id}: unknown env_id {t.env_id!r} (known: "
                             f"{sorted(environments)[:10]})")
    return sorted({t.env_id for t in tasks})


def _description(task: TaskSpec, env: Environment, given: Optional[dict[str, dict]],
                 extractor: Optional[Extractor]) -> dict[str, Any]:
    """A description passed in (validated against the task), else ``describe_task``'s."""
    if given and task.task_id in given:
        try:
            desc = OpDescription.model_validate(given[task.task_id])
        except ValidationError as e:
            raise OpDescriptionError(f"task {task.task_id}: op_descriptions entry is invalid: "
                                     f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
        check_against_task(desc, task)
        return desc.model_dump()
    return describe_task(task, env, extractor).model_dump()


def _count_sources(descs: dict[str, dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in descs.values():
        out[d.get("source", "?")] = out.get(d.get("source", "?"), 0) + 1
    return out
