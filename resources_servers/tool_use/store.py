"""The tool-use environment's domain: a small store (catalogue, cart, orders) as pure functions of a state.

The state is plain JSON (it is seeded from the task row and compared at the end)::

    {"products": {"P104": {"name": "Ceramic Mug", "category": "kitchen", "price": 12.5, "stock": 4}},
     "cart": {"P104": 2},
     "orders": {"O1001": {"items": {"P104": 1}, "total": 12.5, "status": "placed"}},
     "next_order_number": 1002}

Every tool is ``fn(state, args) -> dict``: it may change ``state`` in place and returns the JSON the model
sees. Domain failures (unknown product, not enough stock) are answers with an ``error`` field, not
exceptions: the model is expected to read them and recover. The same functions serve the live session
and the replay of a task's reference calls, so "same calls" always means "same final state".
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["TOOLS", "StoreState", "ToolSpec", "apply_call", "function_tool", "new_state", "tool_schemas"]

State = dict[str, Any]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArgs(_Args):
    pass


class ListProductsArgs(_Args):
    category: str | None = Field(None, description="Only products of this category (e.g. 'kitchen').")
    max_price: float | None = Field(
        None, allow_inf_nan=False, description="Only products costing at most this much."
    )

    @field_validator("category")
    @classmethod
    def _as_the_tool_reads_it(cls, category: str | None) -> str | None:
        """Categories match case- and space-insensitively, so ``" Kitchen"`` is read as ``"kitchen"`` here,
        where the argument check (:func:`~resources_servers.tool_use.scoring.compare_calls`) sees it too."""
        return None if category is None else category.strip().lower()


class ProductArgs(_Args):
    product_id: str = Field(description="A product id from list_products, e.g. 'P104'.")


class AddToCartArgs(_Args):
    product_id: str = Field(description="A product id from list_products, e.g. 'P104'.")
    quantity: int = Field(ge=1, le=100, description="How many units to add (1-100).")


class OrderArgs(_Args):
    order_id: str = Field(description="An order id, e.g. 'O1001'.")


class Product(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    category: str
    price: float = Field(ge=0, allow_inf_nan=False)  # Infinity would be answered as null, NaN never compares
    stock: int = Field(ge=0)


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: dict[str, int]
    total: float = Field(allow_inf_nan=False)
    status: str = "placed"


class StoreState(BaseModel):
    """The shape a task's ``initial_state`` must have (checked when a session is seeded)."""

    model_config = ConfigDict(extra="forbid")

    products: dict[str, Product]
    cart: dict[str, int] = Field(default_factory=dict)
    orders: dict[str, Order] = Field(default_factory=dict)
    next_order_number: int = 1001

    @model_validator(mode="after")
    def _known_products(self) -> StoreState:
        for where, items in [("cart", self.cart)] + [
            (f"orders.{k}", o.items) for k, o in self.orders.items()
        ]:
            unknown = sorted(set(items) - set(self.products))
            if unknown:
                raise ValueError(f"{where} refers to unknown products {unknown}")
        ahead = sorted(o for o in self.orders if o[1:].isdigit() and o == f"O{int(o[1:])}"
                       and int(o[1:]) >= self.next_order_number)  # fmt: skip
        if ahead:  # place_order names its order O<next_order_number>: it would overwrite these
            raise ValueError(f"next_order_number {self.next_order_number} would reuse the ids of orders {ahead}")
        return self


def new_state(
    products: dict[str, dict[str, Any]], orders: dict[str, Any] | None = None, next_order: int = 1001
) -> State:
    return {"products": products, "cart": {}, "orders": orders or {}, "next_order_number": next_order}


def _money(x: float) -> float:
    return round(x + 1e-9, 2)


def _product_view(pid: str, p: dict[str, Any]) -> dict[str, Any]:
    return {
        "product_id": pid,
        "name": p["name"],
        "category": p["category"],
        "price": p["price"],
        "stock": p["stock"],
    }


def _cart_view(state: State) -> dict[str, Any]:
    items = [
        {
            "product_id": pid,
            "name": state["products"][pid]["name"],
            "quantity": qty,
            "price": state["products"][pid]["price"],
        }
        for pid, qty in state["cart"].items()
    ]
    total = _money(sum(i["quantity"] * i["price"] for i in items))
    return {"items": items, "total": total}


def _unknown_product(pid: str) -> dict[str, Any]:
    return {"error": f"unknown product '{pid}'; use list_products to see the product ids"}


def list_products(state: State, args: ListProductsArgs) -> dict[str, Any]:
    """List the catalogue (optionally one category, optionally up to a price)."""
    found = [
        _product_view(pid, p)
        for pid, p in sorted(state["products"].items())
        if (args.category is None or p["category"].lower() == args.category)
        and (args.max_price is None or p["price"] <= args.max_price)
    ]
    return {"products": found}


def get_product(state: State, args: ProductArgs) -> dict[str, Any]:
    """Details of one product."""
    p = state["products"].get(args.product_id)
    return _unknown_product(args.product_id) if p is None else _product_view(args.product_id, p)


def add_to_cart(state: State, args: AddToCartArgs) -> dict[str, Any]:
    """Put units of a product in the cart (checked against the stock)."""
    p = state["products"].get(args.product_id)
    if p is None:
        return _unknown_product(args.product_id)
    wanted = state["cart"].get(args.product_id, 0) + args.quantity
    if wanted > p["stock"]:
        return {"error": f"only {p['stock']} of '{p['name']}' in stock (the cart would hold {wanted})"}
    state["cart"][args.product_id] = wanted
    return {"cart": _cart_view(state)}


def remove_from_cart(state: State, args: ProductArgs) -> dict[str, Any]:
    """Take a product out of the cart entirely."""
    if args.product_id not in state["cart"]:
        return {"error": f"product '{args.product_id}' is not in the cart"}
    del state["cart"][args.product_id]
    return {"cart": _cart_view(state)}


def view_cart(state: State, args: NoArgs) -> dict[str, Any]:
    """What the cart holds and its total."""
    return {"cart": _cart_view(state)}


def place_order(state: State, args: NoArgs) -> dict[str, Any]:
    """Order everything in the cart: stock goes down, the cart empties, an order id comes back."""
    if not state["cart"]:
        return {"error": "the cart is empty; add products with add_to_cart first"}
    for pid, qty in state["cart"].items():
        if qty > state["products"][pid]["stock"]:
            return {
                "error": f"only {state['products'][pid]['stock']} of '{state['products'][pid]['name']}' left"
            }
    view = _cart_view(state)
    order_id = f"O{state['next_order_number']}"
    state["next_order_number"] += 1
    for pid, qty in state["cart"].items():
        state["products"][pid]["stock"] -= qty
    state["orders"][order_id] = {"items": dict(state["cart"]), "total": view["total"], "status": "placed"}
    state["cart"] = {}
    return {"order_id": order_id, "total": view["total"], "status": "placed"}


def get_order(state: State, args: OrderArgs) -> dict[str, Any]:
    """One order: its items, total and status."""
    order = state["orders"].get(args.order_id)
    if order is None:
        return {"error": f"unknown order '{args.order_id}'"}
    return {"order_id": args.order_id, **copy.deepcopy(order)}


def list_orders(state: State, args: NoArgs) -> dict[str, Any]:
    """Every order with its status and total."""
    return {
        "orders": [
            {"order_id": oid, "status": o["status"], "total": o["total"]}
            for oid, o in sorted(state["orders"].items())
        ]
    }


def cancel_order(state: State, args: OrderArgs) -> dict[str, Any]:
    """Cancel a placed order; its units go back into stock."""
    order = state["orders"].get(args.order_id)
    if order is None:
        return {"error": f"unknown order '{args.order_id}'"}
    if order["status"] != "placed":
        return {"error": f"order '{args.order_id}' is already {order['status']}"}
    for pid, qty in order["items"].items():
        state["products"][pid]["stock"] += qty
    order["status"] = "cancelled"
    return {"order_id": args.order_id, "status": "cancelled"}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    args: type[BaseModel]
    fn: Callable[[State, Any], dict[str, Any]]
    changes_state: bool
    """Whether a call may change the store. A tool that never does (a read) is free beside an argument
    check's expected calls (:func:`~resources_servers.tool_use.scoring.compare_calls`); every tool declares it,
    and a test runs each read on many stores and arguments to hold it to that."""

    @property
    def description(self) -> str:
        return (self.fn.__doc__ or self.name).strip()


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec("list_products", ListProductsArgs, list_products, changes_state=False),
        ToolSpec("get_product", ProductArgs, get_product, changes_state=False),
        ToolSpec("add_to_cart", AddToCartArgs, add_to_cart, changes_state=True),
        ToolSpec("remove_from_cart", ProductArgs, remove_from_cart, changes_state=True),
        ToolSpec("view_cart", NoArgs, view_cart, changes_state=False),
        ToolSpec("place_order", NoArgs, place_order, changes_state=True),
        ToolSpec("get_order", OrderArgs, get_order, changes_state=False),
        ToolSpec("list_orders", NoArgs, list_orders, changes_state=False),
        ToolSpec("cancel_order", OrderArgs, cancel_order, changes_state=True),
    )
}


def apply_call(state: State, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Run one tool call on ``state`` (raises KeyError / pydantic.ValidationError on a bad call)."""
    spec = TOOLS[name]
    return spec.fn(state, spec.args.model_validate(arguments))


def function_tool(name: str, description: str, args: type[BaseModel]) -> dict[str, Any]:
    """A Responses API function tool (strict: every property required, optional ones nullable)."""
    schema = args.model_json_schema()
    properties = {}
    for prop_name, prop in schema.get("properties", {}).items():
        prop = {k: v for k, v in prop.items() if k not in ("title", "default")}
        if "anyOf" in prop:
            variants = prop.pop("anyOf")
            prop["type"] = [v["type"] for v in variants]
        properties[prop_name] = prop
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        },
        "strict": True,
    }


def tool_schemas() -> list[dict[str, Any]]:
    """Every tool of the store, as published in each task's ``responses_create_params.tools``."""
    return [function_tool(s.name, s.description, s.args) for s in TOOLS.values()]
