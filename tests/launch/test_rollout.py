"""The plain rollout driver's config side: overrides go through the config's dotted path."""

from __future__ import annotations

import pytest

from launch.errors import UserError
from launch.rollout import executor_config, override_tree, rollout_config


def test_override_tree_nests_dotted_keys_and_parses_values_as_yaml():
    assert override_tree(["max_turns=8", "engine_kwargs.enforce_eager=true", "stop="]) == {
        "max_turns": 8, "engine_kwargs": {"enforce_eager": True}, "stop": None}


@pytest.mark.parametrize("item", ["max_turns", "=3", "a..b=1"])
def test_a_malformed_override_is_one_user_error(item):
    with pytest.raises(UserError, match="override"):
        override_tree([item])


def test_bad_values_name_the_section_and_field():
    with pytest.raises(UserError, match=r"rollout\.max_turns"):
        rollout_config(override_tree(["max_turns=0"]), None)
    with pytest.raises(UserError, match=r"executors\.num_executors"):
        executor_config(override_tree(["num_executors=many"]))
    assert rollout_config({}, 3).k == 3
