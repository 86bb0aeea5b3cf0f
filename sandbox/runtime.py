"""The in-process episode engine: what runs *inside* a sandbox worker (no isolation here).

``EpisodeRuntime(env)`` execs an environment's class source into a fresh namespace (EnvScaler's
contract, see ``envs.spec``), then per episode: ``reset(initial_state, seed)``; ``step(tool,
arguments) -> ActionStep`` (observation and recursive state diff); ``verify(checks)`` runs each
``check_func(final_state)`` with ``initial_state`` as a global, reward = fraction passed;
``replay`` runs a fixed action list from a fresh reset (``sandbox.idmap`` for unseeded traces).

Errors: a bad environment raises ``EnvLoadError`` naming env id, line and exception. A bad tool
call (unknown tool, arguments that do not bind or nest deeper than ``MAX_ARGUMENT_DEPTH``, the
tool raising any ``BaseException`` or running past ``timeout_s``) is not raised: it is an
``ActionStep`` with ``error`` set and observation ``{"success": False, "error": ...}``, as the
agent sees it. A check passes only on exactly ``True`` (``bool`` or ``numpy.bool_``); one that
raises or runs past its time fails with ``error`` set.

Per-call timeouts use SIGALRM (main thread only); the worker's wall-clock kill is the backstop.

May import: envs.spec, envs.trajectory, sandbox.*, the standard library (numpy lazily).
"""

from __future__ import annotations

import inspect
import pickle
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Any, Iterable, Optional, Union

from envs.spec import REFUSED_CALL_METHOD, REFUSED_CALL_TOOL, Check, Environment, ToolCall
from envs.trajectory import ActionStep, CheckResult, VerifyResult
from sandbox.determinism import EpisodeClock, episode_builtins
from sandbox.errors import EnvLoadError, SandboxError
from sandbox.idmap import IdMapper
from sandbox.protocol import argument_depth_error
from sandbox.statediff import compact, fast_copy, loads, new_diff, state_view, sync_diff


class _Deadline(BaseException):
    """Raised by SIGALRM; a BaseException so a tool's ``except Exception`` does not swallow it."""


@contextmanager
def deadline(seconds: Optional[float]):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _fire(signum, frame):
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def describe(exc: BaseException, filename_prefix: str) -> str:
    """``Type: message (line N)`` with the line of the innermost frame in environment/check code.
    Never raises: the exception is the environment's, and so are its ``__str__`` and type."""
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename.startswith(filename_prefix):
            line = lineno
    where = f" (line {line})" if line is not None else ""
    try:
        name, text = str(type(exc).__name__), str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not turn an error into a crash
        name, text = "BaseException", "<the exception could not be printed>"
    return f"{name}: {text}{where}"


def compile_source(env: Environment) -> Any:
    """The environment's code object (compiling runs none of it); ``EnvLoadError`` if it does not
    compile."""
    try:
        return compile(env.source, f"<env {env.env_id}>", "exec")
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None)
        raise EnvLoadError(env.env_id, f"{type(e).__name__} at line {line}: "
                                       f"{getattr(e, 'msg', e)}") from None


def _load_class(env: Environment, table: dict[str, Any], filename: str,
                code: Optional[Any] = None) -> type:
    code = code if code is not None else compile_source(env)
    namespace: dict[str, Any] = {"__builtins__": table, "__name__": f"envsched_env_{env.env_id}"}
    try:
        exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - any failure while importing the source (SystemExit,
        # KeyboardInterrupt and custom BaseExceptions too) is a load error, not a dead episode
        raise EnvLoadError(env.env_id, f"executing the source raised {describe(e, filename)}") \
            from None
    cls = namespace.get(env.class_name)
    if not isinstance(cls, type):
        found = sorted(k for k, v in namespace.items() if isinstance(v, type))
        raise EnvLoadError(env.env_id, f"the source defines no class {env.class_name!r} "
                                       f"(classes found: {found})")
    return cls


class EpisodeRuntime:
    """One environment, many episodes; not thread-safe (one per sandbox worker)."""

    def __init__(self, env: Environment, code: Optional[Any] = None,
                  clock: Optional[EpisodeClock] = None):
        """``code``: the source already compiled (``compile_source``), to skip compiling it;
        ``clock``: a fresh ``EpisodeClock`` made ahead of time (a spare process prepares one)."""
        self.env = env
        self.clock = clock or EpisodeClock()
        self._builtins = episode_builtins(self.clock)
        self._file = f"<env {env.env_id}>"
        self.cls = _load_class(env, self._builtins, self._file, code)
        self._tools = set(env.tool_names)
        self._signatures: dict[str, inspect.Signature] = {}
        self._check_code: dict[str, Any] = {}
        self._uses_numpy = "numpy" in env.source
        self.instance: Any = None
        self.seed: Optional[int] = None
        self._shadow: Optional[dict[str, Any]] = None  # deep copy of the state before a step
        self._pristine = False  # no step or verify since reset: live state == initial snapshot
        self._initial_blob: Optional[bytes] = None
        self._initial: Any = None

    # ----------------------------------------------------------------- episode
    def reset(self, initial_state: dict[str, Any], seed: int = 0,
              state_blob: Optional[bytes] = None) -> None:
        """Start an episode. ``state_blob`` (the pickled state) skips one copy when given."""
        state = loads(state_blob) if state_blob is not None else fast_copy(initial_state)
        if not isinstance(state, dict):
            raise SandboxError("bad_request", f"initial state must be a dict, got "
                                              f"{type(state).__name__}", f"env {self.env.env_id}")
        self.clock.reseed(seed)
        self.seed = int(seed)
        if self._uses_numpy and "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(self.seed % 2**32)
        self.instance = self._construct(state)
        self._shadow, self._pristine = None, True
        self._keep_initial(state, state_blob)

    def _keep_initial(self, state: dict[str, Any], state_blob: Optional[bytes]) -> None:
        """Keep the initial snapshot as a pickle; when the constructor left the state exactly as
        given (the usual case) the caller's blob is reused instead of pickling it again."""
        snap = state_view(self.instance)
        if state_blob is not None and snap.keys() == state.keys() and \
                all(snap[k] is v for k, v in state.items()):
            self._initial_blob, self._initial = state_blob, None
            return
        try:
            self._initial_blob, self._initial = pickle.dumps(snap, pickle.HIGHEST_PROTOCOL), None
        except Exception:  # noqa: BLE001 - unpicklable state: keep a deep copy instead
            self._initial_blob, self._initial = None, fast_copy(snap)

    def _construct(self, state: dict[str, Any]) -> Any:
        try:
            with deadline(30.0):
                try:
                    instance = self.cls(state)
                except TypeError:
                    instance = self.cls()
                for key, value in state.items():
                    setattr(instance, key, value)
        except BaseException as e:  # noqa: BLE001 - reported, never raised raw (the deadline too)
            raise EnvLoadError(self.env.env_id, f"constructing {self.env.class_name} from the "
                                                f"initial state raised {describe(e, self._file)}") \
                from None
        return instance

    def _require_episode(self) -> None:
        if self.instance is None:
            raise SandboxError("bad_request", "no episode: call reset() first",
                               f"env {self.env.env_id}")

    def _method(self, tool: str) -> str:
        """The method a call of ``tool`` runs: the tool's own, or for ``REFUSED_CALL_TOOL`` on an
        environment that records refused calls, ``record_refused_call`` (``envs.spec``)."""
        refused = tool == REFUSED_CALL_TOOL and self.env.records_refused_calls
        return REFUSED_CALL_METHOD if refused else tool

    def _bind_error(self, tool: str, arguments: Any) -> Optional[str]:
        method_name = self._method(tool)
        if method_name == tool and (tool not in self._tools or tool.startswith("_")):
            return f"unknown tool {tool!r}; available tools: {sorted(self._tools)}"
        if not isinstance(arguments, dict):
            return f"arguments of {tool!r} must be a JSON object, got {type(arguments).__name__}"
        deep = argument_depth_error(tool, arguments)
        if deep is not None:
            return deep
        method = getattr(self.instance, method_name, None)
        if not callable(method):
            return f"tool {tool!r} is declared but {self.env.class_name} has no method {method_name}"
        sig = self._signatures.get(tool)
        if sig is None:
            try:
                sig = self._signatures[tool] = inspect.signature(method)
            except (TypeError, ValueError):
                return None
        try:
            sig.bind(**arguments)
        except TypeError as e:
            return f"bad arguments for {tool!r}: {e}"
        return None

    def step(self, tool: str, arguments: dict[str, Any],
             timeout_s: Optional[float] = None) -> ActionStep:
        """Run one tool call; failures come back in ``ActionStep.error`` (see module doc)."""
        self._require_episode()
        error = self._bind_error(tool, arguments)
        if error is not None:
            return ActionStep(tool, arguments, {"success": False, "error": error}, {}, error)
        shadow = self._before_step()
        try:
            with deadline(timeout_s):
                observation = getattr(self.instance, self._method(tool))(**fast_copy(arguments))
                # copied inside the try: a returned object's __reduce__/__deepcopy__ is tool code
                observation = fast_copy(observation)
        except _Deadline:
            error = f"timeout: tool {tool!r} ran longer than {timeout_s} s"
        except BaseException as e:  # noqa: BLE001 - the agent sees the tool's error; SystemExit,
            # KeyboardInterrupt, GeneratorExit and custom BaseExceptions included
            error = f"tool {tool!r} raised {describe(e, self._file)}"
        if error is not None:
            observation = {"success": False, "error": error}
        diff = new_diff()
        try:
            with deadline(timeout_s):
                sync_diff(shadow, state_view(self.instance), diff)
        except BaseException as e:  # noqa: BLE001 - state objects' __eq__ is environment code
            self._shadow = None  # half-synced: rebuilt from the live state at the next step
            error = f"diffing the state after {tool!r} failed: {describe(e, self._file)}"
            return ActionStep(tool, arguments, {"success": False, "error": error}, {}, error)
        return ActionStep(tool, arguments, observation, compact(diff), error)

    def _before_step(self) -> dict[str, Any]:
        # Built at the first step only: an episode that is reset and verified never pays for it.
        if self._shadow is None:
            self._shadow = (self.initial_snapshot() if self._pristine
                            else fast_copy(state_view(self.instance)))
        self._pristine = False
        return self._shadow

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the current state."""
        self._require_episode()
        return fast_copy(state_view(self.instance))

    def initial_snapshot(self) -> dict[str, Any]:
        """A deep copy of the state right after reset (what checks see as ``initial_state``)."""
        self._require_episode()
        if self._initial_blob is not None:
            return loads(self._initial_blob)
        return fast_copy(self._initial)

    # ----------------------------------------------------------------- verify
    def verify(self, checks: Iterable[Check], timeout_s: Optional[float] = None) -> VerifyResult:
        """Reward = fraction of checks passed (in this interpreter: trusted pools and tests; the
        sandbox uses ``sandbox.verifier``).

        Checks share the *live* final state (no copy) and one fresh copy of the initial snapshot,
        made only when a check names ``initial_state`` and a step ran since reset; a check that
        mutates ``final_state`` changes what later checks see (as EnvScaler's shared snapshot)."""
        self._require_episode()
        checks = list(checks)
        final = state_view(self.instance)
        if self._pristine:
            initial = final  # nothing ran since reset: the live state *is* the initial state
        elif needs_initial(checks):
            initial = self.initial_snapshot()
        else:
            initial = None
        self._pristine = False
        return VerifyResult.from_checks(run_checks(checks, final, initial, self._builtins,
                                                   timeout_s, self._check_code))

    # ----------------------------------------------------------------- replay
    def replay(self, initial_state: dict[str, Any], checks: list[Check],
               actions: list[Union[ToolCall, ActionStep, dict]], seed: Optional[int] = None,
               state_blob: Optional[bytes] = None, timeout_s: Optional[float] = None,
               ) -> tuple[VerifyResult, list[ActionStep]]:
        """Reset, run ``actions`` in order, verify. Actions that carry a recorded observation
        (``ActionStep`` or a dict with ``observation``) get ids minted in the recording mapped to
        those minted now (``sandbox.idmap``), so traces recorded without a seed replay too."""
        steps = self.run_actions(initial_state, actions, seed, state_blob, timeout_s)
        return self.verify(checks, timeout_s), steps

    def run_actions(self, initial_state: dict[str, Any],
                    actions: list[Union[ToolCall, ActionStep, dict]], seed: Optional[int] = None,
                    state_blob: Optional[bytes] = None, timeout_s: Optional[float] = None,
                    ) -> list[ActionStep]:
        """``replay`` without the verify: reset, then ``actions`` with id mapping."""
        self.reset(initial_state, 0 if seed is None else seed, state_blob)
        mapper = IdMapper(self.initial_snapshot)
        steps = []
        for action in actions:
            tool, arguments, recorded = _unpack(action)
            step = self.step(tool, mapper.substitute(arguments), timeout_s)
            if recorded is not _MISSING:
                mapper.learn(recorded, step.observation)
            steps.append(step)
        return steps


_MISSING = object()


def needs_initial(checks: list[Check]) -> bool:
    return any("initial_state" in c.code for c in checks)


def run_checks(checks: list[Check], final: dict, initial: Optional[dict],
               builtins_table: dict[str, Any], timeout_s: Optional[float],
               code_cache: Optional[dict[str, Any]] = None) -> list[CheckResult]:
    """Run each check's ``check_func(final)`` with ``initial_state`` as a global; a check that
    raises, returns a non-bool or runs past ``timeout_s`` fails with its ``error`` set."""
    cache = code_cache if code_cache is not None else {}
    return [run_check(c, final, initial, builtins_table, timeout_s, cache) for c in checks]


def _check_func(check: Check, initial: Optional[dict], builtins_table: dict[str, Any],
                cache: dict[str, Any]):
    code = cache.get(check.code)
    if code is None:
        code = compile(check.code, f"<check {check.check_id}>", "exec")
        if len(cache) > 4096:
            cache.clear()
        cache[check.code] = code
    namespace = {"__builtins__": builtins_table, "initial_state": initial}
    exec(code, namespace)
    return namespace["check_func"]


def run_check(check: Check, final: dict, initial: Optional[dict], builtins_table: dict[str, Any],
              timeout_s: Optional[float], cache: dict[str, Any]) -> CheckResult:
    """One check (see ``run_checks``); never raises."""
    try:
        with deadline(timeout_s):
            result = _check_func(check, initial, builtins_table, cache)(final)
    except _Deadline:
        return CheckResult(check.check_id, False, f"timeout: check ran longer than {timeout_s} s")
    except SyntaxError as e:
        return CheckResult(check.check_id, False, f"SyntaxError at line {e.lineno}: {e.msg}")
    except BaseException as e:  # noqa: BLE001 - a raising check counts 0, whatever it raised
        return CheckResult(check.check_id, False, describe(e, "<check "))
    return verdict(check.check_id, result)


def verdict(check_id: str, result: Any) -> CheckResult:
    """Only a genuine ``True`` passes: exactly ``bool``, or numpy's ``bool_`` (checks written with
    numpy comparisons return it). Any other type fails, truthy or not, so an object whose class
    is merely *named* ``bool_`` or that defines ``__bool__`` cannot pass."""
    kind = type(result)
    numpy = sys.modules.get("numpy")
    if kind is bool or (numpy is not None and kind is getattr(numpy, "bool_", bool)):
        return CheckResult(check_id, result is True or (kind is not bool and bool(result)))
    name = getattr(kind, "__name__", "?")
    return CheckResult(check_id, False, f"check_func returned {str(name)[:80]}, not bool")


def _unpack(action: Union[ToolCall, ActionStep, dict]) -> tuple[str, dict, Any]:
    if isinstance(action, ToolCall):
        return action.name, action.arguments, _MISSING
    if isinstance(action, ActionStep):
        return action.tool, action.arguments, action.observation
    if isinstance(action, dict):
        name = action.get("name", action.get("tool"))
        if not isinstance(name, str):
            raise SandboxError("bad_request", f"replay action needs a 'name' or 'tool', got "
                                              f"{str(action)[:120]}")
        return name, action.get("arguments", {}), action.get("observation", _MISSING)
    raise SandboxError("bad_request", f"replay action must be a ToolCall, ActionStep or dict, "
                                      f"got {type(action).__name__}")


def replay(env: Environment, initial_state: dict[str, Any], checks: list[Check],
           actions: list[Union[ToolCall, ActionStep, dict]], seed: Optional[int] = None,
           ) -> tuple[VerifyResult, list[ActionStep]]:
    """Load ``env`` in-process and replay ``actions`` from ``initial_state`` (no isolation)."""
    return EpisodeRuntime(env).replay(initial_state, checks, actions, seed)
