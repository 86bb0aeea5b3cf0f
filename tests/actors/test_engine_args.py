"""``rollout.engine_kwargs`` are checked at config load against the engine's own arguments (vLLM's
``AsyncEngineArgs`` when vllm imports, else the documented known keys), and a vLLM rollout actor
must hold as many GPUs as its engine shards over."""

import dataclasses
import sys
import types

import pytest

from actors.rollout.engine_args import VLLM_KNOWN_KEYS, check_engine_kwargs, gpus_per_engine
from launch.config import REPO, ConfigError, load_config

GPU = REPO / "configs" / "gpu_single_node.yaml"


def test_the_common_vllm_settings_load_from_config():
    kw = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "max_model_len": 16384,
          "dtype": "bfloat16", "enforce_eager": True, "enable_prefix_caching": False}
    cfg = load_config(GPU, [f"rollout.engine_kwargs={kw}", "cluster.rollout.num_gpus=2"])
    assert cfg.rollout.engine_kwargs == kw


def test_a_misspelt_key_is_named_with_the_fix():
    with pytest.raises(ConfigError, match=r"engine_kwargs\.gpu_memory_utilisation .*did you mean "
                                          r"'gpu_memory_utilization'"):
        load_config(GPU, ["rollout.engine_kwargs={gpu_memory_utilisation: 0.9}"])


def test_keys_envsched_sets_itself_are_refused():
    with pytest.raises(ConfigError, match=r"engine_kwargs\.model is set by envsched"):
        load_config(GPU, ["rollout.engine_kwargs={model: Qwen/Qwen3-8B}"])


def test_hf_engine_kwargs_are_checked_against_the_hf_engine():
    assert load_config(None, ["rollout.engine_kwargs={prefix_cache: 8}"]).rollout.engine_kwargs \
        == {"prefix_cache": 8}
    with pytest.raises(ConfigError, match="not a hf engine argument"):
        load_config(None, ["rollout.engine_kwargs={tensor_parallel_size: 2}"])


@pytest.mark.parametrize("tp, gpus, ok", [(2, 2, True), (2, 1, False), (1, 4, False), (4, 4, True),
                                          (1, 0.5, True), (2, 0.5, False)])
def test_a_rollout_actor_holds_as_many_gpus_as_its_tensor_parallel_size(tp, gpus, ok):
    ov = [f"rollout.engine_kwargs={{tensor_parallel_size: {tp}}}",
          f"cluster.rollout.num_gpus={gpus}"]
    if ok:  # an unsharded engine may also take a fraction of one GPU (sharing it)
        assert load_config(GPU, ov).cluster.rollout.num_gpus == gpus
    else:
        with pytest.raises(ConfigError, match=f"set cluster.rollout.num_gpus={tp}"):
            load_config(GPU, ov)


def test_gpus_per_engine_multiplies_tensor_and_pipeline_parallel():
    assert gpus_per_engine({}) == 1
    assert gpus_per_engine({"tensor_parallel_size": 2, "pipeline_parallel_size": 3}) == 6


def test_with_vllm_importable_its_engine_args_signature_decides(monkeypatch):
    """The driver's vllm decides: a key of its AsyncEngineArgs that our fallback list lacks passes,
    a key of our list that this vllm lacks fails."""

    @dataclasses.dataclass
    class AsyncEngineArgs:
        model: str = ""
        tensor_parallel_size: int = 1
        brand_new_knob: int = 0

    fake = types.ModuleType("vllm")
    fake.AsyncEngineArgs = AsyncEngineArgs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    assert "brand_new_knob" not in VLLM_KNOWN_KEYS
    assert check_engine_kwargs("vllm", {"brand_new_knob": 3}) == {"brand_new_knob": 3}
    with pytest.raises(ValueError, match="checked against vllm.AsyncEngineArgs"):
        check_engine_kwargs("vllm", {"max_num_seqs": 8})


@pytest.mark.parametrize("learner_gpus, rollout_gpus, num, method, want", [
    (1, 1, 4, "auto", "auto"),               # GPUs of their own: collective for vLLM engines
    (0, 0, 1, "auto", "auto"),               # CPUs: gloo, never a shared device
    (0.5, 0.5, 1, "auto", "object_store"),   # learner rank 0 and the vLLM worker on one GPU
    (1, 0.5, 2, "auto", "object_store"),     # two vLLM workers on one GPU
    (1, 0.5, 1, "auto", "auto"),             # a whole GPU is the learner's alone
    (0.5, 0.5, 1, "collective", "collective"),  # said outright: kept
])
def test_auto_weight_sync_leaves_nccl_when_a_gpu_may_hold_two_group_members(
        learner_gpus, rollout_gpus, num, method, want):
    cfg = load_config(GPU, [f"learner.num_gpus_per_rank={learner_gpus}",
                            f"cluster.rollout.num_gpus={rollout_gpus}",
                            f"cluster.rollout.num={num}", f"learner.weight_sync={method}"])
    assert cfg.weight_sync == want
