"""Text from outside the policy, encoded as plain text: only the chat template places special
tokens (why: docs/rollout.md, "Text from outside the policy is plain text").

How (``ChatFormat`` uses this for every prompt and tool segment):

1. ``Slots``: each untrusted string is replaced by a placeholder (``ZqSlot{i}qZ``: ASCII, so
   ``tojson`` leaves it as it is) and the template renders the conversation twice, with the
   placeholders and with the real strings.
2. ``align(masked, real, values)``: the real render is matched against the template's pieces,
   each slot's text being the value as is, stripped or JSON-escaped (backtracking decides; the
   pieces must join back to ``real`` exactly); otherwise ``TemplateError``: fail closed.
3. ``PlainEncoder.encode(spans)``: added tokens are matched only in the template's pieces
   (leftmost, longest first); everything between goes through the tokenizer's pipeline without
   its added vocabulary (a ``tokenizers.Tokenizer`` sharing the backend's model). With no added
   token in the untrusted text the ids equal ``tokenizer.encode(real)``.

Needs a fast (``tokenizers``-backed) tokenizer. Added tokens with ``lstrip``/``rstrip`` set are
matched without the whitespace stripping (none of the supported formats' tokens set it).

May import: the standard library and ``tokenizers`` (inside ``PlainEncoder``).
"""

from __future__ import annotations

import json
import re
from typing import Any

SLOT = "ZqSlot{}qZ"
SLOT_RE = re.compile(r"ZqSlot(\d+)qZ")
Spans = list[tuple[str, bool]]   # (text, placed by the template)
# Left unmasked in tool schemas, because templates test them ("tool.type == 'function'",
# "param.type"): the type names of OpenAI function schemas and JSON Schema, and its keywords.
# Anything else (property names included, even one called "type") is the pool's text.
_TYPES = frozenset(("function", "object", "string", "number", "integer", "boolean", "array",
                    "null"))
_KEYWORDS = frozenset((
    "type", "function", "name", "description", "parameters", "properties", "required", "items",
    "enum", "const", "default", "examples", "additionalProperties", "anyOf", "oneOf", "allOf",
    "not", "format", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "title", "strict", "nullable",
    "$defs", "definitions", "$ref", "return", "returns"))


class TemplateError(ValueError):
    """The chat template cannot be used token-in/token-out (``actors.rollout.chat``); says why."""


class Slots:
    """The untrusted strings of one render, each behind a placeholder (one per distinct string,
    so a template comparing two untrusted strings still sees them equal)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> str:
        i = self._index.setdefault(text, len(self.values))
        if i == len(self.values):
            self.values.append(text)
        return SLOT.format(i)

    def mask(self, value: Any, key: str = "") -> Any:
        """A copy of a JSON value (tool schemas) with its strings masked: every value but a
        type name under ``type``, every key but a schema keyword (the names of a
        ``properties`` object always)."""
        if isinstance(value, str):
            return value if key == "type" and value in _TYPES else self(value)
        if isinstance(value, list):
            return [self.mask(v, key) for v in value]
        if isinstance(value, dict):
            return {(k if key != "properties" and k in _KEYWORDS else self(k)):
                    self.mask(v, "" if key == "properties" else k) for k, v in value.items()}
        return value


def _renderings(value: str) -> list[str]:
    """How a template may have written ``value``: as is, trimmed (a template trimming a whole
    message trims only one side of a value at its start or end), or inside ``tojson``."""
    return list(dict.fromkeys((value, value.strip(), value.lstrip(), value.rstrip(),
                               json.dumps(value, ensure_ascii=False)[1:-1],
                               json.dumps(value)[1:-1])))


def align(masked: str, real: str, values: list[str]) -> Spans:
    """``real`` as spans of template text (True) and slot text (False), following ``masked``."""
    parts = SLOT_RE.split(masked)
    texts, slots = parts[0::2], [int(i) for i in parts[1::2]]
    if any(i >= len(values) for i in slots):   # only unmasked text could have written one
        raise TemplateError(f"text outside the masked fields holds a placeholder ({SLOT})")
    if not real.startswith(texts[0]):
        raise TemplateError(
            f"the chat template renders differently without the message text (starts "
            f"{json.dumps(real[:60])}, expected {json.dumps(texts[0][:60])})")
    # depth-first over (slot k, position in real, chosen renderings); the first complete match wins
    stack: list[tuple[int, int, tuple[str, ...]]] = [(0, len(texts[0]), ())]
    while stack:
        k, pos, chosen = stack.pop()
        if k == len(slots):
            if pos == len(real):
                return _spans(texts, chosen)
            continue
        following = texts[k + 1]
        for text in reversed(_renderings(values[slots[k]])):
            end = pos + len(text)
            if real.startswith(text, pos) and real.startswith(following, end):
                stack.append((k + 1, end + len(following), chosen + (text,)))
    raise TemplateError(
        "the chat template transforms message text in a way ChatFormat cannot follow (it "
        "follows text written as is, trimmed, or through tojson); untrusted text could not be "
        "kept apart from the template's own tokens")


def _spans(texts: list[str], chosen: tuple[str, ...]) -> Spans:
    spans: Spans = [(texts[0], True)]
    for text, after in zip(chosen, texts[1:]):
        spans += [(text, False), (after, True)]
    return [(t, trusted) for t, trusted in spans if t]


def drop_prefix(spans: Spans, n: int) -> Spans:
    """``spans`` without their first ``n`` characters."""
    out: Spans = []
    for text, trusted in spans:
        if n >= len(text):
            n -= len(text)
            continue
        out.append((text[n:], trusted))
        n = 0
    return out


class PlainEncoder:
    """Encodes spans: added tokens only where the template placed them."""

    def __init__(self, tokenizer):
        from tokenizers import Tokenizer  # lazy: tokenizers only with a real tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TemplateError(f"ChatFormat needs a fast (tokenizers-backed) tokenizer, got "
                                f"{type(tokenizer).__name__}")
        # the same model, normaliser and pre-tokeniser (shared, not copied), no added vocabulary
        self._plain = Tokenizer(backend.model)
        if backend.normalizer is not None:
            self._plain.normalizer = backend.normalizer
        if backend.pre_tokenizer is not None:
            self._plain.pre_tokenizer = backend.pre_tokenizer
        added = {tok.content: i for i, tok in tokenizer.added_tokens_decoder.items()}
        self.added_ids = frozenset(added.values())
        self._added = added
        self._added_re = re.compile("|".join(
            re.escape(s) for s in sorted(added, key=len, reverse=True))) if added else None

    def plain(self, text: str) -> list[int]:
        """``text`` as characters: no added token is matched in it."""
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    def encode(self, spans: Spans) -> list[int]:
        ids: list[int] = []
        pending: list[str] = []
        for text, trusted in spans:
            if not trusted or self._added_re is None:
                pending.append(text)
                continue
            start = 0
            for m in self._added_re.finditer(text):
                pending.append(text[start:m.start()])
                ids += self.plain("".join(pending))
                ids.append(self._added[m.group()])
                pending, start = [], m.end()
            pending.append(text[start:])
        return ids + self.plain("".join(pending))
