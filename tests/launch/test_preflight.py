"""The pre-flight of the training commands (``launch/preflight.py``): explicit ``learner.dtype:
bf16`` on a CPU learner without native bf16 is refused by ``envsched train`` and ``envsched
compare`` in one line (exit 2) before any pool, warm start or Ray; ``auto`` passes and says which
dtype in one line; on a cluster (``--address``) the driver's CPU only warns. The CPU is a given
cpuinfo (``precision.CPUINFO`` pointed at a fixture), so the tests mean the same on every machine.
``envsched bench gain``'s is in test_bench_gain.py. No Ray starts here."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.learner import precision
from launch.cli import main
from launch.config import load_config

CPUINFOS = Path(__file__).resolve().parents[1] / "fixtures" / "cpuinfo"
ZEN3 = CPUINFOS / "epyc_zen3_avx2.txt"          # an AVX2-only AMD EPYC: no native bf16
ZEN4 = CPUINFOS / "epyc_zen4_avx512_bf16.txt"   # AVX512-BF16


@pytest.fixture
def nothing_long_may_start(monkeypatch):
    """Pool generation, the warm start and Ray fail the test if reached (they are what the
    pre-flight must come before); the CPU is the AVX2-only EPYC's."""
    import launch.cluster
    import launch.run.trainer as trainer

    def reached(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} started before the pre-flight refused")
        return fail

    monkeypatch.setattr(precision, "CPUINFO", ZEN3)
    monkeypatch.setattr(trainer, "generate_pool", reached("pool generation"))
    monkeypatch.setattr(trainer, "warm_start", reached("the warm start"))
    monkeypatch.setattr(trainer, "connect", reached("Ray"))
    monkeypatch.setattr(launch.cluster, "connect", reached("Ray"))


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith(f"envsched {command}: error: pre-flight checks failed") \
        and err.count("\n") == 1, err
    assert "learner.dtype is bf16 on CPU ranks, but this CPU reports neither amx_bf16 nor " \
           "avx512_bf16" in err and "fix: set learner.dtype: fp32 (or auto)" in err
    return err


def test_train_refuses_bf16_on_a_cpu_without_it_before_the_pool_and_warm_start(
        tmp_path, capsys, nothing_long_may_start):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "learner.dtype=bf16",
                 "controller.progress_bar=false"]) == 2
    _one_line(capsys, "train")
    assert not (run / "pool").exists() and not (run / "sft").exists()


def test_compare_refuses_bf16_on_a_cpu_without_it_before_the_shared_pool(
        tmp_path, capsys, nothing_long_may_start):
    out = tmp_path / "cmp"
    assert main(["compare", "--schedulers", "random", "--seeds", "1", "--out", str(out),
                 "learner.dtype=bf16"]) == 2
    _one_line(capsys, "compare")
    assert not out.exists()


def test_auto_passes_and_says_which_dtype_in_one_line(tmp_path, monkeypatch):
    from launch.preflight import preflight

    lines: list[str] = []
    cfg = load_config(None, ["learner.dtype=auto"])
    for cpu, said in ((ZEN3, "learner dtype: auto -> fp32 (this CPU has neither amx_bf16 nor "
                              "avx512_bf16)"),
                      (ZEN4, "learner dtype: auto -> bf16 (this CPU has avx512_bf16)")):
        monkeypatch.setattr(precision, "CPUINFO", cpu)
        lines.clear()
        preflight(cfg, tmp_path / "run", log=lines.append)
        assert said in lines, lines


def test_on_a_cluster_the_drivers_cpu_only_warns(tmp_path, monkeypatch):
    """The learner ranks run elsewhere: each checks its own CPU before DeepSpeed starts."""
    from launch.preflight import preflight

    monkeypatch.setattr(precision, "CPUINFO", ZEN3)
    lines: list[str] = []
    preflight(load_config(None, ["learner.dtype=bf16"]), tmp_path / "run",
              address="ray://head:10001", log=lines.append)
    assert any(ln.startswith("[warn] learner dtype: learner.dtype is bf16") for ln in lines), lines
