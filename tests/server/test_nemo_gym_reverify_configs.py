"""The configs we ship for NeMo Gym's ``gym eval reverify`` (``resources_servers/<name>/configs/<name>_reverify.yaml``):
the resources server alone, the same entry as in the full config, valid against NeMo Gym 0.7.0's entry schema,
and planned by our entrypoint. NeMo Gym itself runs them in ``scripts/nemo_gym_live_check.py``."""

from __future__ import annotations

import json

import pytest
import yaml
from test_nemo_gym_configs import REPO, _config, _validate

from gym_bridge.rollout.nemo_gym_entry import plan_server

REVERIFIABLE = ("math", "code")  # tool_use answers GET /reverify_mode with "unsupported"


@pytest.fixture(scope="module")
def entry_schema(reference_dir) -> dict:
    return json.loads((reference_dir / "server_entry_schema_0.7.0.json").read_text())["schema"]


@pytest.mark.parametrize("name", REVERIFIABLE)
def test_reverify_config_is_the_resources_server_of_the_full_config_alone(name, entry_schema):
    config = yaml.safe_load((REPO / "resources_servers" / name / "configs" / f"{name}_reverify.yaml").read_text())
    assert list(config) == [name]  # no agent: NeMo Gym sends every rollout to this one server
    entry = config[name]["resources_servers"][name]
    assert entry == _config(name)[name]["resources_servers"][name]
    _validate(entry, entry_schema, entry_schema["$defs"], f"{name}.resources_servers.{name}")
    entry.update(host="127.0.0.1", port=8123)
    assert plan_server(config, name, name).server == name
