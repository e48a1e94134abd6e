"""Web origins: which pages may send the API requests that change data (the API edge, `om serve`, the CDK app).

A browser names the page that makes a request in its `Origin` header, and sends some requests (a POST with a body of
a "simple" type, a form) without asking the server first. So a request that changes data is taken only from a page
of the API's own origin (its inspector), from an origin on the configured allow-list, or from a caller that is no
page at all (no `Origin`: curl, SDKs, servers). The allow-list is `OM_ALLOWED_ORIGINS`: `om serve --allow-origin`,
or the CDK app's `-c allowedOrigins=`.

Origins compare in their canonical form: scheme and host in lower case, the port always written out
(`https://app.example.com` is `https://app.example.com:443`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

_DEFAULT_PORTS = {'http': 80, 'https': 443}


def canonical_origin(value: str) -> str | None:
    """`scheme://host:port` of an origin (an `Origin` header, or an allow-list entry), or None when it is not one.

    `null` (sandboxed frames, `file:` pages), a path, a query, credentials or another scheme than http(s) are not.
    """
    text = value.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None or parts.password is not None:
        return None
    if parts.path not in ('', '/') or parts.query or parts.fragment or text.endswith('?') or text.endswith('#'):
        return None
    host = parts.hostname.lower()
    if ':' in host:  # an IPv6 literal keeps its brackets
        host = f'[{host}]'
    return f'{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}'


def parse_origins(value: str) -> frozenset[str]:
    """The canonical origins of a comma-separated list; ValueError naming an entry that is not an origin."""
    origins = set()
    for entry in (e.strip() for e in value.split(',')):
        if not entry:
            continue
        origin = canonical_origin(entry)
        if origin is None:
            hint = ' (`*` would let every web page write: list the origins instead)' if entry == '*' else ''
            raise ValueError(
                f'allowed origin {entry[:100]!r} is not a web origin: write scheme://host[:port], e.g. '
                f'https://app.example.com or http://localhost:5173{hint}'
            )
        origins.add(origin)
    return frozenset(origins)


def own_origin(host: str | None, forwarded_proto: str | None) -> str | None:
    """The origin of the server a request was sent to: its `Host` header, over `X-Forwarded-Proto` (API Gateway sets
    `https`) or plain http (a local server)."""
    if not host:
        return None
    scheme = (forwarded_proto or 'http').split(',')[0].strip().lower()
    return canonical_origin(f'{scheme}://{host.strip()}')
