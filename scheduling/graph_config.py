"""The dual-relation graph's config, its error, its cache format version and its content hash.

``GraphConfig`` holds Appendix D's static-representation constants plus the candidate-list sizes;
``content_hash(tasks, environments, config, op_descriptions)`` is the SHA-256 a cache is checked
against (``scheduling.graph_io``), so a cache built from other content or config is detected.

May import: the standard library, envs.spec, scheduling.views.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Optional

from envs.spec import Environment, TaskSpec
from scheduling.views import VIEW_NAMES, VIEW_WEIGHTS

FORMAT_VERSION = 1


class GraphError(ValueError):
    """Bad graph input, or a cache that does not match the pool."""


@dataclass(frozen=True)
class GraphConfig:
    """Appendix D's static-representation constants plus the candidate-list sizes."""

    weights: tuple[float, ...] = VIEW_WEIGHTS
    max_features: int = 35000
    min_df: int = 1
    sublinear_tf: bool = True
    within_candidates: int = 64
    cross_candidates: int = 96

    def __post_init__(self) -> None:
        w = tuple(float(x) for x in self.weights)
        if len(w) != len(VIEW_NAMES) or min(w) < 0 or sum(w) <= 0:
            raise GraphError(f"the weights parameter of GraphConfig must be {len(VIEW_NAMES)} "
                             f"non-negative numbers with a positive sum (views {VIEW_NAMES}), "
                             f"got {self.weights!r}")
        object.__setattr__(self, "weights", w)
        for name in ("max_features", "min_df", "within_candidates", "cross_candidates"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GraphError(f"the {name} parameter of GraphConfig must be an int >= 1, "
                                 f"got {v!r}")


def content_hash(tasks: list[TaskSpec], environments: dict[str, Environment],
                 config: GraphConfig, op_descriptions: Optional[dict[str, dict]] = None) -> str:
    """SHA-256 over everything the graph depends on (format version, config, pool content)."""
    h = hashlib.sha256(f"envsched-graph-v{FORMAT_VERSION}".encode())
    h.update(json.dumps(asdict(config), sort_keys=True).encode())
    for env_id in sorted({t.env_id for t in tasks}):
        env = environments[env_id]
        h.update(env.model_dump_json(include={"env_id", "tools", "introduction", "rules"}).encode())
    for t in tasks:
        h.update(t.model_dump_json().encode())
        if op_descriptions and t.task_id in op_descriptions:
            h.update(json.dumps(op_descriptions[t.task_id], sort_keys=True, default=str).encode())
    return h.hexdigest()
