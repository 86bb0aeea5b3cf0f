"""``actors.policy.cache_kwargs`` names the forward's own cache argument: transformers 5.2x calls
it ``cache``, earlier releases ``past_key_values``, and each swallows the other's name silently."""

from __future__ import annotations

import pytest

from actors.policy import cache_kwargs


class _New:
    def forward(self, input_ids=None, cache=None, **kwargs):
        pass


class _Old:
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        pass


class _Neither:
    def forward(self, input_ids=None, **kwargs):
        pass


class _Wrapper:   # DeepSpeed's engine: forward(*args, **kwargs), the model in .module
    def __init__(self, module):
        self.module = module

    def forward(self, *args, **kwargs):
        pass


def test_the_name_comes_from_the_forwards_signature():
    c = object()
    assert cache_kwargs(_New(), c) == {"cache": c}
    assert cache_kwargs(_Old(), c) == {"past_key_values": c}
    assert cache_kwargs(_Wrapper(_Old()), c) == {"past_key_values": c}


def test_a_forward_with_neither_is_an_error_not_a_silent_cacheless_run():
    with pytest.raises(TypeError, match="neither"):
        cache_kwargs(_Neither(), object())


def test_the_installed_transformers_model_takes_its_cache():
    """The real model: a prefill through ``cache_kwargs`` fills the cache."""
    import torch
    from transformers.cache_utils import DynamicCache

    from actors.policy import build_tiny_policy, load_policy

    model, _ = load_policy(build_tiny_policy())
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]), **cache_kwargs(model, cache), use_cache=True)
    assert cache.get_seq_length() == 3
