"""Versioned publication of the learner's weights to the rollout engines: one interface, two paths.

``WeightSync.publish(learner, version) -> SyncReport`` (seconds, bytes published); the version
is the learner step, which each engine reports (``engine.version``) for every later generation.

- ``ObjectStoreSync`` (CPU, any cluster): rank 0 gathers the full state dict (every rank takes
  part under ZeRO-3), ``ray.put``s it once, and every target gets the same ObjectRef
  (``target.update_weights(named_tensors, version)``); a LoRA learner
  (``LearnerGroup.publishes_adapter``) sends only its adapter (``target.update_adapter``).
- ``CollectiveSync`` (vLLM engines): a separate group {learner rank 0, every vLLM worker}
  (``stateless_comm``: NCCL on GPUs, gloo on CPUs); rank 0 broadcasts each parameter in turn and
  the workers load it as it arrives (``VLLMWorkerExtension``). Target contract:
  ``num_sync_workers() -> int``, ``init_weight_sync(addr, port, rank_offset, world_size)``,
  ``receive_weights(meta, version, wait_idle)``; ``wait_idle`` (unless partial rollout is on)
  keeps weights from changing under a running generation.

Not covered: NCCL needs one GPU per rank; learner rank 0 must not share its GPU with a vLLM
worker (a known NCCL failure). See docs/learner.md.

May import: ray, torch and vllm (inside functions), the learner's plain modules.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import ray


@dataclass
class SyncReport:
    version: int
    seconds: float
    targets: int
    method: str
    bytes: int = 0   # what the learner published (once, whatever the number of targets)


class WeightSync(abc.ABC):
    """Publish the learner's current weights, tagged ``version``, to every target."""

    def __init__(self, targets: Sequence[Any], timeout_s: float = 600.0):
        self.targets = list(targets)
        self.timeout_s = timeout_s

    def publish(self, learner, version: int) -> SyncReport:
        """The adapter through the object store when the learner publishes one (any engine),
        else the full weights by this sync's own path (``_publish_weights``)."""
        if getattr(learner, "publishes_adapter", False):
            return self._publish_adapter(learner, version)
        return self._publish_weights(learner, version)

    @abc.abstractmethod
    def _publish_weights(self, learner, version: int) -> SyncReport: ...

    def _publish_adapter(self, learner, version: int) -> SyncReport:
        """``target.update_adapter(adapter, version)`` on every target: a LoRA adapter is
        megabytes, so the object store serves every engine (the collective group is for the
        full weights)."""
        t0 = time.perf_counter()
        ref, nbytes = learner.publish_ref()
        remote = [t.update_adapter.remote(ref, version) for t in self.targets
                  if _is_actor(t, "update_adapter")]
        local = [t for t in self.targets if not _is_actor(t, "update_adapter")]
        if local:
            adapter = ray.get(ref, timeout=self.timeout_s)
            for t in local:
                t.update_adapter(adapter, version)
        self._wait(remote, f"update_adapter(version={version})")
        return SyncReport(version, time.perf_counter() - t0, len(self.targets), "adapter", nbytes)

    def _wait(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise TimeoutError(f"weight sync {what} timed out after {self.timeout_s} s") from e


def _is_actor(target: Any, method: str = "update_weights") -> bool:
    return hasattr(getattr(target, method, None), "remote")


class ObjectStoreSync(WeightSync):
    def _publish_weights(self, learner, version: int) -> SyncReport:
        t0 = time.perf_counter()
        ref = learner.state_dict_ref()
        remote = [t.update_weights.remote(ref, version) for t in self.targets if _is_actor(t)]
        local = [t for t in self.targets if not _is_actor(t)]
        if local:
            state = ray.get(ref, timeout=self.timeout_s)
            for t in local:
                t.update_weights(state, version)
        self._wait(remote, f"update_weights(version={version})")
        return SyncReport(version, time.perf_counter() - t0, len(self.targets), "object_store",
                          getattr(learner, "last_publish_bytes", 0))


class CollectiveSync(WeightSync):
    """The group is built on the first publish and rebuilt whenever its membership changes
    (``targets`` set to another set of actors, e.g. a replaced rollout worker): a new member has
    no communicator, and a group that still counts a dead member hangs its broadcast."""

    def __init__(self, targets: Sequence[Any], partial_rollout: bool = False,
                 timeout_s: float = 600.0):
        self.meta = None
        super().__init__(targets, timeout_s)
        self.partial_rollout = partial_rollout

    @property
    def targets(self) -> list:
        return self._targets

    @targets.setter
    def targets(self, value: Sequence[Any]) -> None:
        value = list(value)
        if _members(value) != _members(getattr(self, "_targets", [])):
            self.meta = None   # reconnect everyone, learner rank 0 included, on the next publish
        self._targets = value

    def _connect(self, learner) -> None:
        counts = self._wait([t.num_sync_workers.remote() for t in self.targets], "worker count")
        world = 1 + sum(counts)
        addr, port = learner.sync_address()
        offsets = [1 + sum(counts[:i]) for i in range(len(counts))]
        refs = [t.init_weight_sync.remote(addr, port, off, world)
                for t, off in zip(self.targets, offsets)]
        self.meta = learner.sync_init(addr, port, world)
        self._wait(refs, "init_weight_sync")

    def _publish_weights(self, learner, version: int) -> SyncReport:
        if getattr(learner, "cfg", None) is not None and learner.cfg.lora is not None:
            # a LoRA learner's parameters are the injected model's; the engines take the
            # merged base weights, which rank 0 computes: the object store's path
            return ObjectStoreSync(self.targets, self.timeout_s)._publish_weights(learner, version)
        t0 = time.perf_counter()
        if self.meta is None:
            self._connect(learner)
        wait_idle = not self.partial_rollout
        refs = [t.receive_weights.remote(self.meta, version, wait_idle) for t in self.targets]
        learner.sync_broadcast()
        self._wait(refs, f"receive_weights(version={version})")
        nbytes = sum(_numel(shape) * _itemsize(dtype) for _, dtype, shape in self.meta)
        return SyncReport(version, time.perf_counter() - t0, len(self.targets), "collective",
                          nbytes)


def _members(targets: Sequence[Any]) -> tuple:
    """Who the targets are: Ray actor ids (a restarted worker has a new one), else objects."""
    return tuple(getattr(t, "_actor_id", None) or id(t) for t in targets)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype: str) -> int:
    import torch  # lazy: keeps torch out of the driver's import

    return getattr(torch, dtype).itemsize


def make_weight_sync(targets: Sequence[Any], method: str = "auto", partial_rollout: bool = False,
                     timeout_s: float = 600.0) -> WeightSync:
    """``auto``: the collective group when the targets speak it (vLLM engines), else the object
    store."""
    if method not in ("auto", "collective", "object_store"):
        raise ValueError(f"weight sync method must be auto, collective or object_store, got "
                         f"{method!r}")
    nccl = method == "collective" or (method == "auto" and targets and all(
        hasattr(getattr(t, "receive_weights", None), "remote") for t in targets))
    if nccl:
        return CollectiveSync(targets, partial_rollout, timeout_s)
    return ObjectStoreSync(targets, timeout_s)


# -- inside the processes: learner ranks and vLLM workers ---------------------------------------

class _NcclComm:
    """vLLM's ``PyNcclCommunicator`` over a ``StatelessProcessGroup`` (GPUs)."""

    backend = "nccl"

    def __init__(self, addr: str, port: int, rank: int, world: int, device):
        # lazy: vllm only in vLLM workers and GPU learner ranks (these two imports)
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=addr, port=port, rank=rank, world_size=world)
        self.comm = PyNcclCommunicator(group, device=device)

    def broadcast(self, tensor, src: int) -> None:
        import torch  # lazy: keeps torch out of the driver's import

        self.comm.broadcast(tensor, src=src, stream=torch.cuda.current_stream())

    def synchronize(self) -> None:
        import torch  # lazy: keeps torch out of the driver's import

        torch.cuda.synchronize()


class _GlooComm:
    """The same group on CPUs: a gloo process group over its own ``TCPStore`` (rank 0 hosts it),
    never the process's default group (DeepSpeed's on a learner rank, vLLM's in its workers).
    Everything above it -- set-up, rank offsets, per-tensor broadcast, the worker extension -- is
    the NCCL path's, so a CPU test runs the code a GPU run uses but for this class."""

    backend = "gloo"

    def __init__(self, addr: str, port: int, rank: int, world: int, device, timeout_s=600.0):
        import torch.distributed as dist  # lazy: keeps torch out of the driver's import

        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=timeout)
        self.group = dist.ProcessGroupGloo(store, rank, world, timeout)

    def broadcast(self, tensor, src: int) -> None:
        self.group.broadcast(tensor, src).wait()

    def synchronize(self) -> None:
        pass


def stateless_comm(addr: str, port: int, rank: int, world: int, device):
    """The weight-sync group's communicator for ``device``: NCCL on CUDA, gloo on CPU."""
    kind = getattr(device, "type", str(device))
    return (_NcclComm if kind == "cuda" else _GlooComm)(addr, port, rank, world, device)


def learner_sync_init(engine, addr: str, port: int, world: int) -> list:
    """On every learner rank: rank 0 joins the sync group; returns [(name, dtype, shape)]."""
    meta = []
    for name, p in engine.engine.module.named_parameters():
        shape = tuple(getattr(p, "ds_shape", p.shape))
        meta.append((name, str(p.dtype).removeprefix("torch."), shape))
    if engine.rank == 0:
        engine.sync_comm = stateless_comm(addr, port, 0, world, engine.device)
    return meta


def learner_sync_broadcast(engine) -> None:
    """On every learner rank (ZeRO-3 gathers are collective); rank 0 broadcasts each parameter."""
    for _, tensor in engine.iter_full_params():
        if engine.rank == 0:
            engine.sync_comm.broadcast(tensor.contiguous(), src=0)
    if engine.rank == 0:
        engine.sync_comm.synchronize()


def load_into_runner(runner, weights) -> None:
    """Load ``weights`` (an iterable of (name, tensor)) into a vLLM model runner, in order.
    ``reload_weights`` where vLLM has it: the layerwise in-place reload redoes the post-load
    processing (e.g. the CPU backend's repacked linear weights, whose parameters lose their
    weight_loader); else the model's ``load_weights``."""
    if hasattr(runner, "reload_weights"):
        runner.reload_weights(weights_iterator=weights)
    else:
        runner.model.load_weights(weights=weights)
    _repack_cpu_lm_head(runner.get_model() if hasattr(runner, "get_model") else runner.model)


def _repack_cpu_lm_head(model) -> None:
    """vLLM's CPU backend packs a linear layer's weight once after loading; a tied ``lm_head`` gets
    no weights of its own on a reload and would go on sampling from the old embedding's packed
    copy. Pack it again from the (new) shared weight; GPUs have no packed copy."""
    head = getattr(model, "lm_head", None)
    if head is None or not hasattr(head, "cpu_linear") or getattr(head, "weight", None) is None:
        return
    # lazy: vllm is optional, only in vLLM workers
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)


class VLLMWorkerExtension:
    """Mixed into vLLM workers (``LLM(..., worker_extension_cls="actors.learner.weight_sync.
    VLLMWorkerExtension")``); reached through ``collective_rpc``."""

    def init_weight_sync(self, addr: str, port: int, rank_offset: int, world: int) -> None:
        from vllm.distributed.parallel_state import get_world_group  # lazy: vLLM worker only

        rank = get_world_group().rank + rank_offset
        self.sync_comm = stateless_comm(addr, port, rank, world, self.device)

    def receive_weights(self, meta: list, version: int) -> int:
        """Receive every parameter of ``meta`` in the learner's order and load it as it arrives
        (one tensor in flight: no second copy of the model)."""
        import torch  # lazy: keeps torch out of the driver's import

        received = []

        def arriving():
            for name, dtype, shape in meta:
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
                self.sync_comm.broadcast(buf, src=0)
                received.append(name)
                yield name, buf

        load_into_runner(self.model_runner, arriving())
        if len(received) != len(meta):  # the learner still broadcasts: the group would hang
            raise RuntimeError(f"receive_weights: the loader took {len(received)} of "
                               f"{len(meta)} parameters")
        self.sync_comm.synchronize()
        return version
