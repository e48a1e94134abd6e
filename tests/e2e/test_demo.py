"""`om demo` end to end, the way `python3 dev.py demo` runs it: its own process, its own embedded stack, the offline
model (no model credentials in its environment), the bundled conversation through the HTTP API, a table and a PNG.

A separate process keeps the demo's stack (and its environment changes) apart from the module-scoped stacks of the
other e2e modules.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# Model credentials and AWS endpoints that would make the demo leave the offline model or the embedded emulator.
DROPPED_ENV = ('GEMINI_API_KEY', 'GOOGLE_API_KEY', 'GOOGLE_GEMINI_BASE_URL', 'AWS_PROFILE')
ROW = re.compile(r'^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s{2}(.*)$')


def test_demo_prints_observations_and_a_reflection_and_writes_a_png(tmp_path):
    out = tmp_path / 'demo.png'
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in DROPPED_ENV and not name.startswith('AWS_ENDPOINT_URL')
    }
    result = subprocess.run(
        [sys.executable, '-m', 'om_cli.main', 'demo', '--out', str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f'stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}'
    stdout = result.stdout
    assert 'OFFLINE' in stdout, stdout[:500]

    # The table: a header, then one row per step (step, session, window tokens, observation tokens, gen, events).
    assert re.search(r'^\s*step\s+session\s+window tok\s+obs tok\s+gen\s+events\s*$', stdout, re.MULTILINE), stdout
    rows = [match.groups() for match in map(ROW.match, stdout.splitlines()) if match]
    assert len(rows) >= 5, stdout
    steps = [int(row[0]) for row in rows]
    assert steps == list(range(1, len(rows) + 1)), steps
    events = [row[5] for row in rows]
    assert any('observation:' in event for event in events), stdout
    assert any('reflection:' in event for event in events), stdout
    assert max(int(row[4]) for row in rows) >= 1 or any('(gen 1)' in event for event in events), stdout

    final = re.search(r'^Final observations \(generation (\d+), (\d+) tokens', stdout, re.MULTILINE)
    assert final, stdout
    assert int(final.group(1)) >= 1 and int(final.group(2)) > 0, final.group(0)

    # It prints the settings it runs with, and the offline Reflector reaches its target: the log ends under the
    # reflection threshold, and observations outnumber reflections (no reflecting on every observation)
    limit = re.search(r'reflection\.observationTokens\s+(\d+)', stdout)
    assert limit and 'observation.messageTokens' in stdout, stdout[:800]
    assert int(final.group(2)) < int(limit.group(1)), (final.group(0), limit.group(0))
    observed = sum('observation:' in event for event in events)
    reflected = sum('reflection:' in event or '(gen ' in event for event in events)
    assert observed > reflected >= 1, events
    # and every observation line it shows is whole: no cut sentence, no `…`, no date without lines under it
    shown = stdout.split('Final observations', 1)[1].split('plot written to', 1)[0].strip().splitlines()[1:]
    assert not [line for line in shown if '…' in line], shown
    for index, line in enumerate(shown):
        if line.startswith('Date:'):
            assert index + 1 < len(shown) and shown[index + 1].startswith('* '), shown

    assert out.is_file(), stdout
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b'IHDR' and data.endswith(b'IEND\xaeB`\x82'), data[:32]
    assert f'plot written to {out}' in stdout
