"""``envsched bench mfu``: the FLOP accounting is the documented formula, and a run on the tiny
policy reports every figure. Utilisation is only checked to be positive: on a shared 2-core host
the wall-clock peak probe of a small matmul can be slower than the model's step."""

from __future__ import annotations

import json
from types import SimpleNamespace

from launch.bench.mfu import work_flops
from launch.cli import main


def test_work_flops_counts_6pn_and_the_work_actually_run():
    cfg = SimpleNamespace(hidden_size=4, vocab_size=10, num_hidden_layers=1,
                          num_attention_heads=2, head_dim=2)
    six_pn, hw = work_flops(cfg, params=100, batch=1, seq=4, scored=2)
    assert six_pn == 6 * 100 * 4
    # 6 x 60 non-embedding params x 4 tokens + 6 x d x V x 2 scored + 12 x 1 x 4 x 4^2 / 2
    assert hw == 1440 + 480 + 384


def test_a_tiny_policy_run_reports_rates_and_utilisation(capsys):
    from actors.policy import build_tiny_policy

    assert main(["bench", "mfu", "--model", str(build_tiny_policy()), "--seq", "32",
                 "--batch", "2", "--steps", "1", "--peak-n", "256", "--peak-reps", "3",
                 "--dtypes", "fp32", "--generate", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    run = out["runs"][0]
    assert run["dtype"] == "fp32" and run["tokens_per_step"] == 64 and run["tokens_per_s"] > 0
    assert 0 < run["mfu"] and 0 < run["cpu_mfu"] and run["peak_gflops"] > 0
    assert out["generate"]["generated"] == 3 and out["generate"]["decode_cpu_s_per_token"] > 0


def test_bad_dtypes_are_a_one_line_error(capsys):
    assert main(["bench", "mfu", "--dtypes", "fp16"]) == 2
    assert "--dtypes must list" in capsys.readouterr().err
