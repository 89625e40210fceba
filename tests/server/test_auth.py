"""The one bearer-token header builder every client uses."""

from gym_bridge.serving.auth import bearer


def test_a_token_becomes_the_authorization_header() -> None:
    assert bearer("sekrit") == {"authorization": "Bearer sekrit"}


def test_no_token_no_header() -> None:
    assert bearer(None) == {}
    assert bearer("") == {}
