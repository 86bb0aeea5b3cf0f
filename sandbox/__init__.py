"""Isolation backends (bubblewrap, unshare + rlimits, docker) and the in-sandbox worker that runs
environments, verifiers and replays. Threat model, backends and figures: docs/sandbox.md.

- ``worker``: ``SandboxWorker``, one isolated, long-lived child process, replaced on crash/hang;
  ``runtime`` (with ``determinism``, ``statediff``, ``idmap``): what runs inside it.
- ``child``, ``child_server``, ``confine``, ``seccomp``, ``ipc``: the child (the clean parent that
  never runs environment code), its confinement and its request loop; ``episode``, ``verifier``,
  ``spares``, ``handoff``: each episode and each verify in its own fork.
- ``protocol``, ``sanitize``: framing, exact reply shapes, text made safe at the boundary;
  ``backends``, ``docker_backend``, ``docker``: starting and killing a child; ``config``,
  ``errors``; ``selftest*``: the hostile suite; ``examples``: a small benign environment.

May import: envs.spec, envs.trajectory, pydantic, the standard library (the docker backend runs the
docker CLI as a subprocess). Never Ray or torch.
"""
