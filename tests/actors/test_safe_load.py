"""Learner checkpoint files are read as data (``actors.learner.safe_load``): DeepSpeed's own data
types load, a pickle naming anything else is refused and runs nothing."""

from __future__ import annotations

import pickle

import pytest
import torch

from actors.learner.safe_load import deepspeed_data_types, weights_only_loads


class _Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def test_deepspeed_optimizer_state_types_load_only_inside_the_context(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    state = {"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler(2.0),
             "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}],
             "tensor": torch.arange(3)}
    torch.save(state, tmp_path / "optim_states.pt")
    with weights_only_loads():
        back = torch.load(tmp_path / "optim_states.pt", weights_only=False)  # forced to True
    assert back["zero_stage"] is ZeroStageEnum.gradients
    assert back["loss_scaler"].cur_scale == 2.0
    assert back["param_slice_mappings"][0]["w"] == fragment_address(numel=4, start=0)
    assert torch.equal(back["tensor"], torch.arange(3))
    assert torch.load.__name__ == "load" and torch.load.__module__ == "torch.serialization"
    assert len(deepspeed_data_types()) == 4


def test_a_planted_pickle_in_a_checkpoint_file_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"module": {}, "extra": _Evil()}, tmp_path / "mp_rank_00_model_states.pt")
    with weights_only_loads(), pytest.raises(pickle.UnpicklingError, match="exec"):
        torch.load(tmp_path / "mp_rank_00_model_states.pt", weights_only=False)
    assert not (tmp_path / "PWNED").exists()


def test_export_refuses_a_tampered_checkpoint_in_one_line(tmp_path, monkeypatch):
    from actors.learner.export import ExportError, full_state_dict

    monkeypatch.chdir(tmp_path)
    tag = tmp_path / "learner" / "step3"
    tag.mkdir(parents=True)
    (tmp_path / "learner" / "latest").write_text("step3")
    torch.save({"module": {"w": torch.zeros(2)}, "extra": _Evil()},
               tag / "mp_rank_00_model_states.pt")
    with pytest.raises(ExportError, match="holds more than weights") as e:
        full_state_dict(tmp_path / "learner")
    assert "\n" not in str(e.value) and not (tmp_path / "PWNED").exists()


def test_the_driver_finds_a_planted_pickle_without_loading_it(tmp_path):
    """``pickled_globals`` reads pickles only: DeepSpeed's own optimizer state passes (its types
    by name equal ``deepspeed_data_types``), a planted global is named, non-archives are skipped."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from actors.learner.safe_load import DEEPSPEED_DATA_TYPE_NAMES, pickled_globals

    assert DEEPSPEED_DATA_TYPE_NAMES == {f"{t.__module__}.{t.__qualname__}"
                                         for t in deepspeed_data_types()}
    tag = tmp_path / "step3"
    tag.mkdir()
    torch.save({"zero_stage": ZeroStageEnum.gradients, "loss_scaler": LossScaler(2.0),
                "w": torch.zeros(2)}, tag / "optim_states.pt")
    (tmp_path / "latest").write_text("step3")
    assert pickled_globals(tmp_path) == {}
    torch.save({"module": {}, "extra": _Evil()}, tag / "mp_rank_00_model_states.pt")
    assert pickled_globals(tmp_path) == {"step3/mp_rank_00_model_states.pt": ["builtins.exec"]}
    assert not (tmp_path / "PWNED").exists()
