"""The learner as Ray actors: ``LearnerActor`` (one rank, a thin shell over ``LearnerEngine``) and
``LearnerGroup`` (the driver-side handle creating N actors that form one DeepSpeed world).

World set-up: rank 0 is created first and reports its node IP and a free port (or
``LearnerConfig.master_port``), so each group gets its own rendezvous port; every actor then sets
the torch.distributed environment and builds its engine concurrently (the rendezvous needs all
of them). LOCAL_RANK is 0: on CPU ranks share the node's one "device"; on GPUs Ray gives each
actor its own GPU, device 0 inside the actor.

A step: the driver builds the per-rank batches (``actors.learner.step.step_shards``: advantages
over the whole step, then ``batching.shard``), puts each into the object store and calls
``train_step`` on every rank; it returns rank 0's metrics plus ``loss_per_rank``. Every remote
call waits at most ``LearnerConfig.timeout_s``; a failing rank raises ``LearnerError`` naming the
rank, a dead or silent one ``LearnerDied`` (the group is lost: ``launch.run.recovery``).
``poll_train_step`` reports a dead rank as soon as Ray does, without waiting for the ranks stuck
in a collective with it.

May import: ray, the learner's plain modules and ``weight_sync``, ``actors.policy``
(``resolve_model``), envs.trajectory (torch/deepspeed only inside actors).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import ray

from actors.learner.batching import pack
from actors.learner.config import LearnerConfig
from actors.learner.precision import precision_refusal
from actors.learner.step import step_advantages, step_shards
from actors.learner.weight_sync import learner_sync_broadcast, learner_sync_init
from actors.policy import resolve_model
from actors.ray_errors import ACTOR_GONE
from envs.trajectory import Group, Trajectory
from envs.cache import cache_dir

log = logging.getLogger(__name__)



class LearnerError(RuntimeError):
    """A learner rank failed or timed out; the message names the rank and the call."""


class LearnerDied(LearnerError):
    """A learner rank died (or a step got no answer within ``timeout_s``): the group is lost."""


STALE_LOCK_S = 600.0   # a DeepSpeed op build takes about a minute, several on a loaded host


def clear_stale_build_locks(root: Path, older_than_s: float = STALE_LOCK_S) -> list[Path]:
    """Remove torch's JIT-build lock files (``root/<op>/lock``) older than ``older_than_s``.
    torch takes the lock even to load an op already built and waits for it without a limit, so
    a learner killed while holding it (an OOM kill, a SIGKILLed test) left every later learner
    start on the machine waiting forever. Returns what was removed, each named in a warning."""
    removed = []
    now = time.time()
    for lock in sorted(root.glob("*/lock")) if root.is_dir() else []:
        try:
            age = now - lock.stat().st_mtime
            if age > older_than_s:
                lock.unlink()
                removed.append(lock)
                log.warning("removed a stale build lock %s (%.0f s old: its builder is gone)",
                            lock, age)
        except FileNotFoundError:   # its builder finished meanwhile
            continue
    return removed


class LearnerActor:
    """One DeepSpeed rank. Methods mirror ``LearnerEngine``; the class is wrapped by ``ray.remote``
    in ``LearnerGroup`` so that resources are chosen per group."""

    def __init__(self, cfg: LearnerConfig, rank: int, world_size: int):
        self.cfg = cfg   # validated once, by the driver's config: a model pickles through Ray
        self.rank, self.world = rank, world_size
        self.engine = None
        # also set by the actor's runtime env (``learner_actor_options``); set here too so that a
        # process-wide DS_ACCELERATOR (a CPU driver's, a node's) never wins over this rank's GPU
        os.environ["DS_ACCELERATOR"] = self.cfg.accelerator
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache_dir("torch_extensions")))
        clear_stale_build_locks(Path(os.environ["TORCH_EXTENSIONS_DIR"]))

    def address(self, configured_port: bool = True) -> tuple[str, int]:
        """This node's IP and a free port on it (``master_port`` when set and asked for)."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if configured_port and self.cfg.master_port:
            port = self.cfg.master_port
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> int:
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world), LOCAL_RANK="0",
                          MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        from actors.learner.engine import LearnerEngine  # lazy: Ray worker start-up

        self.engine = LearnerEngine(self.cfg)
        return self.engine.step

    def train_step(self, batch) -> dict[str, float]:
        return self.engine.train_step(batch)

    def logprobs(self, batch):
        return self.engine.logprobs(batch)

    def publish_state_dict(self) -> Optional[list]:
        """Rank 0 puts the full state dict into the object store once and returns [ref, bytes]."""
        sd = self.engine.full_state_dict()
        if sd is None:
            return None
        return [ray.put(sd), sum(t.numel() * t.element_size() for t in sd.values())]

    def publish_adapter(self) -> Optional[list]:
        """Rank 0 puts the LoRA adapter (``actors.lora.LoraAdapter``) into the object store once
        and returns [ref, bytes]."""
        adapter = self.engine.adapter()
        return [ray.put(adapter), adapter.nbytes] if adapter is not None else None

    def save(self, directory: str) -> str:
        return self.engine.save_checkpoint(directory)

    def load(self, directory: str, tag: Optional[str]) -> int:
        return self.engine.load_checkpoint(directory, tag)

    def export(self, directory: str) -> Optional[str]:
        return self.engine.export_hf(directory)

    def export_adapter(self, directory: str) -> Optional[str]:
        return self.engine.export_adapter(directory)

    def sync_init(self, addr: str, port: int, world: int) -> list:
        return learner_sync_init(self.engine, addr, port, world)

    def sync_broadcast(self) -> None:
        learner_sync_broadcast(self.engine)

    def precision_refusal(self, expected: Optional[str] = None) -> Optional[str]:
        """Why this rank cannot train in ``learner.dtype`` on its own device (explicit bf16 its
        CPU or GPU lacks; ``auto`` resolving otherwise than ``expected``, the driver's), or None
        (``actors.learner.precision.precision_refusal``)."""
        import torch  # lazy: in the actor only (the engine imports it next anyway)

        cuda = torch.cuda.is_available() and self.cfg.num_gpus_per_rank > 0
        return precision_refusal(self.cfg, cuda=cuda,
                                 cuda_bf16=cuda and torch.cuda.is_bf16_supported(),
                                 expected=expected)

    def pid(self) -> int:
        """This rank's process id (for operators and fault-injection tests)."""
        return os.getpid()


def learner_actor_options(cfg: LearnerConfig) -> dict[str, Any]:
    """Ray options of one rank: its CPUs and GPUs, and DeepSpeed's accelerator for them."""
    return {"num_cpus": cfg.num_cpus_per_rank, "num_gpus": cfg.num_gpus_per_rank,
            "runtime_env": {"env_vars": {"DS_ACCELERATOR": cfg.accelerator}}}


class LearnerGroup:
    """N ``LearnerActor`` ranks forming one DeepSpeed world; the trainer's handle on the learner."""

    def __init__(self, cfg: LearnerConfig):
        try:  # resolved once, here: every rank loads the same directory
            if not cfg.model_path:
                raise FileNotFoundError("no model path")
            cfg = cfg.model_copy(update={"model_path": resolve_model(cfg.model_path)})
        except FileNotFoundError as e:
            raise LearnerError(f"the model_path parameter of LearnerConfig must be a Hugging Face "
                               f"model directory (with config.json) or a hub id in the local "
                               f"cache, got {cfg.model_path!r}: {e}") from None
        self.cfg = cfg
        remote = ray.remote(LearnerActor).options(**learner_actor_options(cfg))
        self.actors = [remote.remote(cfg, r, cfg.ranks) for r in range(cfg.ranks)]
        # each rank checks its own device against the dtype the driver resolved (the rollout
        # engine's), before DeepSpeed starts: one line naming the rank
        expected = cfg.torch_dtype_name(cfg.num_gpus_per_rank > 0)
        refusals = self._get([a.precision_refusal.remote(expected) for a in self.actors],
                             "dtype check")
        if any(refusals):
            self.shutdown()
            rank, line = next((r, line) for r, line in enumerate(refusals) if line)
            raise LearnerError(f"learner rank {rank}: {line}")
        addr, port = self._get([self.actors[0].address.remote()], "address")[0]
        self.master = (addr, port)
        self.step = self._get([a.setup.remote(addr, port) for a in self.actors], "setup")[0]
        self.last_publish_bytes = 0

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs, timeout=self.cfg.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise LearnerError(f"learner {what} timed out after {self.cfg.timeout_s} s "
                               f"(ranks {self.cfg.ranks}, master {getattr(self, 'master', None)})"
                               ) from e
        except ACTOR_GONE as e:
            rank = next((r for r, a in enumerate(self.actors)
                         if getattr(e, "actor_id", None) == a._actor_id.hex()), "?")
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise LearnerDied(f"learner {what}: rank {rank} died ({type(e).__name__}: "
                              f"{first})") from e
        except ray.exceptions.RayTaskError as e:
            raise LearnerError(f"learner {what} failed: {e}") from e

    def advantages(self, groups: Sequence[Group]) -> list[list[float]]:
        return step_advantages(groups, self.cfg.loss)

    def train_step(self, groups: Sequence[Group]) -> dict[str, Any]:
        """One optimiser step on the groups; returns rank 0's metrics plus ``loss_per_rank``."""
        return self.finish_train_step(self.start_train_step(groups))

    def start_train_step(self, groups: Sequence[Group]) -> list:
        """Start one optimiser step and return at once: one ObjectRef per rank, to be passed
        to ``finish_train_step`` (the driver keeps working while the ranks train)."""
        shards = step_shards(groups, self.cfg)
        self._step_started = time.monotonic()
        return [a.train_step.remote(ray.put(s)) for a, s in zip(self.actors, shards)]

    def poll_train_step(self, refs: list, timeout: float) -> bool:
        """Whether every rank finished the step ``refs`` runs, waiting at most ``timeout`` s. A
        rank that died or failed raises here at once (the others may wait in a collective for
        it until gloo's or NCCL's own timeout); a step running past ``timeout_s`` raises
        ``LearnerDied``."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) == len(refs):
            return True
        self._get(ready, f"train_step {self.step + 1}")
        running = time.monotonic() - getattr(self, "_step_started", time.monotonic())
        if running > self.cfg.timeout_s:
            late = [r for r, ref in enumerate(refs) if ref not in ready]
            raise LearnerDied(f"learner train_step {self.step + 1}: ranks {late} gave no answer "
                              f"in {running:.0f} s (learner.timeout_s={self.cfg.timeout_s})")
        return False

    def finish_train_step(self, refs: list) -> dict[str, Any]:
        """The metrics of the step ``refs`` (from ``start_train_step``) ran."""
        per_rank = self._get(refs, f"train_step {self.step + 1}")
        self.step = int(per_rank[0]["step"])
        metrics = dict(per_rank[0])
        metrics["loss_per_rank"] = [m["loss"] for m in per_rank]
        metrics["checksum_per_rank"] = [m["param_checksum"] for m in per_rank]
        metrics["step_time_s"] = max(m["time_s"] for m in per_rank)
        return metrics

    def logprobs(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        """Per-token log-probs under the current weights (index i scores token i; index 0 is 0)."""
        batch = pack(list(trajectories), [0.0] * len(trajectories))
        ref = self._get([a.logprobs.remote(batch) for a in self.actors], "logprobs")[0]
        return [[0.0] + ref[i, :len(t.token_ids) - 1].tolist() for i, t in enumerate(trajectories)]

    def state_dict_ref(self) -> ray.ObjectRef:
        """The full state dict of the current weights, put into the object store once."""
        return self.publish_ref(adapter=False)[0]

    @property
    def publishes_adapter(self) -> bool:
        """Whether a publish sends only the LoRA adapter (``learner.lora.sync: adapter``)."""
        return self.cfg.lora is not None and self.cfg.lora.sync == "adapter"

    def publish_ref(self, adapter: Optional[bool] = None) -> tuple[ray.ObjectRef, int]:
        """(ObjectRef, bytes) of what a publish sends, put into the object store once: the
        LoRA adapter when ``adapter`` (default: ``publishes_adapter``), else the full state
        dict (a LoRA learner's merged)."""
        adapter = self.publishes_adapter if adapter is None else adapter
        calls = [a.publish_adapter.remote() if adapter else a.publish_state_dict.remote()
                 for a in self.actors]
        ref, nbytes = self._get(calls, "publish")[0]
        self.last_publish_bytes = int(nbytes)
        return ref, int(nbytes)

    def save(self, directory: str) -> str:
        tags = self._get([a.save.remote(directory) for a in self.actors], "save")
        return tags[0]

    def load(self, directory: str, tag: Optional[str] = None) -> int:
        steps = self._get([a.load.remote(directory, tag) for a in self.actors], "load")
        self.step = steps[0]
        return self.step

    def export(self, directory: str) -> str:
        """The policy in Hugging Face format; a LoRA learner's merged, with its adapter in
        ``directory/adapter``."""
        out = self._get([a.export.remote(directory) for a in self.actors], "export")[0]
        if self.cfg.lora is not None:
            self._get([a.export_adapter.remote(str(Path(directory) / "adapter"))
                       for a in self.actors], "export adapter")
        return out

    def sync_address(self) -> tuple[str, int]:
        """Rank 0's node and a free port there, for the NCCL weight-sync group."""
        return self._get([self.actors[0].address.remote(False)], "sync address")[0]

    def sync_init(self, addr: str, port: int, world: int) -> list:
        return self._get([a.sync_init.remote(addr, port, world) for a in self.actors], "sync_init")[0]

    def sync_broadcast(self) -> None:
        self._get([a.sync_broadcast.remote() for a in self.actors], "sync_broadcast")

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []
