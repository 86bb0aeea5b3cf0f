"""A tiny Qwen3 policy built locally (no downloads), cached under ``.cache/``; and policy loading.

``build_tiny_policy(cache_dir=None, seed=0) -> Path`` writes an HF model directory loadable by
``from_pretrained``: a byte-level BPE tokenizer trained on a corpus generated here and on the text
of generator environments of another seed (``envs.generator``, seed 1000 + ``seed``; never the
demo's own pool), with Qwen3's special tokens and a Qwen3-style chat template with tools
(``actors/chat_template.jinja``); and a randomly initialised ``Qwen3ForCausalLM`` (2 layers,
hidden 128, 4 query / 2 KV heads of head_dim 32: vLLM's and SDPA's kernels want head_dim >= 32).
The directory name carries a hash of every build parameter (the generator's text included), so a
changed recipe never reuses a stale cache; the build writes to a temporary directory and renames
it, so concurrent builders never see a half-written model. See docs/rollout.md, "The tiny local
policy".

``load_policy(path, dtype=float32, trust_remote_code=False) -> (model, tokenizer)`` loads any HF
causal-LM directory for the learner and the HF engine; ``resolve_model(path)`` accepts a local
directory, a ``.gguf`` file, a builtin name (``smollm2``) or a hub id already in the local cache,
through ``actors.checkpoints.resolve_policy_path``. Every load passes ``trust_remote_code``
explicitly (``actors.checkpoints.remote_code``): a folder with ``auto_map`` is refused in one line
unless ``trust_remote_code`` (``policy.trust_remote_code``), and nothing is ever asked on stdin.

May import: torch, transformers, tokenizers, ``actors.checkpoints`` (resolving a policy path),
``envs.generator`` (corpus text), the standard library.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

from actors.checkpoints import remote_code, resolve_policy_path
from envs.cache import cache_dir
from envs.generator import build_environment
from envs.generator.domains import DOMAINS

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>",
                "</tool_response>"]
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=32768,
            rope_theta=1_000_000.0, tie_word_embeddings=True)
VOCAB_SIZE = 4096
RECIPE_VERSION = 2
GENERATOR_CORPUS_SEED = 1000  # + the policy seed; the demo pool is seed 0

_WORDS = (
    "the a an to of and in for on with by from is are be was please user order customer account "
    "booking reservation flight hotel patient doctor appointment schedule cancel update create "
    "delete list get find search check status id name email phone address date time price total "
    "amount payment refund item product inventory stock warehouse shipment delivery ticket "
    "support request issue resolve assign employee manager department project task deadline "
    "priority room bed hospital donor location facility course student grade library book loan "
    "return available confirm success error message data result true false null none must not "
    "only if then after before each all any new current existing record table field value query "
    "tool function call arguments parameters required properties type string integer number "
    "object array description you are an assistant that helps rules state environment"
).split()


def _identifier(rng: random.Random) -> str:
    return "_".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth < 2 and r < 0.3:
        return {_identifier(rng): _json_value(rng, depth + 1) for _ in range(rng.randint(1, 4))}
    if depth < 2 and r < 0.4:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if r < 0.6:
        return f"{rng.choice(_WORDS)[:3]}_{rng.randint(0, 9999):04d}"
    if r < 0.8:
        return rng.randint(0, 5000)
    return rng.choice([True, False, None, " ".join(rng.choices(_WORDS, k=4))])


def _corpus(seed: int, lines: int = 6000):
    """Deterministic text resembling what the policy reads: prompts, schemas, JSON, calls."""
    rng = random.Random(seed)
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.4:
            yield " ".join(rng.choices(_WORDS, k=rng.randint(5, 25))).capitalize() + "."
        elif kind < 0.7:
            yield json.dumps(_json_value(rng), ensure_ascii=False)
        elif kind < 0.85:
            name = _identifier(rng)
            props = {_identifier(rng): {"type": rng.choice(["string", "integer"]),
                                        "description": " ".join(rng.choices(_WORDS, k=6))}}
            yield json.dumps({"type": "function", "function": {
                "name": name, "description": " ".join(rng.choices(_WORDS, k=8)),
                "parameters": {"type": "object", "properties": props, "required": list(props)}}})
        else:
            yield ('<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>'
                   % (_identifier(rng), json.dumps({_identifier(rng): _json_value(rng, 2)})))


@functools.lru_cache(maxsize=8)
def _generator_text(seed: int, tasks_per_env: int = 3) -> tuple[str, ...]:
    """Text of two rounds of built-in environments (every domain and its alternative): system
    prompts, tool schemas, task instructions and a few rows of each database table. Cached: the
    recipe hash and the tokenizer build both need it, and every ``build_tiny_policy`` call
    hashes it."""
    lines: list[str] = []
    for i in range(2 * len(DOMAINS)):
        gen = build_environment(i, GENERATOR_CORPUS_SEED + seed)
        lines.append(gen.env.system_prompt())
        lines.extend(json.dumps(tool) for tool in gen.env.tools)
        for task in gen.tasks(tasks_per_env):
            lines.append(task.instruction)
            state = task.initial_state or gen.state
            for table in list(state.values())[:6]:
                if isinstance(table, dict):
                    lines.extend(json.dumps(row) for row in list(table.values())[:4])
    return tuple(lines)


def _train_tokenizer(seed: int):
    # lazy: tokenizers and transformers only when building the tiny policy
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast  # lazy: transformers is heavy

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
                                  special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([*_corpus(seed), *_generator_text(seed)], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = TEMPLATE_PATH.read_text()
    fast.model_max_length = TINY["max_position_embeddings"]
    return fast


def _recipe(seed: int) -> str:
    blob = json.dumps({"v": RECIPE_VERSION, "seed": seed, "tiny": TINY, "vocab": VOCAB_SIZE,
                       "template": TEMPLATE_PATH.read_text(), "words": _WORDS,
                       "generator_text": hashlib.sha256(
                           "\n".join(_generator_text(seed)).encode()).hexdigest()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    return cache_dir("policies")


def build_tiny_policy(cache_dir: Optional[Union[str, Path]] = None, seed: int = 0) -> Path:
    """Build (once) and return the directory of the tiny random Qwen3 policy for ``seed``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / f"tiny-qwen3-s{seed}-{_recipe(seed)}"
    if (path / "config.json").is_file():
        return path
    import torch  # lazy: torch only when building the tiny policy
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM  # lazy: as torch

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(seed)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3Config(vocab_size=len(tokenizer), eos_token_id=ids("<|im_end|>"),
                         pad_token_id=ids("<|endoftext|>"), bos_token_id=None, **TINY)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], pad_token_id=ids("<|endoftext|>"))
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=root))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, path)
    except OSError:
        if not (path / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def resolve_model(path: Union[str, Path]) -> str:
    """A local HF model directory for ``path``: a directory with config.json, a ``.gguf`` file
    (converted once), a builtin name (``smollm2``) or a hub id in the local Hugging Face cache;
    see ``actors.checkpoints.resolve_policy_path``. Never downloads; a FileNotFoundError says the
    fix."""
    return str(resolve_policy_path(path))


def load_tokenizer(path: Union[str, Path], trust_remote_code: bool = False):
    from transformers import AutoTokenizer  # lazy: transformers is heavy

    path = resolve_model(path)
    return AutoTokenizer.from_pretrained(
        path, trust_remote_code=remote_code(path, trust_remote_code))


def load_policy(path: Union[str, Path], dtype=None, trust_remote_code: bool = False):
    """``(model, tokenizer)`` from an HF directory; model in eval mode, float32 unless ``dtype``;
    ``trust_remote_code``: see the module docstring."""
    import torch  # lazy: torch only when loading a model
    from transformers import AutoModelForCausalLM  # lazy: transformers is heavy

    path = resolve_model(path)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype or torch.float32, trust_remote_code=remote_code(path, trust_remote_code))
    model.eval()
    return model, load_tokenizer(path, trust_remote_code)


def cache_kwargs(model, cache) -> dict:
    """The keyword argument that hands ``cache`` (a ``DynamicCache``) to ``model``'s forward:
    ``cache`` in transformers 5.2x, ``past_key_values`` before. Each release silently takes the
    other's name into ``**kwargs`` and runs without the cache (tokens scored without their prompt),
    so the name is read from the forward's own signature. ``model`` may be a wrapper with
    ``.module`` (DeepSpeed)."""
    return {_cache_keyword(type(getattr(model, "module", model))): cache}


@functools.lru_cache(maxsize=None)
def _cache_keyword(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise TypeError(f"{cls.__name__}.forward takes neither `cache` nor `past_key_values`: "
                    f"this transformers release is not supported")
