"""What the local commands share: the environment they read before the stack's own wiring (`functions/_wiring.py`)
runs, and a small JSON client for talking to a running stack."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

# Powertools settings that keep the functions' JSON logs and metrics off an interactive terminal.
from om_cli.local_logs import QUIET_FUNCTIONS

CREDENTIAL_VARS = ('GEMINI_API_KEY', 'GOOGLE_API_KEY')
__all__ = ['CREDENTIAL_VARS', 'QUIET_FUNCTIONS', 'has_model_credentials', 'http_json', 'model_notice']


def has_model_credentials(env: Mapping[str, str]) -> bool:
    """True when a Gemini key (or a Gemini-compatible base URL, e.g. a gateway or a test double) is configured."""
    return any(env.get(name) for name in CREDENTIAL_VARS) or bool(env.get('GOOGLE_GEMINI_BASE_URL'))


def model_notice() -> str:
    """One line saying which model the local stack runs on."""
    if has_model_credentials(os.environ):
        return 'model: Gemini (GEMINI_API_KEY / GOOGLE_GEMINI_BASE_URL)'
    return 'model: the built-in OFFLINE model (no GEMINI_API_KEY set): deterministic, no network'


def http_json(base_url: str, method: str, path: str, body: Any = None, *, timeout: float = 60.0) -> tuple[int, Any]:
    """One JSON request; answers (status, parsed body) for errors too."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base_url + path, data=data, method=method, headers={'Content-Type': 'application/json'}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the user's own server
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return exc.code, {'error': {'message': raw.decode(errors='replace')}}
