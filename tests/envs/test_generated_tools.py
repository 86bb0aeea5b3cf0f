"""Generated tools really enforce their rules and never raise (run through the sandbox engine)."""

from __future__ import annotations

import itertools
import random

import pytest

from envs.generator.domains import DOMAINS, alternative
from envs.generator.state import build_state
from envs.generator.tools import (OPTIONAL_ROLES, Variant, class_name, ids, render_source,
                                  tool_names, tool_schemas)
from envs.spec import Environment
from sandbox.runtime import EpisodeRuntime

HOTEL = DOMAINS[0]


def _runtime(domain, variant, seed=0):
    env = Environment(env_id="env_t", class_name=class_name(domain, variant),
                      source=render_source(domain, variant), tools=tool_schemas(domain, variant))
    state = build_state(domain, variant, random.Random(seed), n_persons=12, n_resources=12)
    rt = EpisodeRuntime(env)
    rt.reset(state, seed=5)
    return rt, state, tool_names(domain, variant), ids(domain)


@pytest.fixture
def hotel():
    v = Variant(style=0, id_style="uuid", clock=True, eligibility_first=True,
                auth_resource_status=False, optional=OPTIONAL_ROLES)
    return _runtime(HOTEL, v)


def _ok(step):
    assert step.error is None, step.error
    return step.observation


def _pick(state, table, **match):
    return next(k for k, r in state[table].items() if all(r[f] == v for f, v in match.items()))


def test_create_needs_eligibility_first_and_a_free_resource(hotel):
    rt, state, n, k = hotel
    guest = _pick(state, "guests", status="active", outstanding_balance=0.0)
    room = _pick(state, "rooms", status="available")
    args = {k["person"]: guest, k["resource"]: room, "nights": 2}
    denied = _ok(rt.step(n["create"], args))
    assert denied["success"] is False and n["validate_eligibility"] in denied["error"]
    assert _ok(rt.step(n["validate_eligibility"], {k["person"]: guest}))["data"]["eligible"]
    made = _ok(rt.step(n["create"], args))
    assert made["success"] and made["data"]["status"] == "confirmed"
    assert rt.snapshot()["rooms"][room]["status"] == "occupied"
    again = _ok(rt.step(n["create"], args))
    assert again["success"] is False and "occupied" in again["error"]


def test_delete_needs_a_supervisor_session_and_an_ended_record(hotel):
    rt, state, n, k = hotel
    rec = _pick(state, "reservations", status="confirmed")
    clerk = _pick(state, "staff", role="receptionist", active=True)
    boss = _pick(state, "staff", role="manager")
    delete = lambda who: _ok(rt.step(n["delete"], {k["record"]: rec, "acting_user_id": who}))  # noqa: E731
    assert "no authorized session" in delete(boss)["error"]
    _ok(rt.step(n["authorize"], {k["user"]: clerk}))
    assert "requires role manager" in delete(clerk)["error"]
    _ok(rt.step(n["authorize"], {k["user"]: boss}))
    assert "cancel_reservation first" in delete(boss)["error"]
    assert _ok(rt.step(n["cancel"], {k["record"]: rec}))["success"]
    assert delete(boss)["success"] and rec not in rt.snapshot()["reservations"]


def test_resource_in_use_cannot_be_blocked_and_holder_cannot_be_suspended(hotel):
    rt, state, n, k = hotel
    rec_id = _pick(state, "reservations", status="confirmed")
    rec = state["reservations"][rec_id]
    blocked = _ok(rt.step(n["set_resource_status"], {k["resource"]: rec[k["resource"]],
                                                     "status": "maintenance"}))
    assert blocked["success"] is False and "in use" in blocked["error"]
    boss = _pick(state, "staff", role="manager")
    _ok(rt.step(n["authorize"], {k["user"]: boss}))
    suspend = {k["person"]: rec[k["person"]], "status": "suspended", "acting_user_id": boss}
    assert _ok(rt.step(n["set_person_status"], suspend))["success"] is False
    _ok(rt.step(n["cancel"], {k["record"]: rec_id}))
    assert _ok(rt.step(n["set_person_status"], suspend))["success"]
    assert _ok(rt.step(n["set_resource_status"], {k["resource"]: rec[k["resource"]],
                                                  "status": "maintenance"}))["success"]


def test_minted_ids_repeat_for_the_same_episode_seed(hotel):
    rt, state, n, k = hotel
    guest = _pick(state, "guests", status="active", outstanding_balance=0.0)
    room = _pick(state, "rooms", status="available")

    def mint(seed):
        rt.reset(state, seed=seed)
        rt.step(n["validate_eligibility"], {k["person"]: guest})
        data = _ok(rt.step(n["create"], {k["person"]: guest, k["resource"]: room, "nights": 1}))
        return data["data"]["reservation_id"], data["data"]["created_at"]

    assert mint(1) == mint(1) and mint(1)[0] != mint(2)[0]


ALL_VOCABS = list(DOMAINS) + [alternative(d) for d in DOMAINS]


@pytest.mark.parametrize("domain", ALL_VOCABS, ids=[f"{d.key}-{d.person[0]}" for d in ALL_VOCABS])
def test_tools_never_raise_on_wrong_values(domain):
    for style, id_style in [(0, "sequential"), (1, "uuid"), (2, "code")]:
        v = Variant(style=style, id_style=id_style, clock=style == 1, eligibility_first=True,
                    auth_resource_status=style == 2, optional=OPTIONAL_ROLES)
        rt, _, _, _ = _runtime(domain, v)
        for tool in rt.env.tools:
            props = tool["function"]["parameters"]["properties"]
            for junk in itertools.islice(itertools.cycle([None, 7, "zzz", 1.5, True]), 5):
                step = rt.step(tool["function"]["name"], {p: junk for p in props})
                assert step.error is None, (domain.key, tool["function"]["name"], step.error)
                assert set(step.observation) in ({"success", "data"}, {"success", "error"})
