"""Saving and loading a ``DualGraph`` as one ``.npz`` of plain arrays (no pickle).

Layout: the csr components of ``X_full`` / ``X_abs`` (``*_data``, ``*_indices``, ``*_indptr``,
``*_shape``), the candidate lists, ``env_of``, ``abs_group``, ``task_ids`` / ``env_ids`` as unicode
arrays, and ``meta``: a JSON string with the format version, config, content hash and build info.
``load_graph(..., expected_hash)`` raises ``GraphError`` when the cache was built from other
content (a stale cache) or by another format version.

May import: numpy, scipy, the standard library, scheduling.graph_config (never scheduling.graph:
the graph class is passed in).
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import numpy as np
import scipy.sparse as sp

from scheduling.graph_config import FORMAT_VERSION, GraphConfig, GraphError

ARRAYS = ("env_of", "abs_group", "within_idx", "within_sim", "within_complete", "cross_idx",
          "cross_sim", "cross_complete")


def save_graph(graph, path: Path) -> Path:
    """Write ``graph`` to ``path`` (a run's own folder; a pool's cache goes through
    ``envs.untrusted.write_bytes_atomic`` with ``graph_bytes``, refusing planted links)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    tmp.write_bytes(graph_bytes(graph))
    tmp.replace(path)
    return path


def graph_bytes(graph) -> bytes:
    """The ``.npz`` of ``graph`` (the layout above), in memory."""
    out = {k: getattr(graph, k) for k in ARRAYS}
    for name in ("X_full", "X_abs"):
        m = getattr(graph, name)
        out.update({f"{name}_data": m.data, f"{name}_indices": m.indices,
                    f"{name}_indptr": m.indptr, f"{name}_shape": np.array(m.shape)})
    out["task_ids"] = np.array(graph.task_ids, dtype=str)
    out["env_ids"] = np.array(graph.env_ids, dtype=str)
    meta = {"format_version": FORMAT_VERSION, "config": asdict(graph.config),
            "content_hash": graph.content_hash, "info": graph.info}
    out["meta"] = np.array(json.dumps(meta))
    buf = io.BytesIO()
    np.savez(buf, **out)
    return buf.getvalue()


def load_graph(cls, path: Path, expected_hash: Optional[str] = None):
    if not path.is_file():
        raise GraphError(f"{path}: no graph cache there (build one with `envsched graph build`)")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise GraphError(f"{path}: not a graph cache ({e})") from None
    with z:
        meta = json.loads(str(z["meta"]))
        if meta.get("format_version") != FORMAT_VERSION:
            raise GraphError(f"{path}: graph format {meta.get('format_version')}, this code "
                             f"reads {FORMAT_VERSION}; rebuild it")
        if expected_hash is not None and meta["content_hash"] != expected_hash:
            raise GraphError(f"{path}: stale graph cache: built from other pool content or "
                             f"config (hash {meta['content_hash'][:12]} != {expected_hash[:12]}); "
                             "rebuild it")
        mats = {name: sp.csr_matrix((z[f"{name}_data"], z[f"{name}_indices"],
                                     z[f"{name}_indptr"]), shape=tuple(z[f"{name}_shape"]))
                for name in ("X_full", "X_abs")}
        arrays = {k: z[k] for k in ARRAYS}
        task_ids = [str(x) for x in z["task_ids"]]
        env_ids = [str(x) for x in z["env_ids"]]
    config = meta["config"]
    config["weights"] = tuple(config["weights"])
    return cls(task_ids=task_ids, env_ids=env_ids, **mats, **arrays,
               config=GraphConfig(**config), content_hash=meta["content_hash"],
               info=meta.get("info", {}))
