"""Isolation backends (bubblewrap, unshare + rlimits, docker) and the in-sandbox worker that runs
environments, verifiers and replays.

May import: envs.spec, envs.trajectory, the standard library, and the docker SDK (lazily).
Never Ray or torch.
"""
