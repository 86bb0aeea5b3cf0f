"""Trajectories -> padded tensors for the learner, and the split of a step across ranks.

Alignment (shared with ``grpo.token_logprobs``): position t of every [B, L-1] tensor scores token
t+1. ``logprobs`` has one entry per token or one per model token; anything else is an error naming
the task. ``behaviour_versions`` is aligned the same way (the version that sampled token t+1; -1
where no sampled token is scored).

Sharding (decision, the issue is silent): trajectories are dealt longest-first onto the rank with
the fewest tokens, a group's samples together (``shard``), then every shard is padded with
all-masked copies to the same length, so every rank runs the same number of micro-batches
(DeepSpeed's collectives must match) while the padding adds nothing to the loss. With a ``seed``
each rank's rows are then shuffled, a group's samples kept adjacent (prefix sharing needs them
so): micro-batches, and the mini-batches made of them (``learner.mini_batches``), are random
draws of the step rather than its longest trajectories first. The order is a function of the
seed alone, so a rerun or a resumed run sees the same mini-batches; sorting by length would pad
less, but would make each optimiser step of a step a biased sample of it.

May import: torch, numpy, envs.trajectory, actors.learner.grpo, the standard library.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Optional, Sequence

import torch

from actors.learner.grpo import target_logprobs
from envs.trajectory import Trajectory


class BatchError(ValueError):
    """A trajectory cannot be turned into training tensors; the message names the task."""


@dataclass
class PackedBatch:
    input_ids: torch.Tensor          # [B, L] long, right-padded with pad_id
    attention_mask: torch.Tensor     # [B, L] long
    loss_mask: torch.Tensor          # [B, L-1] float, 1 where token t+1 is a model token
    rollout_logprobs: torch.Tensor   # [B, L-1] float
    advantages: torch.Tensor         # [B] float
    behaviour_versions: torch.Tensor  # [B, L-1] float, -1 where no sampled token

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> "PackedBatch":
        """Rows [start, stop), trimmed to the longest sequence among them."""
        rows = {f.name: getattr(self, f.name)[start:stop] for f in fields(self)}
        length = max(int(rows["attention_mask"].sum(-1).max()), 2)
        for name in ("input_ids", "attention_mask"):
            rows[name] = rows[name][:, :length]
        for name in ("loss_mask", "rollout_logprobs", "behaviour_versions"):
            rows[name] = rows[name][:, :length - 1]
        return PackedBatch(**rows)

    def micro_batches(self, size: int) -> list["PackedBatch"]:
        return [self.slice(i, i + size) for i in range(0, len(self), size)]

    def to(self, device) -> "PackedBatch":
        return PackedBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def scored_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Positions t (of the [B, L-1] alignment) where some row scores a model token: the only
    places the loss reads, so the only ones the LM head needs to run at."""
    return loss_mask.any(0).nonzero().squeeze(-1)


def scored_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    loss_mask: torch.Tensor, scoring=None) -> torch.Tensor:
    """[B, L-1] log-probs like ``grpo.token_logprobs(model(...).logits, input_ids, scoring)`` at
    every ``scored_positions`` column and 0 elsewhere, computing logits only there
    (``logits_to_keep``): the full [B, L, V] logits were most of an agentic step
    (docs/benchmarks.md)."""
    keep = scored_positions(loss_mask)
    if keep.numel() == 0:
        keep = torch.zeros(1, dtype=torch.long, device=input_ids.device)
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                logits_to_keep=keep)
    return place_logprobs(out.logits, input_ids, keep, loss_mask, scoring)


def place_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, keep: torch.Tensor,
                   loss_mask: torch.Tensor, scoring=None) -> torch.Tensor:
    """Log-probs of the next tokens from ``logits`` [B, len(keep), V] computed at positions
    ``keep``, under ``scoring``'s distribution (``grpo.target_logprobs``), placed into a zero
    [B, L-1] tensor shaped like ``loss_mask``."""
    scored = target_logprobs(logits, input_ids[:, keep + 1], scoring)
    return scored.new_zeros(loss_mask.shape).index_copy(1, keep, scored)


def _aligned_logprobs(traj: Trajectory, where: str) -> list[float]:
    n, lp, mask = len(traj.token_ids), list(traj.logprobs), traj.loss_mask
    if len(lp) == n:
        return lp
    n_model = sum(1 for m in mask if m)
    if len(lp) == n_model:
        it = iter(lp)
        return [next(it) if m else 0.0 for m in mask]
    raise BatchError(f"{where}: logprobs has {len(lp)} entries; expected {n} (one per token) or "
                     f"{n_model} (one per model token)")


def _token_versions(traj: Trajectory) -> list[int]:
    if traj.token_versions:
        return list(traj.token_versions)
    return [traj.policy_version if m else -1 for m in traj.loss_mask]


def pack(trajectories: Sequence[Trajectory], advantages: Sequence[float],
         active: Sequence[bool] | None = None, pad_id: int = 0) -> PackedBatch:
    """Pad trajectories into a ``PackedBatch``; ``active[i] = False`` zeroes row i's loss mask."""
    if len(trajectories) != len(advantages):
        raise BatchError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    active = [True] * len(trajectories) if active is None else list(active)
    length = max([len(t.token_ids) for t in trajectories] + [2])
    b = len(trajectories)
    ids = torch.full((b, length), pad_id, dtype=torch.long)
    attn = torch.zeros((b, length), dtype=torch.long)
    lmask = torch.zeros((b, length - 1), dtype=torch.float32)
    rlp = torch.zeros((b, length - 1), dtype=torch.float32)
    versions = torch.full((b, length - 1), -1.0, dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        where = f"task {traj.task_id!r} (trajectory {i} of the step)"
        n = len(traj.token_ids)
        if n < 2:
            raise BatchError(f"{where}: needs at least 2 tokens, has {n}")
        if len(traj.loss_mask) != n:
            raise BatchError(f"{where}: loss_mask has {len(traj.loss_mask)} entries for {n} tokens")
        ids[i, :n] = torch.tensor(traj.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        if active[i]:
            lmask[i, :n - 1] = torch.tensor(traj.loss_mask[1:], dtype=torch.float32)
        rlp[i, :n - 1] = torch.tensor(_aligned_logprobs(traj, where)[1:], dtype=torch.float32)
        versions[i, :n - 1] = torch.tensor(_token_versions(traj)[1:], dtype=torch.float32)
    adv = torch.tensor([float(a) for a in advantages], dtype=torch.float32)
    return PackedBatch(ids, attn, lmask, rlp, adv, versions)


def _units(trajectories: Sequence[Trajectory]) -> list[list[int]]:
    """Runs of consecutive trajectories with the same prompt (a group's K samples, in step order):
    the units ``shard`` keeps on one rank so the learner can run their prompt once (prefix.py)."""
    units: list[list[int]] = []
    key = None
    for i, t in enumerate(trajectories):
        k = (t.task_id, tuple(t.token_ids[:t.prompt_len])) if t.prompt_len else None
        if k is not None and k == key:
            units[-1].append(i)
        else:
            units.append([i])
        key = k
    return units


def shard(trajectories: Sequence[Trajectory], advantages: Sequence[float], world: int,
          micro_batch_size: int, pad_id: int = 0, seed: Optional[int] = None) -> list[PackedBatch]:
    """Split a step over ``world`` ranks with equal row counts (a multiple of the micro-batch).

    Units of samples sharing a prompt (``_units``), longest first, go whole to the rank with the
    fewest tokens among those with room for them under ceil(rows / world); a unit that fits
    nowhere whole is dealt row by row (longest first) to the least-loaded ranks with room. With
    ``seed``, each rank's units are then shuffled (``random.Random(seed)``), rows of a unit kept
    together; without, they stay in the dealing order."""
    if not trajectories:
        raise BatchError("a learner step needs at least one trajectory")
    size = [len(t.token_ids) for t in trajectories]
    cap = -(-len(trajectories) // world)
    buckets: list[list[list[int]]] = [[] for _ in range(world)]   # per rank: its units
    rows_of = [0] * world
    load = [0] * world

    def put(rows: list[int], ranks: list[int]) -> None:
        r = min(ranks, key=lambda k: (load[k], rows_of[k], k))
        buckets[r].append(rows)
        rows_of[r] += len(rows)
        load[r] += sum(size[i] for i in rows)

    for unit in sorted(_units(trajectories), key=lambda u: -sum(size[i] for i in u)):
        whole = [r for r in range(world) if rows_of[r] + len(unit) <= cap]
        if whole:
            put(unit, whole)
            continue
        for i in sorted(unit, key=lambda i: -size[i]):
            put([i], [r for r in range(world) if rows_of[r] < cap])
    if seed is not None:
        rng = random.Random(seed)
        for units in buckets:
            rng.shuffle(units)
    rows = max(rows_of)
    rows = -(-rows // micro_batch_size) * micro_batch_size if rows > micro_batch_size else rows
    filler = min(range(len(trajectories)), key=lambda i: size[i])
    out = []
    for units in buckets:
        bucket = [i for unit in units for i in unit]
        idx = bucket + [filler] * (rows - len(bucket))
        act = [True] * len(bucket) + [False] * (rows - len(bucket))
        out.append(pack([trajectories[i] for i in idx], [advantages[i] for i in idx], act, pad_id))
    return out
