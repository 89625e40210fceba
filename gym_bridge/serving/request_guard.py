"""What a web page could make a browser send to a local server is refused: foreign ``Host`` names, non-JSON bodies.

Any page a user opens can send requests to ``http://127.0.0.1:PORT``. Two kinds reach a server unless it
refuses them:

* **"Simple" cross-origin requests.** A ``POST`` whose ``Content-Type`` is ``text/plain``,
  ``application/x-www-form-urlencoded`` or ``multipart/form-data`` (or that has none: a ``Blob`` body) is sent
  without a CORS preflight; the page cannot read the answer, but the server acts on it (``/verify`` runs the
  program). A ``POST``/``PUT``/``PATCH`` with a body must therefore say ``Content-Type: application/json``
  (or a ``+json`` type), which a page can send only after a preflight that these servers never grant: else 415.
  NeMo Gym's clients (aiohttp through its ``server_utils.request``) and ours (httpx, aiohttp in ``collect``,
  the TRL bridge, the in-process client) all send ``application/json``.
* **DNS rebinding.** A page at ``http://evil.example:PORT`` whose name is re-pointed at 127.0.0.1 is
  same-origin with the local server and can read its answers (the viewer's rollouts). Such a request carries
  ``Host: evil.example:PORT``; the server answers 421 unless the name is one of its own: an IP address
  literal (a page served from an address is only ever same-origin with that address), ``localhost`` or a
  ``*.localhost`` name, this machine's host name, the address the request came in on, the name the server
  was bound to, and the names given with ``--allowed-host`` / ``allowed_hosts`` or in the
  ``GYM_BRIDGE_ALLOWED_HOSTS`` environment variable (comma-separated; ``*`` turns the check off, e.g. behind
  a reverse proxy that checks names itself). The port is not compared: an SSH forward
  (``ssh -L 9000:127.0.0.1:8080``) presents ``localhost:9000``, and a rebinding page's name is what gives it
  away.

A request without ``Host`` (HTTP/1.0; browsers always send one) is not refused for that.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable

__all__ = [
    "ALLOWED_HOSTS_ENV",
    "ALLOWED_HOST_HELP",
    "RequestGuard",
    "check_host_names",
    "host_name",
    "is_json_content_type",
]

ALLOWED_HOSTS_ENV = "GYM_BRIDGE_ALLOWED_HOSTS"
ALLOWED_HOST_HELP = (
    "Also answer requests whose Host header names NAME (repeatable); IP addresses, localhost and this machine's "
    f"name are always answered, other names get 421 (DNS rebinding). '*' answers any. Also: {ALLOWED_HOSTS_ENV}."
)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_MAX_VERDICTS = 1024


def host_name(header: str) -> str | None:
    """The name part of a ``Host`` header (lower case, no port, IPv6 brackets removed); None if malformed."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not value[end + 1 :].startswith(":")):
            return None
        return value[1:end]
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is still an address
    except ValueError:
        return False
    return True


def is_json_content_type(value: str) -> bool:
    """True for ``application/json`` and ``application/<anything>+json``, with any parameters."""
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_host_names(values: Iterable[str], where: str = "allowed_hosts") -> list[str]:
    """``values`` (each a name, ``NAME:PORT``, an address, ``*``, or several of those comma-separated), as
    given; ValueError naming ``where`` for one that is not a host name (``http://box``, ``box/path``)."""
    values = list(values)
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if part in ("", "*") or _is_ip(part):  # a bare IPv6 address (a bound host "::") has colons
                continue
            name = host_name(part)
            if name is None or not all(c.isalnum() or c in "-._:%" for c in name):
                raise ValueError(
                    f"{where}: {part!r} is not a host name (give NAME or NAME:PORT, e.g. gpu-box.lan)"
                )
    return values


def _names(values: Iterable[str], where: str) -> set[str]:
    out = set()
    for value in check_host_names(values, where):
        for part in value.split(","):
            name = host_name(part) if part.strip() not in ("", "*") else part.strip()
            if name:
                out.add(name)
    return out


class RequestGuard:
    """The two checks of the module docstring, for one server; ``allowed_hosts``: its bound host and extra names."""

    def __init__(self, allowed_hosts: Iterable[str] = ()) -> None:
        names = _names(allowed_hosts, "allowed_hosts") | _names(
            [os.environ.get(ALLOWED_HOSTS_ENV, "")], ALLOWED_HOSTS_ENV
        )
        self.any_host = "*" in names
        names.discard("*")
        names |= {"localhost", socket.gethostname().lower()}
        self.names = frozenset(n for n in names if n and not _is_ip(n))
        self._verdicts: dict[tuple[bytes | None, str | None], str | None] = {}
        """``(Host header, local name) -> refusal``: a server sees the same few Host values all the time."""

    def allows_host(self, name: str, local: str | None = None) -> bool:
        """Whether a request naming ``name`` (from :func:`host_name`) may be answered; ``local``: the
        address or name it came in on (the ASGI scope's ``server``)."""
        return (
            self.any_host or name in self.names or name.endswith(".localhost") or _is_ip(name)
            or (local is not None and name == local.lower())
        )  # fmt: skip

    def host_refusal(self, host: bytes | str | None, local: str | None = None) -> str | None:
        """Why a request with this ``Host`` header is refused (421), or None to answer it."""
        if host is None or self.any_host:
            return None
        text = host.decode("latin-1") if isinstance(host, bytes) else host
        name = host_name(text)
        if name is not None and self.allows_host(name, local):
            return None
        allowed = ", ".join(sorted(self.names))
        return (
            f"Host header {text[:200]!r} is not a name of this server (allowed: IP addresses, {allowed}); a web "
            f"page can reach a local server under a name of its own (DNS rebinding), so other names are refused. "
            f"Add a name with --allowed-host NAME or {ALLOWED_HOSTS_ENV}=NAME[,NAME...]"
        )

    @staticmethod
    def content_type_refusal(method: str, content_type: bytes | str | None, has_body: bool) -> str | None:
        """Why a request with this method, ``Content-Type`` and body presence is refused (415), or None."""
        if method not in _BODY_METHODS:
            return None
        if content_type is None:
            if not has_body:
                return None
            given = "no Content-Type header"
        else:
            text = content_type.decode("latin-1") if isinstance(content_type, bytes) else content_type
            if is_json_content_type(text):
                return None
            given = f"Content-Type {text[:100]!r}"
        return (
            f"{given}: this server reads JSON request bodies sent with 'Content-Type: application/json' "
            "(a web page can send other types to a local server without the user knowing, so they are refused)"
        )

    def refusal(self, scope: dict) -> tuple[int, str] | None:
        """The status and reason to refuse an ASGI HTTP request with before reading its body, or None."""
        host = content_type = None
        has_body = False
        for key, value in scope.get("headers", ()):
            if key == b"host":
                host = value
            elif key == b"content-type":
                content_type = value
            elif key == b"content-length":
                has_body = has_body or value.strip() not in (b"", b"0")
            elif key == b"transfer-encoding":
                has_body = True
        server = scope.get("server")
        local = server[0] if server and isinstance(server[0], str) else None
        key = (host, local)
        try:
            why = self._verdicts[key]
        except KeyError:
            why = self.host_refusal(host, local)
            if len(self._verdicts) >= _MAX_VERDICTS:  # many different names: a scan, not a client
                self._verdicts.clear()
            self._verdicts[key] = why
        if why is not None:
            return 421, why
        if content_type == b"application/json":
            return None
        why = self.content_type_refusal(scope.get("method", ""), content_type, has_body)
        return (415, why) if why is not None else None
