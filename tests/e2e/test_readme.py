"""The README's one-minute walk-through, run as written: `om serve` with the bundled quick-start configuration, then
`om chat` with the lines the README says to type. Within a minute memory observes and reflects, `om chat` says so
after the replies, and the memory the inspector would show holds what was said.

The commands are read from the README itself (only the port is chosen here, so the test never meets another
`om serve`), so the walk-through cannot drift from what the test runs.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.test_cli import clean_env, free_port, wait_for_health

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def walk_through() -> tuple[list[str], list[str], list[str]]:
    """The README's quick start: the `om serve` command, the `om chat` command and the lines to type."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    section = text.split('\n## Watch memory work in one minute\n', 1)[1].split('\n## ', 1)[0]
    blocks = re.findall(r'```(\w*)\n(.*?)```', section, re.DOTALL)
    commands = [body.strip() for kind, body in blocks if kind == 'bash' and body.strip().startswith('python3 dev.py')]
    serve = next(c for c in commands if ' om serve ' in f'{c} ')
    chat = next(c for c in commands if ' om chat' in c)
    lines = next(body for kind, body in blocks if kind == 'text').strip().splitlines()
    return serve.split(), chat.split(), lines


def test_the_quick_start_shows_observation_and_reflection_within_a_minute() -> None:
    serve_args, chat_args, lines = walk_through()
    assert serve_args[:4] == ['python3', 'dev.py', 'om', 'serve'] and 'examples/quickstart.json' in serve_args
    assert chat_args[:4] == ['python3', 'dev.py', 'om', 'chat'] and len(lines) >= 5
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    serve = subprocess.Popen(
        [sys.executable, *serve_args[1:], '--port', str(port)],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_health(url, timeout=60)
        chat = subprocess.run(
            [sys.executable, *chat_args[1:], '--url', url],
            cwd=ROOT,
            env=clean_env(),
            input='\n'.join([*lines, '/memory', '/quit']) + '\n',
            capture_output=True,
            text=True,
            timeout=60,
        )
        with urllib.request.urlopen(f'{url}/threads/t1/memory?resourceId=me', timeout=10) as response:
            memory = json.loads(response.read())
    finally:
        serve.send_signal(signal.SIGINT)
        _, serve_err = serve.communicate(timeout=60)
    out = chat.stdout
    assert chat.returncode == 0, chat.stderr
    assert 'Traceback' not in chat.stderr + serve_err, chat.stderr + serve_err
    # After the replies `om chat` said how far memory was from acting, then that it observed and reflected
    assert out.count('[memory] ') == len(lines), out
    assert 'observation in ' in out and 'reflection in ' in out
    assert 'observed ' in out or 'observation running in the background' in out, out
    assert re.search(r'reflected: [\d,]+ → [\d,]+ observation tokens', out), out
    # /memory: the log itself, the tokens left, when a quiet thread is swept
    assert 'User stated: My sister Marta is getting married in Porto' in out
    assert 'quiet thread: ' in out and '30 min after' in out  # when (or that nothing is left to sweep)
    # The memory the inspector shows: a reflected generation holding what was said, within its thresholds
    assert memory['generationCount'] >= 1 and 'Marta' in memory['observations']
    assert memory['thresholds']['messageTokens'] == 120 and memory['thresholds']['observationTokens'] == 200
    assert memory['upcoming']['quietSweep']['quietAfterSeconds'] == 1800
    assert memory['upcoming']['quietSweep']['intervalSeconds'] == 60  # om serve's sweeper, as the README says
