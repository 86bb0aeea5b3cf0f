"""Isolation backends (bubblewrap, unshare + rlimits, docker) and the in-sandbox worker that runs
environments, verifiers and replays. Threat model, backends and figures: docs/sandbox.md.

- ``runtime``      in-process episode engine (what runs inside a worker): load, reset, step, verify,
                   replay; ``determinism`` (seeded random/uuid/clock), ``statediff``, ``idmap``
- ``worker``       ``SandboxWorker``: one isolated, long-lived child process, replaced on crash/hang
- ``child``, ``child_server``, ``confine``, ``seccomp``, ``ipc``: the child (the clean parent
                   that never runs environment code), its confinement (SysV IPC bounded and
                   emptied per episode: ``ipc``) and its request loop
- ``episode``, ``verifier``, ``spares``, ``handoff``: each episode and each verify in its own fork
                   of the clean parent; the final state handed to the checks as plain data
- ``protocol``, ``sanitize``: framing, exact reply shapes, text made safe at the boundary
- ``backends``, ``docker_backend``: how a child is started and killed; ``config``: ``SandboxConfig``
- ``docker``       the docker backend's image: recipe, daemon start, cached build
- ``errors``       ``SandboxError`` (typed ``kind``), ``EnvLoadError``
- ``selftest``, ``selftest_integrity``, ``selftest_limits``: the hostile suite; ``examples``: a
                   small benign environment

May import: envs.spec, envs.trajectory, pydantic, the standard library (the docker backend runs the
docker CLI as a subprocess).
Never Ray or torch.
"""
