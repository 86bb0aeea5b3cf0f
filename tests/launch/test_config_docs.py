"""docs/configuration.md lists every config key with its default: the table is generated from the
config models (``launch.config_docs``) and must equal what the code gives now."""

from launch.config import load_config
from launch.config_docs import DOC, config_table, render


def _keys(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in tree.items():
        if isinstance(v, dict) and v and k not in ("params", "custom", "resources",
                                                    "engine_kwargs"):
            out |= _keys(v, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_the_docs_table_is_the_generated_one():
    doc = DOC.read_text()
    assert render(doc) == doc, ("docs/configuration.md is stale: run "
                                "`python -m launch.config_docs --write`")


def test_every_key_of_a_loaded_config_has_a_row():
    table = config_table()
    missing = [k for k in sorted(_keys(load_config(None).to_yaml_dict()))
               if f"| `{k}` |" not in table]
    assert not missing, missing
    for key in ("learner.gradient_checkpointing", "learner.betas", "learner.weight_decay",
                "learner.grad_clip", "learner.seed", "rollout.engine_kwargs", "logging.backends"):
        assert f"| `{key}` |" in table
