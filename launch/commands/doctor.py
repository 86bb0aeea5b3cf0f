"""Check this machine and Ray cluster against a config: envsched doctor [--config CFG] [--address A]

    envsched doctor [--config FILE] [--address auto|HOST:PORT|ray://HOST:PORT] [--out RUN_DIR]
                    [key.sub=value ...]

First the machine line (``launch.machine.machine_line``: CPU model and its avx2 / avx512f /
avx512_bf16 / amx_bf16 flags, cores, memory, GPUs), then one line per check with its fix
(``launch/doctor.py``, ``launch/preflight.py``): Python and package versions, CUDA and
NCCL, DeepSpeed's accelerator per role, bubblewrap/unshare/docker, the policy, pool, graph cache
and free disk for checkpoints, the learner's dtype on this machine (``learner.dtype: auto``
resolved; explicit bf16 on a CPU without native bf16 is a blocker, as it is before ``envsched
train``), and the Ray cluster's resources against what every role asks
(joined with ``--address`` or ``cluster.address``; without one, the node an embedded Ray would
have). Exit code 1 when any check is a blocker (FAIL), else 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.config import ConfigError, load_config
from launch.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="YAML config (default: configs/cpu_demo.yaml)")
    parser.add_argument("--address", default=None, help="Ray cluster to check (default: "
                        "cluster.address, else this machine as an embedded Ray would see it)")
    parser.add_argument("--out", default=None, help="run directory (disk and graph cache checks)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                        help="dotted config overrides")


def run(args: argparse.Namespace) -> int:
    from launch import doctor  # lazy: keeps envsched --help fast
    from launch.machine import machine_line
    from launch.preflight import preflight_checks

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        raise UserError(str(e)) from None
    address = args.address or cfg.cluster.address
    print(machine_line(), flush=True)
    checks = preflight_checks(cfg, Path(args.out) if args.out else None, local=not address)
    if address:
        import ray  # lazy: keeps envsched --help fast (Ray only with --address)

        from launch.cluster import connect  # lazy: keeps envsched --help fast

        connect(cfg.cluster, address)   # joins as `envsched train` would (RAY_AUTH_MODE, env)
        try:
            nodes = doctor.ray_nodes()
        finally:
            ray.shutdown()
    else:
        nodes = doctor.local_nodes(cfg.cluster)
    checks += doctor.resource_checks(cfg, nodes)
    for check in checks:
        print(check.line(), flush=True)
    failed = doctor.blockers(checks)
    print(f"{len(checks)} checks: {len(failed)} blocker(s)" if failed else
          f"{len(checks)} checks: ready")
    return 1 if failed else 0
