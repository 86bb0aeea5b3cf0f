"""Supervised warm start of the tiny policy on reference solutions (the demo's ``envsched sft``).

Why: a randomly initialised policy never emits a valid tool call, so every group's rewards are all
0 and GRPO (and the scheduler) have nothing to work with. A short supervised pass on the pool's
reference solutions makes rewards non-degenerate.

How: each reference solution is played through the real agent loop by the ``ScriptedEngine``
against sandboxed sessions (``actors.executors.local_sandbox``: pool code runs only in an
isolated sandbox worker, never in this driver), so the training sequences are exactly the token ids
the policy will later see and produce (chat template, tool-call syntax, tool responses,
``<|im_end|>``), with the loop's loss mask (model tokens only). A conversational task
(``envs.spec.UserSpec``) is played with a scripted user who states the whole instruction in its
opening message and ends the conversation at the agent's first reply: the warm start teaches the
call syntax and the tools, not how to ask the user (no simulator is needed before training). A reference solution that scores
below 1.0 (or an environment that does not load) is a ``PoolError`` naming the task. Training is
plain next-token cross-entropy on masked tokens with AdamW, batches of ``batch`` sequences
right-padded, ``epochs`` passes in a seeded order.

Decision where the spec is silent: ``task_fraction`` (default 1.0: all tasks) picks a seeded
share of the tasks to show. Measured on the demo pool: a policy shown half the tasks for 20
epochs almost never gets past its first tool call (zero within-group variance); 30-40 epochs
on all tasks (masked loss ~0.1 / 0.03) gives partial and
full solves with reward differences: a GRPO start near 0.2-0.35 mean reward (docs/demo.md).

``warm_start(cfg, pool_dir, out, task_ids, seed)`` is the one place a run, a comparison and the gain
benchmark get the policy GRPO starts from (what ``cfg.warm_starts()`` says: ``policy.path`` or the
tiny policy as is, else a warm start into ``out``). A finished warm start (its
``sft_summary.json``, the last file ``run_sft`` writes) is reused when every task it showed is one
the caller allows: a benchmark that keeps evaluated tasks out of its warm start refuses, in one
line, one made by a comparison on every training task. A folder without the summary (interrupted
while saving) is trained again; one written before the summary listed its tasks is reused.

``run_sft_apart`` runs ``run_sft`` in a fresh (spawned) process and returns its summary: the
caller (the training or comparing driver) does not keep the warm start's model, optimiser and
allocator arenas for the rest of the run (SmolLM2's left ~6 GB in the ``envsched compare``
driver), and its progress lines still reach the same terminal.

May import: torch, transformers, actors.policy, actors.rollout, actors.user_sim, envs,
sandbox.errors, launch.errors, launch.run_files (launch.config for types only).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from actors.executors.local_sandbox import SandboxSessions
from actors.policy import build_tiny_policy, cache_kwargs, load_policy, resolve_model
from actors.rollout.agent_loop import AgentLoop
from actors.rollout.config import RolloutConfig
from actors.rollout.engines.scripted_engine import ScriptedEngine
from actors.user_sim.simulator import ScriptedUser
from envs import strict_json
from envs.pool import TASKS_FILE, PoolError, PoolProblem, load_pool
from launch.errors import UserError
from launch.run_files import read_json
from sandbox.errors import EnvLoadError

if TYPE_CHECKING:
    from launch.config import TrainConfig


def reference_sequences(pool: Any, tokenizer: Any, task_ids: list[str],
                        enable_thinking: bool = False, sandbox: Any = None,
                        ) -> list[tuple[list[int], list[int]]]:
    """(token_ids, loss_mask) of each task's reference solution played through the loop, its
    episodes in a sandbox worker configured by ``sandbox`` (a ``SandboxConfig``; None: default)."""
    engine = ScriptedEngine.from_pool(tokenizer, pool)
    users = ScriptedUser({t.task_id: [t.instruction] for t in pool.tasks if t.user is not None})
    loop = AgentLoop(engine, tokenizer, RolloutConfig(enable_thinking=enable_thinking), users)
    with SandboxSessions(pool, sandbox) as sessions:
        trajectories = asyncio.run(_play(loop, pool, sessions, task_ids))
    out = []
    for traj in trajectories:
        if traj.reward < 1.0:
            raise _broken(pool, traj.task_id, f"its reference solution scores {traj.reward} "
                                              f"(status {traj.status})")
        out.append((traj.token_ids, traj.loss_mask))
    return out


def _broken(pool: Any, task_id: str, why: str) -> Exception:
    return PoolError([PoolProblem(TASKS_FILE, f"{why}: the pool is broken, run `envsched pool "
                                              f"validate`", line=pool.lines.get(task_id),
                                  task_id=task_id)])


async def _play(loop: Any, pool: Any, sessions: Any, task_ids: list[str]) -> list[Any]:
    out = []
    for task_id in task_ids:
        task = pool.task(task_id)
        try:
            session = await sessions.aopen_session(task, 0)
        except EnvLoadError as e:
            raise _broken(pool, task_id, f"environment {task.env_id} does not load in the "
                                         f"sandbox ({e.message})") from None
        try:
            out.append(await loop.run(pool.environment(task.env_id), task, session, seed=0))
        finally:
            await session.aclose()
    return out


def pick_tasks(pool: Any, fraction: float, max_examples: int, seed: int) -> list[str]:
    ids = [t.task_id for t in pool.tasks if t.reference_solution]
    rng = random.Random(seed)
    rng.shuffle(ids)
    return sorted(ids[:max(1, min(max_examples, round(fraction * len(ids))))])


def _sequence_loss(model: Any, tok: list[int], mask: list[int]) -> tuple[Any, float]:
    """Summed masked NLL of one sequence and its number of target tokens.

    The prompt (everything before the first model token, ~90% of a demo sequence: system
    prompt and tool schemas) runs once without gradient and is reused as the KV cache, so only
    the episode's own tokens are trained through: about half the cost of a full backward.
    """
    import torch  # lazy: torch only where the warm start trains (imports stay cheap)
    from transformers.cache_utils import DynamicCache  # lazy: transformers is heavy

    first = mask.index(1)
    ids = torch.tensor([tok])
    past = None
    if first > 1:
        past = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :first - 1], **cache_kwargs(model, past), use_cache=True,
                  logits_to_keep=1)
    logits = model(input_ids=ids[:, first - 1:-1], **cache_kwargs(model, past),
                   use_cache=False).logits[0]
    target = ids[0, first:]
    weight = torch.tensor(mask[first:], dtype=torch.float32)
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="none")
    return (nll * weight).sum(), float(weight.sum())


def train_sft(model: Any, sequences: list[tuple[list[int], list[int]]], epochs: int, lr: float,
              batch: int = 4, seed: int = 0, target_loss: Optional[float] = None) -> list[float]:
    """Masked next-token cross-entropy (token mean over each batch of ``batch`` sequences);
    returns the mean loss of each epoch. With ``target_loss``, stops after the first epoch whose
    mean loss is at or below it (at most ``epochs``): the warm start's strength then does not
    depend on the pool's size (more tasks = more optimiser steps per epoch)."""
    import torch  # lazy: torch only where the warm start trains (imports stay cheap)

    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(epochs):
        order = list(range(len(sequences)))
        rng.shuffle(order)
        total, count = 0.0, 0.0
        for start in range(0, len(order), batch):
            chunk = [sequences[i] for i in order[start:start + batch]]
            n_tokens = sum(sum(m) for _, m in chunk)
            opt.zero_grad()
            for tok, mask in chunk:
                loss, _ = _sequence_loss(model, tok, mask)
                (loss / max(n_tokens, 1)).backward()
                total += loss.item()
            count += n_tokens
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        losses.append(total / max(count, 1.0))
        print(f"sft: epoch {len(losses)}/{epochs}: masked loss {losses[-1]:.4f}"
              + (f" (stops at {target_loss})" if target_loss is not None else ""),
              file=sys.stderr, flush=True)
        if target_loss is not None and losses[-1] <= target_loss:
            break
    model.eval()
    return losses


def run_sft(pool_dir: Path, out_dir: Path, epochs: int, lr: float, task_fraction: float,
            max_examples: int, seed: int = 0, base: Optional[str] = None, batch: int = 1,
            target_loss: Optional[float] = None, sandbox: Any = None,
            only: Optional[Sequence[str]] = None,
            trust_remote_code: bool = False) -> dict[str, Any]:
    """Warm-start ``base`` (default: the tiny policy) and save it to ``out_dir``; reference
    solutions play in a sandbox worker configured by ``sandbox`` (a ``SandboxConfig``). ``only``:
    the tasks it may show (a run's training split, so held-out tasks stay unseen).
    ``trust_remote_code``: ``policy.trust_remote_code`` (``actors.policy.load_policy``)."""
    import torch  # lazy: torch only where the warm start trains (imports stay cheap)

    t0 = time.perf_counter()
    pool = load_pool(pool_dir)
    model, tokenizer = load_policy(base or build_tiny_policy(seed=seed),
                                   trust_remote_code=trust_remote_code)
    task_ids = pick_tasks(pool if only is None else pool.subset(only), task_fraction,
                          max_examples, seed)
    seqs = reference_sequences(pool, tokenizer, task_ids, sandbox=sandbox)
    losses = train_sft(model, seqs, epochs, lr, batch=batch, seed=seed, target_loss=target_loss)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    summary = {"tasks": len(task_ids), "task_ids": sorted(task_ids),
               "tokens": sum(len(s) for s, _ in seqs),
               "model_tokens": sum(sum(m) for _, m in seqs), "epoch_loss": losses,
               "seconds": round(time.perf_counter() - t0, 1), "out": str(out_dir),
               "pid": os.getpid()}
    (out_dir / "sft_summary.json").write_text(strict_json.dumps(summary, indent=2))
    return summary


def run_sft_apart(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """``run_sft(*args, **kwargs)`` in a spawned process (module docstring); an exception it
    raises is raised here."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(run_sft, *args, **kwargs).result()


def warm_start(cfg: "TrainConfig", pool_dir: Path, out: Path, task_ids: Sequence[str], seed: int,
               log: Callable[[str], None] = print, what: str = "training tasks"
               ) -> tuple[str, float]:
    """The policy GRPO starts from and the warm start's seconds (0 without one; a reused one's
    own): ``policy.path`` resolved or the tiny policy of ``seed`` when ``cfg.warm_starts()`` is
    false, else ``run_sft_apart`` from that base on ``task_ids`` (``what`` names them in the
    progress line) into ``out``, reused as the module docstring says."""
    base = resolve_model(cfg.policy.path) if cfg.policy.path else None
    if not cfg.warm_starts():
        return base if base is not None else str(build_tiny_policy(seed=seed)), 0.0
    out = Path(out)
    done = out / "sft_summary.json"
    if done.is_file():
        try:
            summary = read_json(done)   # a run folder's file: bounded, no NaN, an object
            seconds = float(summary.get("seconds", 0.0))
            shown = summary.get("task_ids")
            if shown is not None and not (isinstance(shown, list)
                                          and all(isinstance(t, str) for t in shown)):
                raise ValueError("task_ids is not a list of task ids")
        except (OSError, ValueError, TypeError) as e:   # RunFileError is a ValueError
            raise UserError(f"{done} is unreadable ({getattr(e, 'detail', e)}); remove {out} or "
                            f"choose another --out") from None
        extra = sorted(set(shown) - set(task_ids)) if shown is not None else []
        if extra:
            raise UserError(f"{out} holds a warm start that showed {len(extra)} task(s) this "
                            f"run keeps out of it (e.g. {extra[0]}); remove it or choose "
                            f"another --out")
        return str(out), seconds
    if out.exists():   # interrupted while saving: its files are incomplete
        shutil.rmtree(out)
    s = cfg.sft
    log(f"warm start on {len(task_ids)} {what} ({s.epochs} epochs at most)")
    r = run_sft_apart(pool_dir, out, s.epochs, s.lr, s.task_fraction, s.max_examples, seed,
                      batch=s.batch, target_loss=s.target_loss, sandbox=cfg.executors.sandbox,
                      only=list(task_ids), base=base,
                      trust_remote_code=cfg.policy.trust_remote_code)
    log(f"warm start done: {r['tasks']} tasks, loss {r['epoch_loss'][0]:.3f} -> "
        f"{r['epoch_loss'][-1]:.3f} in {r['seconds']} s")
    return str(out), float(r["seconds"])
