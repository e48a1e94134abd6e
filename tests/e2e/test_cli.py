"""The `om` command as a newcomer runs it: each mistake is one clear message (what was wrong, how to fix it), exit
status 2, never a traceback; `om invoke` says which stack it used and can reuse a running `om serve`; `dev.py`
passes Ctrl-C and SIGTERM on to what it runs and leaves nothing running; `om chat`'s commands work on the default
configuration (or say what to enable) and say when memory will act; the quiet log speaks in words.

Each command runs in its own process, as a user would start it, with no model credentials and no AWS endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from om_cli.local_stack import LocalStack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DROPPED_ENV = (
    'GEMINI_API_KEY',
    'GOOGLE_API_KEY',
    'GOOGLE_GEMINI_BASE_URL',
    'AWS_PROFILE',
    'OM_CONFIG',
    'OM_CONFIG_FILE',
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV and not k.startswith('AWS_ENDPOINT_URL')}
    return {**env, **extra}


def om(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, '-m', 'om_cli.main', *args],
        cwd=ROOT,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def assert_usage_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert 'Traceback' not in result.stderr + result.stdout, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return int(probe.getsockname()[1])


# -- item 1: one clear message and exit status 2 for each mistake ------------------------------------------------------
def test_cli_a_bad_config_file_names_the_file_actually_read_and_the_field(tmp_path):
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps({'observation': {'messageTokens': 'lots'}}))
    other = tmp_path / 'other.json'
    other.write_text('{}')
    # --config wins over OM_CONFIG_FILE: the message names the file that was read
    result = om('serve', '--config', str(bad), '--port', '0', env=clean_env(OM_CONFIG_FILE=str(other)))
    assert_usage_error(result, f'config file {bad}', 'observation.messageTokens', 'fix the file')
    assert 'OM_CONFIG_FILE' not in result.stderr and str(other) not in result.stderr
    broken = tmp_path / 'broken.json'
    broken.write_text('{"model": ')
    assert_usage_error(om('chat', '--config', str(broken)), f'config file {broken}', 'not valid JSON')


def test_cli_a_config_error_names_the_field_once(tmp_path):
    bad = tmp_path / 'bad.json'
    bad.write_text(json.dumps({'activateAfterIdle': '5x', 'observation': {'observeAttachments': 'images'}}))
    result = om('serve', '--config', str(bad), '--port', '0')
    assert_usage_error(
        result,
        "  - activateAfterIdle: '5x' is not a duration",
        '  - observation.observeAttachments: must be true, false, "auto" or a list of media types',
    )
    assert result.stderr.count('activateAfterIdle') == 1 and result.stderr.count('observeAttachments') == 1


def test_cli_a_port_in_use_says_so_and_how_to_pick_another():
    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = om('serve', '--port', str(port))
    assert_usage_error(result, f'port {port}', 'already in use', '--port')


def test_cli_chat_with_no_server_running_says_how_to_start_one():
    url = f'http://127.0.0.1:{free_port()}'
    assert_usage_error(om('chat', '--url', url), f'cannot reach om serve at {url}', 'om serve', 'leave out --url')


def test_cli_invoke_with_a_missing_or_broken_event_file_names_the_samples(tmp_path):
    result = om('invoke', 'sweeper', 'no/such/event.json')
    assert_usage_error(result, 'event file no/such/event.json not found', 'events/sweeper/schedule.json')
    broken = tmp_path / 'event.json'
    broken.write_text('{"detail": ')
    assert_usage_error(om('invoke', 'api', str(broken)), 'is not JSON', 'events/api/')
    assert_usage_error(om('invoke', 'nope', str(broken)), "invalid choice: 'nope'")


@pytest.mark.parametrize(
    ('args', 'fragments'),
    [
        (['serve', '--port', '99999'], ["om serve: argument --port: '99999' is not a port", '0 for any free one']),
        (['serve', '--port', '-1'], ["'-1' is not a port"]),
        (['inspect', '--api-url', 'http://x', '--port', '70000'], ["om inspect: argument --port: '70000'"]),
        (['serve', '--sweep-interval', '-5'], ["argument --sweep-interval: '-5' is not a number of seconds"]),
        (['demo', '--out', '/no/such/dir/x.png'], ['om demo: --out /no/such/dir/x.png', 'does not exist']),
        (['chat', '--thread', 'bad/id'], ["om chat: --thread 'bad/id' contains a slash", 'ids are 1-128']),
        (['serve', '--no-such-option'], ['om serve: unrecognized arguments: --no-such-option', 'om serve --help']),
    ],
)
def test_cli_each_mistake_is_one_line_and_exit_status_2_before_anything_runs(args, fragments):
    result = om(*args, timeout=30)
    assert_usage_error(result, *fragments)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert 'starting the local stack' not in result.stdout  # `om demo` checked --out before it ran


def test_cli_help_lists_the_chat_commands_one_a_line_and_no_empty_defaults():
    result = om('chat', '--help')
    assert result.returncode == 0, result.stderr
    assert '\n  /memory ' in result.stdout and '\n  /recall [QUERY] ' in result.stdout  # one command a line
    assert '(default: None)' not in result.stdout and ') (default:' not in result.stdout
    assert '(default: me)' in ' '.join(result.stdout.split()) and '(default: t1)' in ' '.join(result.stdout.split())
    for command in ('serve', 'invoke', 'inspect', 'demo'):
        text = om(command, '--help').stdout
        assert '(default: None)' not in text and '(default: False)' not in text, command


def test_cli_a_config_without_a_model_runs_on_the_default_model_and_invoke_says_which_stack(tmp_path):
    config = tmp_path / 'om.json'
    config.write_text(json.dumps({'observation': {'messageTokens': 500}}))
    result = om('invoke', 'api', 'events/api/health_get.json', '--config', str(config))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)['statusCode'] == 200
    assert 'a fresh local stack' in result.stderr and '--stack URL' in result.stderr


def test_cli_help_describes_every_option_with_an_example():
    from om_cli.main import build_parser

    top = om('--help')
    assert top.returncode == 0 and 'examples:' in top.stdout and 'om invoke sweeper' in top.stdout
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {'serve', 'invoke', 'chat', 'demo', 'inspect'}
    for name, command in commands.items():
        assert command.epilog and 'om ' in command.epilog, name  # an example of the whole command
        for action in command._actions:
            if isinstance(action, argparse._HelpAction | argparse._StoreTrueAction) or action.choices:
                continue
            assert action.help and 'e.g.' in action.help, (name, action.dest, action.help)


# -- item 4: om invoke against a running om serve ----------------------------------------------------------------------
def test_cli_invoke_with_stack_uses_the_running_local_stack_store(monkeypatch):
    for name in DROPPED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    with LocalStack(port=0, sweep_interval_s=None) as stack:
        url = stack.url
        # Given a thread created through the running stack's API
        body = json.dumps({'resourceId': 'user-42', 'id': 'thread-1', 'title': 'made by om serve'}).encode()
        request = urllib.request.Request(
            f'{stack.url}/threads', data=body, method='POST', headers={'Content-Type': 'application/json'}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201
        # When the sample event reads it through `om invoke --stack`
        result = om('invoke', 'api', 'events/api/thread_get.json', '--stack', url)
    # Then the function found it: same store, and the command said which stack it used
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer['statusCode'] == 200, answer
    assert json.loads(answer['body'])['thread']['title'] == 'made by om serve'
    assert f'the running local stack at {url}' in result.stderr
    unreachable = f'http://127.0.0.1:{free_port()}'
    assert_usage_error(
        om('invoke', 'api', 'events/api/health_get.json', '--stack', unreachable), 'cannot reach om serve'
    )


# -- item 2 (and 5): dev.py passes signals on and leaves no om serve running -------------------------------------------
def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path('/proc').iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / 'stat').read_text()
            except OSError:
                continue
            if int(stat.rsplit(')', 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
    except OSError:
        return False
    return state != 'Z'


def wait_for_health(url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f'{url}/health', timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f'om serve did not answer at {url} within {timeout} s')


def test_cli_serve_on_every_address_says_a_usable_url_and_when_memory_acts():
    # Bound to every address, with the quickstart configuration and a name a reverse proxy forwards without a port
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    serve = subprocess.Popen(
        [sys.executable, '-m', 'om_cli.main', 'serve', '--host', '0.0.0.0', '--port', str(port)]
        + ['--config', 'examples/quickstart.json', '--sweep-interval', '0', '--allowed-host', 'devbox.local'],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_health(url)

        def health(host: str) -> tuple[int, dict]:
            request = urllib.request.Request(f'{url}/health', headers={'Host': host})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert health('devbox.local')[0] == 200
        assert health(f'devbox.local:{port}')[0] == 200
        status, body = health('other.local')
        assert status == 421
        assert f'use {url}, or start it with `om serve --allowed-host other.local`' in body['error']['message']
    finally:
        serve.send_signal(signal.SIGINT)
        out, err = serve.communicate(timeout=60)
    assert f'om serve: {url}  (AWS:' in out, out
    assert 'http://0.0.0.0' not in out + err, out
    assert 'listening on every address (0.0.0.0)' in out and '--allowed-host NAME' in out, out
    # With bufferTokens false, a turn past the threshold queues the observation: the banner says so
    memory = next(line for line in out.splitlines() if line.startswith('memory:'))
    assert 'observes past 120 unobserved message tokens, in the background' in memory, memory
    assert 'the turn that passes it queues it' in memory and 'reflects past 200 observation tokens' in memory, memory


@pytest.mark.skipif(not Path('/proc').is_dir(), reason='finds child processes through /proc (Linux)')
@pytest.mark.parametrize('how', ['SIGTERM', 'Ctrl-C'])
def test_dev_py_forwards_the_signal_and_leaves_no_om_serve_running(how):
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    dev = subprocess.Popen(
        [sys.executable, 'dev.py', 'om', 'serve', '--port', str(port), '--sweep-interval', '0'],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        wait_for_health(url)
        with pytest.raises(urllib.error.HTTPError):  # a request through the API (404: no such thread)
            urllib.request.urlopen(f'{url}/threads/t1/memory?resourceId=me', timeout=10)
        serve = children_of(dev.pid)
    except BaseException:
        dev.kill()
        raise
    assert serve and all(alive(pid) for pid in serve)
    if how == 'Ctrl-C':
        os.killpg(dev.pid, signal.SIGINT)  # the terminal signals the whole foreground group
    else:
        dev.send_signal(signal.SIGTERM)  # `kill` or a CI runner tells dev.py only
    out, err = dev.communicate(timeout=60)
    assert dev.returncode == 0, (dev.returncode, err)
    assert not [pid for pid in serve if alive(pid)], 'om serve is still running'
    assert 'Traceback' not in err, err
    assert 'stopping ...' in err
    # Quiet by default: one line per request naming it, no metric blobs, no raw emulator request lines (item 5)
    assert 'GET /health 200' in err and '"_aws"' not in out + err, (out, err)
    with pytest.raises(OSError):
        urllib.request.urlopen(f'{url}/health', timeout=2)


def test_cli_the_quiet_log_says_a_failed_reflection_in_words_without_emulator_internals(tmp_path):
    from tests.fakes.fake_gemini import FakeGemini, FakeReply, fake_gemini_env

    def models(request):  # the Observer writes a log; the Reflector's model refuses the request: the workflow fails
        if 'observation reflector' in request.system_text:
            return FakeReply.error(400, 'the reflector model refuses this request')
        if 'You are the memory of an AI assistant' in request.system_text:
            lines = '\n'.join(f'* 🔴 (09:{i:02d}) User stated fact {i} about the launch plan' for i in range(12))
            return FakeReply.text(f'<observations>\nDate: Mar 3, 2025\n{lines}\n</observations>')
        return FakeReply.text('ok')

    config = tmp_path / 'om.json'
    config.write_text(
        json.dumps(
            {'observation': {'messageTokens': 200, 'bufferTokens': False}, 'reflection': {'observationTokens': 300}}
        )
    )
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    with FakeGemini(models) as gemini:
        serve = subprocess.Popen(
            [
                sys.executable,
                '-m',
                'om_cli.main',
                'serve',
                '--port',
                str(port),
                '--config',
                str(config),
                '--sweep-interval',
                '0',
            ],
            cwd=ROOT,
            env=clean_env(**fake_gemini_env(gemini)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for_health(url)

            def memory() -> dict:
                with urllib.request.urlopen(f'{url}/threads/t0/memory?resourceId=me', timeout=10) as response:
                    return json.loads(response.read())

            # Turns only: each turn queues the observation that is due (the worker does it), and once the log is past
            # observationTokens the reflection workflow starts, whose Reflector call fails for good
            words = ' '.join(f'launch plan owner deadline budget {n}' for n in range(50))
            deadline = time.monotonic() + 60
            failures: list = []
            while not failures and time.monotonic() < deadline:
                body = {
                    'resourceId': 'me',
                    'messages': [{'role': 'user', 'content': words}, {'role': 'assistant', 'content': 'ok'}],
                }
                headers = {'Content-Type': 'application/json'}
                request = urllib.request.Request(
                    f'{url}/threads/t0/turns', data=json.dumps(body).encode(), headers=headers
                )
                urllib.request.urlopen(request, timeout=30).close()
                while memory()['pendingMessageTokens'] and time.monotonic() < deadline:
                    time.sleep(0.2)  # the worker observes what the turn queued
                time.sleep(1)  # and the workflow it started runs
                failures = memory()['recentFailures']
            assert [f['operationType'] for f in memory()['recentFailures']][:1] == ['reflection']
        finally:
            serve.send_signal(signal.SIGINT)
            out, err = serve.communicate(timeout=60)
    log = out + err
    assert 'reflection not committed; the previous observations were kept' in log, log
    assert 'object at 0x' not in log and 'moto.' not in log and 'Exception=' not in log, log
    assert 'Traceback' not in log


# -- item 3: om chat's commands ---------------------------------------------------------------------------------------
def test_cli_chat_commands_show_memory_threads_recall_and_switch_threads(monkeypatch):
    import io

    from om_cli.main import Chat

    for name in DROPPED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    # The default configuration (no retrieval, no vectors), with the sweeper running every 60 s as in `om serve`
    with LocalStack(port=0, sweep_interval_s=60) as stack:
        out = io.StringIO()
        chat = Chat(stack.url, 'ana', 'trip', out=out)
        assert chat.handle('My name is Ana and I live in Porto. ' + 'I love long walks by the river. ' * 20)
        first = out.getvalue()
        assert 'assistant> (offline model)' in first
        # After the reply: how far memory is from acting, from GET …/memory
        assert '[memory] observation in ' in first and ' tokens (' in first and 'reflection in 40,000 tokens' in first
        for command in ('/help', '/memory', '/threads', '/recall', '/recall river walks', '/new side-quest'):
            assert chat.handle(command)
        assert chat.handle('/new bad/id') and chat.thread == 'side-quest'  # refused with the API's id rule
        assert chat.handle('/recall') and chat.handle('/nope')
        assert chat.handle('/quit') is False
    text = out.getvalue()
    assert '/recall [QUERY]' in text and '/memory' in text  # /help
    assert 'messages      [' in text and 'observations  [' in text and 'the Observer runs in ' in text  # /memory
    assert 'the Reflector runs in 40,000 more' in text
    assert 'quiet thread: if nothing more is said, the sweeper observes it by ' in text and '30 min after' in text
    assert '  trip' in text and '← current' in text  # /threads
    # /recall on the default configuration: the thread's messages from its start, written for a reader
    assert "messages 1-2 of thread 'trip', oldest first:" in text and 'you (not observed yet): My name is Ana' in text
    assert 'cursor=' not in text and 'detail=' not in text and 'call recall' not in text
    # /recall QUERY without vectors says what to enable
    assert 'searching by meaning needs vectors: add "retrieval": {"vector": true}' in text
    assert "now in thread 'side-quest'" in text
    assert "thread id 'bad/id' contains a slash ('/'); ids are 1-128" in text and "still in thread 'side-quest'" in text
    assert "(thread 'side-quest' has no messages yet: say something to start it)" in text  # /recall, a new thread
    assert 'unknown command /nope; /help lists the commands' in text


def test_cli_chat_recall_query_finds_messages_by_meaning_when_vectors_are_on(monkeypatch):
    import io

    from om_cli.main import Chat

    for name in DROPPED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    config = {'retrieval': {'vector': True}}
    with LocalStack(port=0, sweep_interval_s=None, config=config, env={'OM_EMBEDDING_MODEL': 'hashing'}) as stack:
        out = io.StringIO()
        chat = Chat(stack.url, 'ana', 'trip', out=out)
        for line in ('My cello lesson is on Thursdays.', 'The weather in Lisbon is sunny.', '/recall cello lesson'):
            assert chat.handle(line)
    text = out.getvalue()
    assert "message(s) like 'cello lesson', with their neighbours:" in text, text
    assert ' you: My cello lesson is on Thursdays.' in text, text


def test_cli_chat_escapes_ids_in_paths_and_queries(monkeypatch):
    import io

    from om_cli.main import Chat

    for name in DROPPED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    config = {'observation': {'messageTokens': 300, 'bufferTokens': False}}
    with LocalStack(port=0, sweep_interval_s=None, workers=False, config=config) as stack:
        out = io.StringIO()
        # Ids may hold `&`, `+` and `:`, which mean something else in a query string
        chat = Chat(stack.url, 'acme:a&b+c', 'trip+1', out=out)
        for line in ('I live in Porto. ' + 'I love long walks by the river. ' * 40, '/memory', '/threads'):
            assert chat.handle(line)
        # No background worker here: the next message's step observes the first turn itself, and says so
        before = len(out.getvalue())
        assert chat.handle('Where do I live?')
        turn = out.getvalue()[before:]
    text = out.getvalue()
    assert "memory of thread 'trip+1'" in text and '  trip+1  updated' in text, text
    assert '[4' not in text, text
    lines = turn.splitlines()
    assert lines[0] == '  … observing memory' and lines[1] == '  … observing done', turn
    # ... then the reply, then the memory's status line, which says in words what memory did in this turn
    assert lines[2].startswith('assistant> ') and lines[-1].startswith('  [memory] observation in '), turn
    assert re.search(r'· observed [\d,]+ message tokens', lines[-1]), turn
