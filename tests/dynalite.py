"""The suite's Node tools (`tests/tools`): dynalite, an offline DynamoDB whose single-item conditional writes are atomic
(moto's are not), and the AI SDK (`ai`), which reads the streamed chat route as a web app would.

They come from `tests/tools` (`npm ci --prefix tests/tools`, pinned by its package-lock.json). `ensure_node_tools()`
installs them when missing and skips the calling test only when node/npm are unavailable or the install fails (no
registry); CI sets OM_REQUIRE_DYNALITE, which turns those skips into failures. `running_dynalite()` starts dynalite
on a free loopback port for the duration of a block.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.node import ensure_installed, find_node

TOOLS = Path(__file__).resolve().parent / 'tools'
DYNALITE = TOOLS / 'node_modules' / 'dynalite' / 'cli.js'
AI_SDK = TOOLS / 'node_modules' / 'ai' / 'package.json'


def ensure_dynalite(purpose: str = 'dynalite race tests') -> str:
    """The `node` executable, with dynalite installed in tests/tools; `pytest.skip` when that is impossible."""
    return ensure_node_tools(purpose)


def ensure_node_tools(purpose: str) -> str:
    """The `node` executable, with tests/tools installed (dynalite, the AI SDK); `pytest.skip` when impossible."""
    node = find_node()
    if node is None:
        _unavailable(f'{purpose} need node (Node.js 18+); install it to run them')
    ensure_installed(node, TOOLS, _unavailable, DYNALITE, AI_SDK)
    return node


def _unavailable(reason: str) -> NoReturn:
    # CI sets OM_REQUIRE_DYNALITE: there the race tests must run, never skip quietly.
    if os.environ.get('OM_REQUIRE_DYNALITE'):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_dynalite(node: str) -> Iterator[str]:
    """dynalite on a free loopback port (in memory, tables active at once); yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [node, str(DYNALITE), '--host', '127.0.0.1', '--port', str(port), '--createTableMs', '0'],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(('127.0.0.1', port), timeout=0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()  # so that reading its stderr cannot block
                proc.wait(timeout=5)
                raise RuntimeError(f'dynalite did not start: {proc.stderr.read().decode() if proc.stderr else ""}')
            time.sleep(0.05)
        yield f'http://127.0.0.1:{port}'
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        if proc.stderr:
            proc.stderr.close()
