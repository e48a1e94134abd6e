"""The memory inspector: one static page (HTML, CSS, JS) and the failure reasons' explanations, shipped as package
data. No build step and nothing fetched from elsewhere: these files are what the browser runs.

`GET /inspector` serves it where a deployment turns it on (`functions/api/inspector_route.py`, `OM_INSPECTOR`), and
`om inspect` serves the same files on loopback (`om_cli/inspect.py`). The page calls the API with paths relative to
where it is served from, so it works under a stage prefix (`/prod/inspector`) and behind the loopback proxy alike.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PAGE = 'index.html'
# The files the page loads, by name under `/inspector/`, with their media types. Nothing else is served.
ASSETS: dict[str, str] = {
    'inspector.css': 'text/css; charset=utf-8',
    'inspector.js': 'text/javascript; charset=utf-8',
    'failure-reasons.json': 'application/json',
}
HTML = 'text/html; charset=utf-8'
# The page runs only its own files and talks only to where it came from; no framing, no referrer.
SECURITY_HEADERS: dict[str, str] = {
    'Content-Security-Policy': (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: https:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    'X-Content-Type-Options': 'nosniff',
    'Referrer-Policy': 'no-referrer',
    'X-Frame-Options': 'DENY',
    'Cache-Control': 'no-cache',
}
# The placeholder in index.html for where the assets are, relative to the page's own URL.
_PREFIX = '{{ASSETS}}'


@cache
def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def page(*, trailing_slash: bool = False) -> bytes:
    """The HTML page. Its assets are named relative to the page: `inspector/x` from `/inspector`, `x` from
    `/inspector/`."""
    prefix = '' if trailing_slash else 'inspector/'
    return _read(PAGE).replace(_PREFIX.encode(), prefix.encode())


def asset(name: str) -> tuple[bytes, str] | None:
    """(content, media type) of one of the page's files, or None for any other name."""
    media_type = ASSETS.get(name)
    return (_read(name), media_type) if media_type is not None else None


def failure_reasons() -> list[dict[str, Any]]:
    """The failure reasons the page explains: `[{reason, meaning, next, youCan}]` (the table in docs/operations.md is
    the same; a test keeps them equal)."""
    reasons: list[dict[str, Any]] = json.loads(_read('failure-reasons.json'))['reasons']
    return reasons
