"""Difficulty controls of the builtin generator: pools sized to the policy that will train on them.

``Difficulty`` (all fields unset = today's pools, byte for byte):

- ``edits``: edits per task, as weights ``{n: w}`` over 1..4 (also written ``[1, 2]``, equal
  weights, or ``"1:0.7,2:0.3"`` / ``"1"``); unset: ``envs.generator.tasks.N_EDITS`` (1-4 at
  40/30/20/10 %).
- ``auth_share``: the share of tasks whose reference solution needs an authorised session (an
  edit behind the authorization gate). Spread evenly: task ``k`` of environment ``i`` is gated when
  ``floor((k + 1) s + u_i) > floor(k s + u_i)``, ``u_i`` a fixed per-environment offset
  (``gated``), so each environment holds its share to within one task and the pool's share is
  ``s`` up to rounding. A gated task's first edit is an authorised one (delete, suspend,
  reactivate, or a resource status change where the variant gates it); an ungated task has no
  authorised edit. Unset: whatever the drawn edits need (about 30 %).
- ``distractor_tools``: each environment exposes the tools its tasks' reference solutions call
  plus this many others of its variant (drawn from ``random.Random(f"{seed}:{i}:tools")``, so
  the tasks do not change); rules that name a tool no longer exposed are dropped with it (the
  environment's code keeps every method; the executor calls only exposed tools). Unset: all of
  the variant's tools (14-20).
- ``max_calls``: tasks whose reference solution takes more calls are redrawn (a policy's episode
  limit: a 2-turn episode cannot solve a 5-call task). Not one of the issue's four controls;
  added because the edits alone still leave 1-7 calls per one-edit task. Unset: no limit.
- ``schemas``: ``full`` (as today) or ``short``: each tool's description cut to its first clause
  and no parameter descriptions (names, types, enums and required stay).

The task metadata stays the latent truth: ``ops``, ``gates`` and ``difficulty`` are computed from
the calls each task really needs, whatever the settings. Decisions where the issue is silent: the
controls are per pool (not per environment); a non-default setting is written into
``pool.yaml``'s description (``describe``) so a pool says how it was made.

May import: pydantic and the standard library.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_EDITS = 4
_GOLDEN = (math.sqrt(5) - 1) / 2


class Difficulty(BaseModel):
    """How hard a generated pool is (module docstring); the default is today's generator."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edits: Optional[dict[int, float]] = Field(
        None, description="edits per task as weights {n: w}, n in 1..4 (or [1, 2] or "
        "'1:0.7,2:0.3'); null: 1-4 edits at 40/30/20/10 %")
    auth_share: Optional[float] = Field(
        None, ge=0, le=1, description="share of tasks behind the authorization gate; null: as "
        "the drawn edits need (~30 %)")
    distractor_tools: Optional[int] = Field(
        None, ge=0, description="tools per environment: those its tasks call plus this many "
        "others; null: all of the variant's 14-20 tools")
    max_calls: Optional[int] = Field(
        None, ge=1, description="redraw tasks whose reference solution takes more calls; "
        "null: no limit")
    schemas: Literal["full", "short"] = Field(
        "full", description="tool schema verbosity: full, or short (first clause, no parameter "
        "descriptions)")

    @field_validator("edits", mode="before")
    @classmethod
    def _edits(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, dict):  # keys may come back as strings from JSON
            try:
                out = {int(n): float(w) for n, w in v.items()}
            except (TypeError, ValueError):
                raise ValueError(f"edits must map counts to weights, got {v!r}") from None
        elif isinstance(v, int) and not isinstance(v, bool):
            out = {v: 1.0}
        elif isinstance(v, (list, tuple)):
            out = {n: 1.0 for n in v}
        elif isinstance(v, str):
            out = {}
            for part in (p.strip() for p in v.split(",") if p.strip()):
                n, _, w = part.partition(":")
                try:
                    out[int(n)] = float(w) if w else 1.0
                except ValueError:
                    raise ValueError(f"{part!r} is not N or N:WEIGHT (e.g. '1:0.7,2:0.3')"
                                     ) from None
        else:
            raise ValueError(f"edits must be N, a list of N or {{N: weight}}, got {v!r}")
        bad = [n for n in out if not isinstance(n, int) or not 1 <= n <= MAX_EDITS]
        if bad or not out or any(float(w) < 0 for w in out.values()) \
                or sum(float(w) for w in out.values()) <= 0:
            raise ValueError(f"counts must be in 1..{MAX_EDITS} with weights >= 0, not all 0; "
                             f"got {v!r}")
        return out

    @property
    def is_default(self) -> bool:
        return self == Difficulty()

    def describe(self) -> str:
        """The non-default settings, e.g. ``edits 1:1, auth_share 0, distractor_tools 1``."""
        parts = []
        if self.edits is not None:
            parts.append("edits " + ",".join(f"{n}:{w:g}" for n, w in sorted(self.edits.items())))
        for key in ("auth_share", "distractor_tools", "max_calls"):
            if getattr(self, key) is not None:
                parts.append(f"{key} {getattr(self, key):g}")
        if self.schemas != "full":
            parts.append(f"schemas {self.schemas}")
        return ", ".join(parts)

    def gated(self, env_index: int, task_index: int) -> Optional[bool]:
        """Whether task ``task_index`` of environment ``env_index`` needs an authorised session
        (None: no ``auth_share`` set, the edits decide)."""
        if self.auth_share is None:
            return None
        s, u = self.auth_share, (env_index * _GOLDEN) % 1.0
        return (math.floor(round((task_index + 1) * s + u, 9))
                > math.floor(round(task_index * s + u, 9)))


def short_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """``tool`` with its description cut to the first clause and no parameter descriptions."""
    fn = tool["function"]
    desc = re.split(r" \(|; |\. ", fn["description"], maxsplit=1)[0].rstrip(".") + "."
    params = {name: {k: v for k, v in p.items() if k != "description"}
              for name, p in fn["parameters"]["properties"].items()}
    return {"type": "function", "function": {
        "name": fn["name"], "description": desc,
        "parameters": {**fn["parameters"], "properties": params}}}
