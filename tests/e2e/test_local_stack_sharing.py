"""Local stacks that share an AWS emulator stay apart; the local HTTP server takes a burst of clients; each function's
log lines name that function (issue 21, items 2, 2b, 5)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from om_cli import local_logs
from om_cli.local_stack import LocalLambdaContext, LocalStack, StackNames

pytestmark = pytest.mark.e2e


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method='POST', headers={'Content-Type': 'application/json'}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_stack_names_come_from_the_environment_and_default_as_before():
    assert StackNames.from_env({}) == StackNames()
    names = StackNames.from_env({'OM_STACK_PREFIX': 'alice', 'OM_TABLE_NAME': 'alice-mem', 'OM_BUCKET_NAME': 'al-b'})
    assert (names.table, names.bucket, names.queue, names.dead_letter_queue) == (
        'alice-mem',
        'al-b',
        'alice-work.fifo',
        'alice-work-dlq.fifo',
    )
    assert names.state_machine == names.reflection_function == 'alice-reflection'
    with pytest.raises(ValueError, match='OM_STACK_PREFIX'):
        StackNames.from_env({'OM_STACK_PREFIX': 'no spaces'})


def test_two_local_stacks_on_one_shared_emulator_keep_their_memory_and_queues_apart(monkeypatch):
    from moto.server import ThreadedMotoServer

    shared = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)
    shared.start()
    host, port = shared.get_host_and_port()
    try:
        monkeypatch.setenv('AWS_ENDPOINT_URL', f'http://{host}:{port}')
        for name in ('GEMINI_API_KEY', 'GOOGLE_API_KEY', 'GOOGLE_GEMINI_BASE_URL', 'OM_CONFIG', 'OM_CONFIG_FILE'):
            monkeypatch.delenv(name, raising=False)

        def stack(who: str) -> LocalStack:
            monkeypatch.setenv('OM_STACK_PREFIX', who)
            monkeypatch.setenv('OM_TABLE_NAME', f'{who}-memory')
            monkeypatch.setenv('OM_BUCKET_NAME', f'{who}-blobs')
            return LocalStack(port=0, sweep_interval_s=None, config={'observation': {'bufferTokens': False}})

        # Given Alice's stack saved a message on the shared emulator
        with stack('alice') as alice:
            step = {'resourceId': 'me', 'messages': [{'role': 'user', 'content': 'I live in Lisbon.'}]}
            assert post(alice.url, '/threads/t1/steps', step)[0] == 200
            alice_queue = alice.queue_url
        # When Bob's stack runs on the same emulator
        with stack('bob') as bob:
            # Then it has its own table, bucket and queues: Alice's thread does not exist there
            assert get(bob.url, '/threads/t1?resourceId=me') == 404
            assert bob.queue_url != alice_queue and 'bob-work.fifo' in bob.queue_url
            tables = bob.client('dynamodb').list_tables()['TableNames']
            queues = bob.client('sqs').list_queues()['QueueUrls']
        assert {'alice-memory', 'bob-memory'} <= set(tables)
        assert {q.rsplit('/', 1)[1] for q in queues} >= {'alice-work.fifo', 'bob-work.fifo', 'bob-work-dlq.fifo'}
        # And Alice's memory is still hers
        with stack('alice') as alice:
            assert get(alice.url, '/threads/t1?resourceId=me') == 200
    finally:
        shared.stop()


def test_the_local_api_takes_a_burst_of_fifty_clients_without_resets(monkeypatch):
    monkeypatch.delenv('AWS_ENDPOINT_URL', raising=False)
    with LocalStack(port=0, sweep_interval_s=None, workers=False) as stack:
        host, port = stack.url.removeprefix('http://').rsplit(':', 1)
        start = threading.Barrier(50)

        def health(_: int) -> str:
            start.wait()
            # A connection the listen backlog cannot queue is dropped or reset: with socketserver's backlog of 5,
            # most of 50 simultaneous clients wait a second or more (a SYN retransmit) or fail.
            try:
                with socket.create_connection((host, int(port)), timeout=0.8) as conn:
                    conn.settimeout(30)
                    conn.sendall(f'GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n'.encode())
                    return conn.recv(64).split(b'\r\n', 1)[0].decode()
            except OSError as exc:
                return f'{type(exc).__name__}: {exc}'

        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(health, range(50)))
    assert answers == ['HTTP/1.1 200 OK'] * 50, answers


def test_each_function_log_line_names_its_own_function_when_they_run_at_once():
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    functions = logging.getLogger(local_logs.FUNCTIONS_LOGGER)
    handler = Keep()
    functions.addHandler(handler)
    both_inside = threading.Barrier(2)
    try:

        def run(function: str) -> None:
            with local_logs.invocation(LocalLambdaContext(function)):
                both_inside.wait()  # the two invocations overlap, as in `om serve`
                functions.warning('working', extra={'who': function})

        threads = [threading.Thread(target=run, args=(name,)) for name in ('api', 'buffer_worker')]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        functions.removeHandler(handler)
    named = {record.who: record.function_name for record in records}  # type: ignore[attr-defined]
    assert named == {'api': 'om-api', 'buffer_worker': 'om-buffer-worker'}
