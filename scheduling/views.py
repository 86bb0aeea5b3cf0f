"""The six concrete TF-IDF views of Eq. 1 (Appendix D) and the abstract view's encoder.

Views a = 1..6 with weights alpha = (0.28, 0.08, 0.16, 0.12, 0.16, 0.20), each its own
``TfidfVectorizer(min_df=1, max_features=35000, sublinear_tf=True)``, rows L2-normalised:

1. ``instruction_words``   word unigrams + bigrams of the instruction;
2. ``instruction_chars``   character 3-5-grams of the instruction (``char_wb``);
3. ``check_text``          the checks' descriptions (else the string constants of their code);
4. ``check_code``          verifier code structure (``envs.opdesc.CheckFacts.structure``);
5. ``initial_context``     the initial state's top-level attributes, plus the records the
                           instruction names (a 1-4-word phrase matching exactly one record's key
                           or short string value; at most 8 records);
6. ``operation_description`` the complete (concrete) operation description, flattened.

An empty view text gives a zero row (cosine 0 with everything), never an error.

May import: numpy, scipy, scikit-learn, the standard library, envs.spec, envs.opdesc, and
scheduling.abstraction.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import numpy as np
import scipy.sparse as sp
from sklearn.feature_extraction.text import TfidfVectorizer

from envs.opdesc import check_facts
from envs.spec import TaskSpec

VIEW_NAMES = ("instruction_words", "instruction_chars", "check_text", "check_code",
              "initial_context", "operation_description")
VIEW_WEIGHTS = (0.28, 0.08, 0.16, 0.12, 0.16, 0.20)
MAX_CONTEXT_RECORDS = 8
MAX_RECORD_FIELDS = 40
MAX_PHRASE_RECORDS = 1

StateOf = Callable[[TaskSpec], dict]


def make_vectorizer(view: str, max_features: int, min_df: int,
                    sublinear_tf: bool) -> TfidfVectorizer:
    common = dict(min_df=min_df, max_features=max_features, sublinear_tf=sublinear_tf,
                  dtype=np.float32)
    if view == "instruction_words":
        return TfidfVectorizer(ngram_range=(1, 2), **common)
    if view == "instruction_chars":
        return TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), **common)
    if view in ("check_code", "abstract"):
        ngrams = (1, 2) if view == "abstract" else (1, 1)
        return TfidfVectorizer(token_pattern=r"\S+", lowercase=False, ngram_range=ngrams,
                               **common)
    if view in ("check_text", "initial_context", "operation_description"):
        return TfidfVectorizer(**common)
    raise ValueError(f"unknown view {view!r}; views are {VIEW_NAMES + ('abstract',)}")


def encode(texts: list[str], vectorizer: TfidfVectorizer) -> sp.csr_matrix:
    """TF-IDF rows (L2-normalised); all-empty input gives an (n, 0) matrix."""
    try:
        X = vectorizer.fit_transform(texts)
    except ValueError as e:
        if "empty vocabulary" not in str(e):
            raise
        return sp.csr_matrix((len(texts), 0), dtype=np.float32)
    return sp.csr_matrix(X, dtype=np.float32)


def view_texts(tasks: list[TaskSpec], descs: dict[str, dict[str, Any]],
               state_of: Optional[StateOf] = None) -> dict[str, list[str]]:
    """The six view texts, one list per view, rows in ``tasks`` order."""
    index_cache: dict[int, _StateIndex] = {}
    out: dict[str, list[str]] = {v: [] for v in VIEW_NAMES}
    for task in tasks:
        out["instruction_words"].append(task.instruction)
        out["instruction_chars"].append(task.instruction)
        out["check_text"].append(check_text(task))
        out["check_code"].append(" ".join(check_facts(task.task_id, c).structure
                                          for c in task.checks))
        out["initial_context"].append(context_text(task, _state(task, state_of), index_cache))
        out["operation_description"].append(description_text(descs[task.task_id]))
    return out


def _state(task: TaskSpec, state_of: Optional[StateOf]) -> dict:
    if task.initial_state is not None:
        return task.initial_state
    if task.initial_state_ref is not None and state_of is not None:
        return state_of(task)
    return {}


def check_text(task: TaskSpec) -> str:
    parts = []
    for c in task.checks:
        if c.description.strip():
            parts.append(c.description)
        else:
            parts += check_facts(task.task_id, c).strings
    return "\n".join(parts)


def description_text(desc: dict[str, Any]) -> str:
    parts = []
    for op in desc.get("operations", []):
        parts.append(f"{op['type']} {op.get('tool', '')} {op.get('entity', '')}")
        for a in op.get("arguments", []):
            value = "" if a.get("value") is None else str(a["value"])
            parts.append(f"{a['name']} {value} {a.get('category', '')} {a.get('provenance') or ''}")
    for g in desc.get("gates", []):
        parts.append(f"{g['kind']} {g['provenance']} {g.get('requires', '')}")
    for d in desc.get("dependencies", []):
        parts.append(f"dependency {d.get('reason', '')}")
    for r in desc.get("reward_groups", []):
        parts.append(f"{r['relation']} checks {len(r['checks'])}")
    for c in desc.get("conflicts", []):
        parts.append(f"{c['kind']} {c.get('reason', '')}")
    return "\n".join(parts)


class _StateIndex:
    """Top-level attribute names plus a phrase -> records map of one initial state."""

    def __init__(self, state: dict):
        self.state = state  # held so the id() key of the cache cannot be reused while cached
        self.header = " ".join(str(k) for k in state)
        self.records: dict[tuple[str, str], dict] = {}
        self.phrases: dict[str, list[tuple[str, str]]] = {}
        for table, value in state.items():
            rows = (value.items() if isinstance(value, dict) else
                    enumerate(value) if isinstance(value, list) else ())
            for key, rec in rows:
                if not isinstance(rec, dict):
                    continue
                ref = (str(table), str(key))
                self.records[ref] = rec
                self._add(str(key), ref)
                for v in rec.values():
                    if isinstance(v, str) and 2 < len(v) <= 60:
                        self._add(v, ref)

    def _add(self, phrase: str, ref: tuple[str, str]) -> None:
        self.phrases.setdefault(" ".join(phrase.lower().split()), []).append(ref)

    def record_text(self, ref: tuple[str, str]) -> str:
        items = list(self.records[ref].items())[:MAX_RECORD_FIELDS]
        return ref[0] + " " + " ".join(f"{f} {v}" for f, v in items
                                       if not isinstance(v, (dict, list)))


def context_text(task: TaskSpec, state: dict, cache: dict[int, _StateIndex]) -> str:
    if not state:
        return ""
    index = cache.get(id(state))
    if index is None or task.initial_state is not None:
        index = _StateIndex(state)
        if task.initial_state is None:
            cache[id(state)] = index
    words = [re.sub(r"'s$", "", w.strip(".,;:!?'\"()"))
             for w in task.instruction.lower().split()]
    found: dict[tuple[str, str], None] = {}
    for n in (4, 3, 2, 1):
        for k in range(len(words) - n + 1):
            refs = index.phrases.get(" ".join(words[k:k + n]), ())
            if len(refs) <= MAX_PHRASE_RECORDS:  # a common value ("active") names no record
                found.update(dict.fromkeys(refs))
    found_refs = list(found)
    return "\n".join([index.header] + [index.record_text(r)
                                       for r in found_refs[:MAX_CONTEXT_RECORDS]])
