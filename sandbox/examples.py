"""A small benign environment (an order desk that mints uuid ids and reads the clock) with a task,
checks and reference solution: used by the benchmarks, the selftest's control case and the tests.

May import: envs.spec, sandbox.determinism, the standard library.
"""

from __future__ import annotations

from typing import Any

from envs.spec import Check, Environment, TaskSpec, ToolCall
from sandbox.determinism import EpisodeClock

ORDER_DESK_SOURCE = '''
import random
import uuid
from datetime import date, datetime


class OrderDesk:
    """Customers and their orders; ids of new orders come from uuid4."""

    def __init__(self, init_config=None):
        self.customers = {}
        self.orders = {}

    def find_customer(self, name):
        for cid, c in self.customers.items():
            if c["name"] == name:
                return {"success": True, "data": {"customer_id": cid, **c}}
        return {"success": False, "error": f"no customer named {name}"}

    def create_order(self, customer_id, item, quantity=1):
        if customer_id not in self.customers:
            return {"success": False, "error": f"unknown customer {customer_id}"}
        order_id = str(uuid.uuid4())
        self.orders[order_id] = {"customer_id": customer_id, "item": item,
                                 "quantity": quantity, "status": "open",
                                 "created_at": datetime.now().isoformat(),
                                 "ticket": random.randint(1000, 9999)}
        return {"success": True, "data": {"order_id": order_id}}

    def ship_order(self, order_id):
        order = self.orders.get(order_id)
        if order is None:
            return {"success": False, "error": f"unknown order {order_id}"}
        if order["status"] != "open":
            return {"success": False, "error": f"order {order_id} is {order['status']}"}
        order["status"] = "shipped"
        order["shipped_on"] = date.today().isoformat()
        return {"success": True, "message": f"Order {order_id} shipped"}

    def cancel_order(self, order_id):
        if order_id not in self.orders:
            return {"success": False, "error": f"unknown order {order_id}"}
        del self.orders[order_id]
        return {"success": True, "message": "cancelled"}
'''


def _tool(name: str, params: dict[str, str], required: list[str]) -> dict[str, Any]:
    props = {k: {"type": t} for k, t in params.items()}
    return {"type": "function", "function": {
        "name": name, "description": name.replace("_", " "),
        "parameters": {"type": "object", "properties": props, "required": required}}}


ORDER_DESK = Environment(
    env_id="order_desk", class_name="OrderDesk", source=ORDER_DESK_SOURCE, domain="retail",
    introduction="You operate an order desk.", rules=["Look customers up by name."],
    tools=[_tool("find_customer", {"name": "string"}, ["name"]),
           _tool("create_order", {"customer_id": "string", "item": "string",
                                  "quantity": "integer"}, ["customer_id", "item"]),
           _tool("ship_order", {"order_id": "string"}, ["order_id"]),
           _tool("cancel_order", {"order_id": "string"}, ["order_id"])])

ORDER_DESK_STATE: dict[str, Any] = {
    "customers": {"c-001": {"name": "Ann Lee", "tier": "gold"},
                  "c-002": {"name": "Bo Chen", "tier": "basic"}},
    "orders": {"o-100": {"customer_id": "c-002", "item": "lamp", "quantity": 1,
                         "status": "open", "created_at": "2024-12-30T10:00:00",
                         "ticket": 1234}},
}

ORDER_DESK_CHECKS = [
    Check(check_id="one_new_order", description="exactly one order was added",
          code="def check_func(final_state):\n"
               "    return len(final_state['orders']) == len(initial_state['orders']) + 1\n"),
    Check(check_id="ann_pen_shipped", description="Ann's pen order is shipped",
          code="def check_func(final_state):\n"
               "    return any(o['customer_id'] == 'c-001' and o['item'] == 'pen'\n"
               "               and o['status'] == 'shipped'\n"
               "               for o in final_state['orders'].values())\n"),
    Check(check_id="lamp_untouched", description="Bo's lamp order is still open",
          code="def check_func(final_state):\n"
               "    return final_state['orders']['o-100']['status'] == 'open'\n"),
    Check(check_id="shipped_today", description="shipping date is the episode's today",
          code="from datetime import date\n"
               "def check_func(final_state):\n"
               "    return all(o.get('shipped_on') in (None, date.today().isoformat())\n"
               "               for o in final_state['orders'].values())\n"),
]

# Episodes are deterministic per seed (sandbox.determinism), so the reference solution can quote
# the id the first create_order of a seed-0 episode mints.
SEED0_ORDER_ID = str(EpisodeClock(0).uuid4())

ORDER_DESK_TASK = TaskSpec(
    task_id="order_desk-task_1", env_id="order_desk",
    instruction="Ann Lee wants 2 pens shipped today; leave other orders alone.",
    initial_state=ORDER_DESK_STATE, checks=ORDER_DESK_CHECKS,
    reference_solution=[ToolCall(name="find_customer", arguments={"name": "Ann Lee"}),
                        ToolCall(name="create_order",
                                 arguments={"customer_id": "c-001", "item": "pen", "quantity": 2}),
                        ToolCall(name="ship_order", arguments={"order_id": SEED0_ORDER_ID})],
    metadata={"reference_seed": 0},
)
