"""Isolation backends (bubblewrap, unshare + rlimits, docker) and the in-sandbox worker that runs
environments, verifiers and replays. Threat model, backends and figures: docs/sandbox.md.

- ``runtime``      in-process episode engine (what runs inside a worker): load, reset, step, verify,
                   replay; ``determinism`` (seeded random/uuid/clock), ``statediff``, ``idmap``
- ``worker``       ``SandboxWorker``: one isolated, long-lived child process, replaced on crash/hang
- ``child``, ``child_server``, ``protocol``: the child's confinement, request loop and framing
- ``backends``, ``docker_backend``: how a child is started and killed; ``config``: ``SandboxConfig``
- ``errors``       ``SandboxError`` (typed ``kind``), ``EnvLoadError``
- ``selftest``     the hostile suite; ``examples``: a small benign environment

May import: envs.spec, envs.trajectory, pydantic, the standard library, and the docker SDK (lazily).
Never Ray or torch.
"""
