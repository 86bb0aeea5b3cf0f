"""LLM operation-description pre-pass: envsched graph describe --pool DIR --endpoint URL --model NAME

Asks an OpenAI-compatible server (e.g. `vllm serve MODEL` -> http://HOST:8000/v1) for each task's
structured operation description (Appendix E), validates and caches every answer, falls back to
the static extractor with a logged reason, and writes ``DIR/op_descriptions.jsonl`` (or --out),
which ``envsched graph build`` then uses instead of the static extractor. Both files are pool
data: a symlink planted at them or at a folder above them in the pool is refused, naming it
(``envs.untrusted``).

The endpoint is untrusted too (``envs.chat_client``): redirects are followed within its origin
only (the API key never goes elsewhere), ``--timeout`` bounds each whole request, a reply is
size- and depth-bounded, and a reply that cannot be used falls back to the static extractor for
that task. ``--concurrency``, ``--timeout`` and ``--max-tokens`` below 1 (or 0 s), and negative
``--retries``, are refused in one line.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from envs.opdesc import DESCRIPTIONS_FILE, write_descriptions
from envs.opdesc_llm import JSON_MODES, LLMDescriber
from envs.pool import load_pool
from envs.untrusted import UntrustedFileError
from launch.errors import UserError

CACHE_FILE = ".cache/op_descriptions_cache.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, help="pool directory")
    parser.add_argument("--endpoint", required=True,
                        help="OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    parser.add_argument("--model", required=True, help="model name as the server knows it")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY; vLLM needs none)")
    parser.add_argument("--out", default=None, help="default: POOL/op_descriptions.jsonl")
    parser.add_argument("--cache", default=None,
                        help="answer cache (default: POOL/.cache/op_descriptions_cache.jsonl)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--json-mode", choices=JSON_MODES,
                        default="json_schema")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    bad = [f"--{name} must be {rule}, got {value:g}" for name, value, ok, rule in (
        ("concurrency", args.concurrency, args.concurrency >= 1, ">= 1"),
        ("retries", args.retries, args.retries >= 0, ">= 0"),
        ("timeout", args.timeout, args.timeout > 0 and args.timeout < float("inf"),
         "a positive number of seconds"),
        ("max-tokens", args.max_tokens, args.max_tokens >= 1, ">= 1")) if not ok]
    if bad:
        raise UserError("; ".join(bad))
    pool = load_pool(args.pool)
    root = Path(args.pool)
    try:  # the pool is data: its cache and descriptions are never read or written via a link
        describer = LLMDescriber(args.endpoint, args.model, api_key=args.api_key,
                                 cache_path=args.cache or root / CACHE_FILE, cache_root=root,
                                 concurrency=args.concurrency, retries=args.retries,
                                 timeout_s=args.timeout, json_mode=args.json_mode,
                                 max_tokens=args.max_tokens)
        descriptions, stats = describer.describe_pool(pool, progress=not args.no_progress)
        out = write_descriptions(args.out or root / DESCRIPTIONS_FILE, descriptions, root=root)
    except UntrustedFileError as e:
        raise UserError(f"{args.pool}: {e}") from None
    print(f"{len(descriptions)} tasks: {stats.summary()}")
    for task_id, reason in list(stats.reasons.items())[:20]:
        print(f"  fallback {task_id}: {reason}")
    print(f"wrote {out}")
    return 0
