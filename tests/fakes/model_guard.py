"""A kill switch for real model calls in tests: outbound connections may only go to loopback addresses.

pydantic-ai's ALLOW_MODEL_REQUESTS idea, enforced at the socket: a test that would reach
generativelanguage.googleapis.com fails with `ModelRequestBlockedError` instead of spending money or hanging,
while the loopback fake Gemini server (and moto's local server) stay reachable.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_LOOPBACK_NAMES = frozenset({'localhost', 'localhost.localdomain', 'ip6-localhost'})


class ModelRequestBlockedError(RuntimeError):
    """A test tried to open a connection to a non-loopback address."""


def is_loopback(address: Any) -> bool:
    """True for a socket address on this machine (IPv4/IPv6 loopback, 'localhost', or a Unix socket path)."""
    if isinstance(address, str | bytes):
        return True  # AF_UNIX path: never leaves the machine
    host = address[0] if isinstance(address, tuple) and address else address
    if isinstance(host, str) and host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(str(host).split('%', 1)[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def loopback_only() -> Iterator[None]:
    """Within the block, `socket.connect`/`connect_ex` to a non-loopback address raises ModelRequestBlockedError."""
    original_connect = socket.socket.connect
    original_connect_ex = socket.socket.connect_ex

    def guarded_connect(self: socket.socket, address: Any) -> None:
        if not is_loopback(address):
            raise ModelRequestBlockedError(f'tests may only reach loopback addresses, not {address!r}')
        original_connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        if not is_loopback(address):
            raise ModelRequestBlockedError(f'tests may only reach loopback addresses, not {address!r}')
        return original_connect_ex(self, address)

    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.socket.connect = original_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = original_connect_ex  # type: ignore[method-assign]
