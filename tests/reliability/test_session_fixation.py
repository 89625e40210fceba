"""Session fixation on tool_use, over real HTTP: a client-chosen cookie never reaches another client's state.

The reproduction of issue 12 item 8: two clients that both send ``gym_bridge_session=x`` used to share one
cart, and a later client sending ``x`` saw the earlier one's store. Now ``x`` is never adopted: each gets
its own server-issued id in a fresh ``Set-Cookie``, and only a server-issued id finds its session.
"""

from __future__ import annotations

import httpx
import pytest

from gym_bridge.serving.cookie_sessions import SESSION_COOKIE

from . import bodies
from .conftest import landed_builtin_servers

CHOSEN = {"cookie": f"{SESSION_COOKIE}=x"}

pytestmark = pytest.mark.skipif("tool_use" not in landed_builtin_servers(), reason="tool_use not in this checkout")


def issued(answer: httpx.Response) -> str:
    cookie = answer.cookies.get(SESSION_COOKIE)
    assert cookie, f"no fresh Set-Cookie: {answer.headers}"
    return cookie


def test_two_clients_sending_the_same_chosen_cookie_get_separate_stores(builtin_url):
    url = builtin_url("tool_use")
    with httpx.Client(base_url=url, timeout=30) as raw:  # cookies sent by hand: no jar adopts Set-Cookie
        seeded = raw.post("/seed_session", json=bodies.tool_use_row(), headers=CHOSEN)
        assert seeded.status_code == 200, seeded.text
        first = issued(seeded)
        assert first != "x" and len(first) >= 22

        added = raw.post("/add_to_cart", json={"product_id": "", "quantity": 2}, headers={"cookie": f"{SESSION_COOKIE}={first}"})
        assert added.status_code == 200 and "set-cookie" not in added.headers, added.text
        cart = raw.post("/view_cart", json={}, headers={"cookie": f"{SESSION_COOKIE}={first}"}).json()
        assert {i["product_id"]: i["quantity"] for i in cart["cart"]["items"]} == {"0": 1, "": 2}, cart

        # another client (or a new process) sending the same chosen value: not the first client's store
        other = raw.post("/view_cart", json={}, headers=CHOSEN)
        assert other.status_code == 409 and "seed_session" in other.json()["detail"], other.text
        second = issued(other)
        assert second not in ("x", first)

        # a guessed id one character off the issued one finds nothing either
        guessed = first[:-1] + ("A" if first[-1] != "A" else "B")
        probe = raw.post("/view_cart", json={}, headers={"cookie": f"{SESSION_COOKIE}={guessed}"})
        assert probe.status_code == 409 and issued(probe) not in (guessed, first)

        # the first client's session is untouched by all of that
        again = raw.post("/view_cart", json={}, headers={"cookie": f"{SESSION_COOKIE}={first}"}).json()
        assert again == cart
