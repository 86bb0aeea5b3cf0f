"""Appendix C identifier filter on hand-built trajectories over a tiny user-accounts environment:
what is suspicious, which later actions depend on a removed one, and the replay verdicts."""

from __future__ import annotations

import copy

from envs.trajectory import ActionStep, Trajectory
from scheduling.config import EnvSchedParams
from scheduling.identifier_filter import (IdentifierFilter, dependent_actions, find_suspicious,
                                          identifier_shaped, state_identifiers, tokens)

CFG = EnvSchedParams()
STATE = {"users": {"U100": {"user_id": "U100", "name": "Ann", "plan": "basic"},
                   "U777": {"user_id": "U777", "name": "Bob", "plan": "gold"}},
         "orders": {}}


def run_env(actions):
    """The mini environment: apply the tool calls to a copy of STATE."""
    state = copy.deepcopy(STATE)
    users = state["users"]
    for a in actions:
        args = a.arguments
        uid = args.get("user_id")
        if a.name == "set_plan" and uid in users:
            users[uid]["plan"] = args["plan"]
        elif a.name == "set_email" and uid in users:
            users[uid]["email"] = args["email"]
        elif a.name == "set_renewal" and uid in users:
            users[uid]["renewal"] = args["date"]
        elif a.name == "link_referral" and uid in users:
            users[uid]["referrer"] = args["referrer"]
        elif a.name == "add_user":
            new = f"U{100 + len(users) - 1}"
            users[new] = {"user_id": new, "name": args["name"], "plan": args["plan"]}
        elif a.name == "create_order" and uid in users:
            state["orders"]["R500"] = {"order_id": "R500", "user_id": uid, "paid": False}
        elif a.name == "pay_order" and args["order_id"] in state["orders"]:
            state["orders"][args["order_id"]]["paid"] = True
    return state


def replay_for(*checks):
    """replay(task_id, actions, seed) -> fraction of ``checks`` (state -> bool) passed."""
    return lambda task_id, actions, seed: sum(c(run_env(actions)) for c in checks) / len(checks)


def traj(*steps, reward=1.0):
    return Trajectory(task_id="t", reward=reward, seed=1, actions=[
        ActionStep(tool=s[0], arguments=s[1], observation=s[2] if len(s) > 2 else {"ok": True},
                   state_diff=s[3] if len(s) > 3 else {}) for s in steps])


ANN_GOLD = lambda s: s["users"]["U100"]["plan"] == "gold"          # noqa: E731
LOOKUP = ("find_user", {"name": "Ann"}, {"user_id": "U100", "name": "Ann"})
UPGRADE = ("set_plan", {"user_id": "U100", "plan": "gold"})


def check(context, trajectory, *checks, cfg=CFG):
    return IdentifierFilter(replay_for(*checks), cfg).check("t", [trajectory], context, STATE)


# ----------------------------------------------------------------------- the five issue cases
def test_legitimate_lookup_then_edit_is_kept():
    assert check("Upgrade Ann to the gold plan.", traj(LOOKUP, UPGRADE), ANN_GOLD) == []


def test_guessed_id_that_skips_the_lookup_is_filtered():
    f = check("Upgrade Ann to the gold plan.", traj(UPGRADE), ANN_GOLD)
    assert [(x.identifier, x.action, x.verdict) for x in f] == [("U100", 0, "filtered")]
    assert (f[0].replay_reward, f[0].ablated_reward) == (1.0, 0.0)


def test_derived_date_is_kept():
    context = "Today is March 14, 2025. Set the renewal of user U100 to the first day of next month."
    t = traj(("set_renewal", {"user_id": "U100", "date": "2025-04-01"}))
    assert check(context, t, lambda s: s["users"]["U100"].get("renewal") == "2025-04-01") == []


def test_duplicate_record_creation_is_filtered():
    dup = ("add_user", {"name": "Ann", "plan": "basic"}, {"user_id": "U101"},
           {"added": {"/users/U101": {"user_id": "U101", "name": "Ann", "plan": "basic"}}})
    f = check("Make sure Ann has an account.", traj(dup), lambda s: len(s["users"]) == 3)
    assert [(x.reason, x.verdict) for x in f] == [("record duplicates an existing one",
                                                   "filtered")]


def test_two_independent_edits_of_one_looked_up_record_are_kept():
    context = "Upgrade Ann to gold and set her email to ann@example.com."
    guess = ("link_referral", {"user_id": "U100", "referrer": "U777"})   # U777 is guessed
    email = ("set_email", {"user_id": "U100", "email": "ann@example.com"})
    f = check(context, traj(LOOKUP, guess, UPGRADE, email), ANN_GOLD,
              lambda s: s["users"]["U100"].get("email") == "ann@example.com")
    assert [(x.identifier, x.removed, x.verdict) for x in f] == [("U777", [1], "kept")]


# ----------------------------------------------------------------------- suspicion details
def test_only_identifiers_of_existing_records_outside_the_permitted_context_are_suspicious():
    acts = traj(("set_password", {"user_id": "U100", "password": "Tr0ub4dor-3"}),
                ("set_limit", {"user_id": "U100", "limit": "30000"}),
                ("set_plan", {"user_id": "U777", "plan": "gold"})).actions
    context = "User U100 chooses a new password and a limit of 30,000."
    assert [(s.action, s.identifier) for s in find_suspicious(acts, context, STATE)] == \
        [(2, "U777")]
    assert find_suspicious(acts, context + " Also Bob (u777).", STATE) == []   # case-insensitive
    assert find_suspicious(acts, "", None) == []       # no state: no record ids to guess


def test_tool_schema_enums_are_permitted_context():
    acts = traj(("set_plan", {"user_id": "U100", "plan": "P-200"})).actions
    state = {"users": STATE["users"], "plans": {"P-200": {"id": "P-200"}}}
    assert [s.identifier for s in find_suspicious(acts, "user U100", state)] == ["P-200"]
    schema = 'user U100 {"plan": {"type": "string", "enum": ["P-100", "P-200"]}}'
    assert find_suspicious(acts, schema, state) == []


def test_normalisation_of_numbers_dates_quotes_and_case():
    toks = tokens('Pay "30,000" on April 1, 2025 or 04/02/2025 to ACCT-9 (1.50)')
    assert {"30000", "2025-04-01", "2025-04-02", "acct-9", "1.5"} <= toks
    assert not identifier_shaped("30,000") and not identifier_shaped("2025-04-01")
    assert identifier_shaped("OXL-44032-F") and identifier_shaped(10234)
    assert state_identifiers(STATE) == {"u100", "u777"}


# ----------------------------------------------------------------------- dependent edits
def test_dependent_edits_follow_produced_identifiers_only():
    create = ("create_order", {"user_id": "U777"}, {"order_id": "R500"},
              {"added": {"/orders/R500": {"order_id": "R500", "user_id": "U777"}}})
    acts = traj(create, UPGRADE, ("pay_order", {"order_id": "R500"}),
                ("ship", {"order_id": "R501", "user_id": "U777"})).actions
    assert dependent_actions(acts, 0, "Upgrade user U100.") == [0, 2]
    # an identifier obtainable anyway (here: in the instruction) taints nothing
    assert dependent_actions(acts, 0, "Upgrade user U100; pay order R500.") == [0]


def test_values_first_returned_to_a_removed_action_are_dependent_transitively():
    acts = traj(("find_user", {"name": "Bob"}, {"user_id": "U777", "token": "TK-1234"}),
                ("open_session", {"token": "TK-1234"}, {"session": "S-4242"}),
                ("set_plan", {"session": "S-4242", "plan": "gold"}),
                UPGRADE).actions
    assert dependent_actions(acts, 0, "Upgrade user U100.") == [0, 1, 2]


# ----------------------------------------------------------------------- confirmation
def test_every_suspicious_action_is_examined_until_one_is_confirmed():
    harmless = ("link_referral", {"user_id": "U100", "referrer": "U777"})
    f = check("Upgrade Ann.", traj(LOOKUP, harmless, ("set_plan", {"user_id": "U777",
                                                                  "plan": "basic"}), UPGRADE),
              ANN_GOLD, lambda s: s["users"]["U777"]["plan"] == "basic")
    assert [(x.action, x.verdict) for x in f] == [(1, "kept"), (2, "filtered")]
    bounded = check("Upgrade Ann.", traj(LOOKUP, harmless, ("set_plan", {"user_id": "U777",
                                                                        "plan": "basic"})),
                    lambda s: s["users"]["U777"]["plan"] == "basic",
                    cfg=EnvSchedParams(identifier_max_checks=1))
    assert [(x.action, x.verdict) for x in bounded] == [(1, "kept")]


def test_replay_mismatch_is_inconclusive_and_keeps_the_task():
    f = check("Upgrade Ann.", traj(UPGRADE, reward=0.9), ANN_GOLD)
    assert [(x.verdict, x.ablated_reward) for x in f] == [("inconclusive", None)]


def test_low_reward_trajectories_are_not_examined():
    calls = []
    filt = IdentifierFilter(lambda *a: calls.append(a) or 0.0, CFG)
    assert filt.check("t", [traj(UPGRADE, reward=0.4)], "", STATE) == [] and not calls
