"""``launch.doctor.check_fits``: a role that asks for more of a resource than the whole cluster
has fails before any actor starts, naming the config key (on the shared local Ray: 4 CPUs, no
GPU, no custom resources)."""

import pytest

from launch.errors import UserError
from launch.doctor import check_fits
from launch.config import load_config


@pytest.mark.parametrize("override, key", [
    ("executors.resources={envsched_executor: 1}", "executors.resources.envsched_executor"),
    ("executors.num_cpus_per_executor=8", "executors.num_cpus_per_executor"),
    ("learner.num_gpus_per_rank=1", "learner.num_gpus_per_rank"),
    ("cluster.rollout.num_gpus=1", "cluster.rollout.num_gpus"),
    ("cluster.scheduler.custom={big_mem: 2}", "cluster.scheduler.custom.big_mem"),
])
def test_a_role_that_cannot_fit_is_named(ray_local, override, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")) as err:
        check_fits(load_config(None, [override]))
    assert "the Ray cluster has 0" in str(err.value) or "has 4" in str(err.value)


def test_the_demo_config_fits(ray_local):
    check_fits(load_config(None))
