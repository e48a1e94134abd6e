"""The streamed chat turn on `om serve`, over real HTTP: frames as they happen, a client that goes away, 50 streams at
once, retried messages, and the real `ai` npm package reading the stream (tests/e2e/chat_stream.test.mjs).

One stack for the module; the fake Gemini streams the Actor's reply word by word (`:streamGenerateContent`), paced
so a test can tell "as it happens" from "all at the end".
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest

from om_cli.local_stack import LocalStack
from tests.dynalite import ensure_node_tools
from tests.e2e.browser import browser as browser  # noqa: F401 - fixtures
from tests.e2e.browser import page as page  # noqa: F401
from tests.e2e.conftest import ACTOR_REPLY, Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest
from tests.node import ensure_installed, exclusive

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = 'stream-user'
CONFIG = {'model': 'default', 'observation': {'messageTokens': 400, 'bufferTokens': False}}
OBSERVER = 'You are the memory of an AI assistant'
OBSERVATIONS = '<observations>\nDate: Mar 3, 2025\n* 🔴 (09:00) User shared travel plans for Lisbon\n</observations>'
WORD_DELAY_S = 0.03


class StreamingGemini:
    """The Observer answers after `observer_delay_s`; the Actor streams ACTOR_REPLY one word every WORD_DELAY_S."""

    def __init__(self) -> None:
        self.observer_delay_s = 0.0
        self.actor_calls = 0
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        if OBSERVER in request.system_text:
            return FakeReply.text(OBSERVATIONS, delay_s=self.observer_delay_s)
        if 'observation reflector' in request.system_text:
            return FakeReply.text(OBSERVATIONS)
        with self._lock:
            self.actor_calls += 1
        return FakeReply.text(ACTOR_REPLY + ' Enjoy the trip to Lisbon.').paced(WORD_DELAY_S)


@pytest.fixture(scope='module')
def gemini() -> Iterator[tuple[FakeGemini, StreamingGemini]]:
    behaviour = StreamingGemini()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, _ = gemini
    with running_stack(server, CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


@dataclass
class Streamed:
    """A streamed answer as a client saw it: status, headers, each chunk with when it arrived."""

    status: int
    headers: dict[str, str]
    chunks: list[tuple[float, Any]] = field(default_factory=list)
    body: Any = None

    def types(self) -> list[str]:
        return [c if isinstance(c, str) else c['type'] for _, c in self.chunks]

    def text(self) -> str:
        return ''.join(c['delta'] for _, c in self.chunks if isinstance(c, dict) and c['type'] == 'text-delta')

    def first(self, kind: str) -> float:
        return next(t for t, c in self.chunks if (c if isinstance(c, str) else c['type']) == kind)


def stream_chat(
    url: str, thread: str, body: dict[str, Any], *, stop_after: str | None = None, path: str = 'chat/stream'
) -> Streamed:
    """POST a chat and read its event stream frame by frame (`stop_after`: hang up once that chunk arrived)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    started = time.monotonic()
    connection.request(
        'POST',
        f'/threads/{thread}/{path}',
        body=json.dumps({'resourceId': RESOURCE, **body}),
        headers={'Content-Type': 'application/json', 'Accept': 'text/event-stream'},
    )
    response = connection.getresponse()
    got = Streamed(response.status, {k.lower(): v for k, v in response.getheaders()})
    if not got.headers.get('content-type', '').startswith('text/event-stream'):
        got.body = json.loads(response.read() or b'null')
        connection.close()
        return got
    buffer = b''
    try:
        while True:
            data = response.read1(65536)
            if not data:
                break
            buffer += data
            while b'\n\n' in buffer:
                event, buffer = buffer.split(b'\n\n', 1)
                assert event.startswith(b'data: '), event
                payload = event[6:].decode()
                chunk = payload if payload == '[DONE]' else json.loads(payload)
                got.chunks.append((time.monotonic() - started, chunk))
                if stop_after is not None and (chunk if isinstance(chunk, str) else chunk['type']) == stop_after:
                    return got
    finally:
        connection.close()
    return got


def stored(api: Api, thread: str) -> list[dict[str, Any]]:
    status, page = api.get(f'/threads/{thread}/messages?resourceId={RESOURCE}')
    assert status == 200, page
    return page['messages']


def test_the_turn_streams_as_it_happens(stack, api) -> None:
    got = stream_chat(stack.url, 'th-basic', {'content': 'I am planning a trip to Lisbon in May.'})
    assert got.status == 200
    assert got.headers['content-type'] == 'text/event-stream'
    assert got.headers['x-vercel-ai-ui-message-stream'] == 'v1'
    assert got.headers['cache-control'] == 'no-cache' and got.headers['x-accel-buffering'] == 'no'
    assert got.headers['transfer-encoding'] == 'chunked'
    types = got.types()
    assert types[0] == 'start' and types[1] == 'data-om-status' and types[-2:] == ['finish', '[DONE]']
    order = ['start-step', 'text-start', 'text-delta', 'text-end', 'finish-step', 'finish']
    assert [types.index(t) for t in order] == sorted(types.index(t) for t in order)
    # The text arrived word by word as the model wrote it, not all at the end
    deltas = [t for t, c in got.chunks if isinstance(c, dict) and c['type'] == 'text-delta']
    assert len(deltas) >= 8 and deltas[-1] - deltas[0] >= 5 * WORD_DELAY_S
    assert got.first('data-om-status') < deltas[0]
    # What was streamed is what was stored, under the id `start` announced
    reply = stored(api, 'th-basic')[-1]
    assert reply['id'] == got.chunks[0][1]['messageId'] and reply['parts'][0]['text'] == got.text()


def test_a_synchronous_observation_is_seen_while_it_runs(stack, api, gemini) -> None:
    _, behaviour = gemini
    thread = 'th-observe'
    long = 'We will stay in Alfama, visit Belem, take tram 28 and eat pasteis de nata every single day. ' * 20
    # Saved by a step (no turn: nothing is queued for the background), so the next step observes it itself
    status, _ = api.post(
        f'/threads/{thread}/steps', {'resourceId': RESOURCE, 'messages': [{'role': 'user', 'content': long}]}
    )
    assert status == 200
    behaviour.observer_delay_s = 0.6
    try:
        got = stream_chat(stack.url, thread, {'content': 'What should I pack?'})
    finally:
        behaviour.observer_delay_s = 0.0
    types = got.types()
    assert types.index('data-om-status') < types.index('data-om-observation-start')
    assert types.index('data-om-observation-start') < types.index('data-om-observation-end') < types.index('text-start')
    # observation-start went out when the Observer began, not when it ended
    assert got.first('data-om-observation-end') - got.first('data-om-observation-start') >= 0.5


def test_a_client_that_goes_away_does_not_lose_the_turn(stack, api, gemini) -> None:
    _, behaviour = gemini
    calls_before = behaviour.actor_calls
    got = stream_chat(
        stack.url, 'th-gone', {'message': {'id': 'gone-1', 'role': 'user', 'content': 'Hi'}}, stop_after='text-delta'
    )
    assert got.types()[-1] == 'text-delta'
    # The reply is still completed and saved, once
    messages = wait_for(lambda: (m := stored(api, 'th-gone')) and len(m) == 2 and m, timeout=20)
    assert [m['role'] for m in messages] == ['user', 'assistant']
    assert messages[1]['parts'][0]['text'].startswith(ACTOR_REPLY)
    assert behaviour.actor_calls == calls_before + 1
    # The same message sent again streams the stored reply, with no model call
    again = stream_chat(stack.url, 'th-gone', {'message': {'id': 'gone-1', 'role': 'user', 'content': 'Hi'}})
    assert again.text() == messages[1]['parts'][0]['text'] and behaviour.actor_calls == calls_before + 1
    assert len(stored(api, 'th-gone')) == 2


def test_fifty_streams_at_once_lose_nothing(stack, api) -> None:
    def one(n: int) -> tuple[int, Streamed]:
        return n, stream_chat(stack.url, f'th-many-{n}', {'content': f'Message number {n} about my trip.'})

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50)))
    for n, got in results:
        assert got.status == 200 and got.types()[-1] == '[DONE]', (n, got.types()[-3:])
        assert 'error' not in got.types()
        messages = stored(api, f'th-many-{n}')
        assert [m['role'] for m in messages] == ['user', 'assistant']
        assert messages[1]['parts'][0]['text'] == got.text()


def test_retries_of_one_message_store_one_reply_and_call_the_actor_once(stack, api, gemini) -> None:
    _, behaviour = gemini
    calls_before = behaviour.actor_calls
    message = {'message': {'id': 'retry-1', 'role': 'user', 'content': 'Remember: my flight is on May 3rd.'}}

    def send(n: int) -> Any:
        if n % 2:
            return stream_chat(stack.url, 'th-retry', message)
        return api.post('/threads/th-retry/chat', {'resourceId': RESOURCE, **message})

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(send, range(6)))
    answers.append(send(0))  # and once more after they all finished
    texts = set()
    for answer in answers:
        if isinstance(answer, Streamed):
            assert answer.status == 200, answer.body
            texts.add(answer.text())
        else:
            status, body = answer
            assert status == 200, body
            texts.add(body['reply']['parts'][0]['text'])
    assert len(texts) == 1
    assert behaviour.actor_calls == calls_before + 1
    assert [m['role'] for m in stored(api, 'th-retry')] == ['user', 'assistant']


def test_errors_before_the_turn_began_are_statuses_not_streams(stack, api) -> None:
    stream_chat(stack.url, 'th-err', {'message': {'id': 'e1', 'role': 'user', 'content': 'first'}})
    got = stream_chat(stack.url, 'th-err', {'message': {'id': 'e1', 'role': 'user', 'content': 'changed'}})
    assert got.status == 409 and got.body['error']['code'] == 'message_conflict'
    got = stream_chat(stack.url, 'th-err', {'content': ''})
    assert got.status == 422 and got.body['error']['code'] == 'validation_error'


# -- the real AI SDK reading the stream --------------------------------------------------------------------------------
def test_the_ai_sdk_reads_the_stream(stack, api) -> None:
    node = ensure_node_tools('the AI SDK stream tests')
    script = ROOT / 'tests' / 'e2e' / 'chat_stream.test.mjs'
    env = {**os.environ, 'OM_API_URL': stack.url, 'OM_RESOURCE_ID': RESOURCE}
    result = subprocess.run(
        [node, '--test', '--test-reporter=spec', str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT / 'tests' / 'tools',
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # What the SDK assembled is what was stored (the script prints the thread it used and the text it assembled)
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith('{"assembled"')))
    messages = stored(api, report['thread'])
    assert messages[-1]['parts'][0]['text'] == report['assembled']


# -- deployed: the Lambda streaming runtime ---------------------------------------------------------------------------
def test_the_lambda_runtime_streams_the_turn_to_the_runtime_api(stack, api) -> None:
    """The chat stream function's runtime loop (functions/api/stream_runtime.py) against a loopback Runtime API: the
    HTTP integration prelude, its delimiter, then the frames as the turn makes them; refusals as whole answers."""
    from functions.api.stream_runtime import PRELUDE_DELIMITER, RuntimeApi, serve
    from om_cli.local_stack import api_gateway_event
    from tests.fakes.fake_lambda_runtime import FakeRuntimeApi

    def event(thread: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {'Content-Type': ['application/json'], 'Accept': ['text/event-stream']}
        raw = json.dumps({'resourceId': RESOURCE, **body}).encode()
        return api_gateway_event('POST', f'/threads/{thread}/chat/stream', headers, raw)

    with FakeRuntimeApi() as runtime:
        streamed = runtime.invoke(event('th-lambda', {'content': 'Hello from API Gateway.'}))
        refused = runtime.invoke(event('th-lambda', {'content': ''}))
        loop = threading.Thread(
            target=serve, args=(RuntimeApi(runtime.address), stack.api_handler), kwargs={'invocations': 2}
        )
        loop.start()
        answer = runtime.answer(streamed)
        bad = runtime.answer(refused)
        loop.join(30)
    assert answer.kind == 'response'
    assert answer.headers['lambda-runtime-function-response-mode'] == 'streaming'
    assert answer.headers['content-type'] == 'application/vnd.awslambda.http-integration-response'
    assert answer.headers['transfer-encoding'] == 'chunked'
    prelude_raw, _, body = answer.body.partition(PRELUDE_DELIMITER)
    prelude = json.loads(prelude_raw)
    headers = {k.lower(): v for k, v in prelude.get('headers', {}).items()}
    headers |= {k.lower(): ', '.join(v) for k, v in prelude.get('multiValueHeaders', {}).items()}
    assert prelude['statusCode'] == 200 and headers['content-type'] == 'text/event-stream'
    assert headers['x-vercel-ai-ui-message-stream'] == 'v1'
    frames = [f for f in body.split(b'\n\n') if f]
    assert frames[-1] == b'data: [DONE]' and json.loads(frames[0][6:])['type'] == 'start'
    # one chunk per frame, sent as each was made (the reply's words are paced): not one write at the end
    assert len(answer.chunks) == len(frames) + 1
    assert answer.chunks[-1][0] - answer.chunks[1][0] >= 5 * WORD_DELAY_S
    assert answer.trailers == {}
    text = ''.join(json.loads(f[6:]).get('delta', '') for f in frames[:-1] if b'"text-delta"' in f)
    assert stored(api, 'th-lambda')[-1]['parts'][0]['text'] == text
    # a refusal before the turn began: its status and JSON body, whole
    prelude_raw, _, body = bad.body.partition(PRELUDE_DELIMITER)
    assert json.loads(prelude_raw)['statusCode'] == 422 and json.loads(body)['error']['code'] == 'validation_error'


# -- the example web page (examples/web-chat: useChat from @ai-sdk/react with om-client's transport) in Chromium ------
WEB_CHAT = ROOT / 'examples' / 'web-chat'
OM_CLIENT = ROOT / 'clients' / 'typescript'


def _page_unavailable(reason: str) -> NoReturn:
    if os.environ.get('OM_REQUIRE_DYNALITE'):  # CI: the page test must run, never skip quietly
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope='module')
def web_chat_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/web-chat built the way its README says: om-client built in this repository, the page's pinned
    packages from npm, bundled by esbuild."""
    node = ensure_node_tools('the example page test')
    for prefix in (OM_CLIENT, WEB_CHAT):
        ensure_installed(node, prefix, _page_unavailable)
    tsc = [node, str(OM_CLIENT / 'node_modules' / 'typescript' / 'bin' / 'tsc'), '-p', str(OM_CLIENT / 'tsconfig.json')]
    with exclusive(OM_CLIENT):  # the TypeScript client's own tests build the same dist/
        result = subprocess.run(tsc, cwd=OM_CLIENT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr  # om-client's dist/, what the page imports
    out = tmp_path_factory.mktemp('web-chat')
    build = [node, 'build.mjs', str(out / 'app.js')]
    result = subprocess.run(build, cwd=WEB_CHAT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    (out / 'index.html').write_text((WEB_CHAT / 'index.html').read_text().replace('./dist/app.js', './app.js'))
    return out


def test_the_example_page_streams_the_reply_and_shows_memory_work(stack, api, gemini, page, web_chat_bundle) -> None:
    _, behaviour = gemini
    thread = 'th-browser'
    long = 'My sister Maya moves to Lisbon in May with her cat Olive, and I will help her pack the flat. ' * 20
    status, _ = api.post(
        f'/threads/{thread}/steps', {'resourceId': RESOURCE, 'messages': [{'role': 'user', 'content': long}]}
    )
    assert status == 200
    # The page and its bundle come from the API's origin (the API answers no CORS preflight)
    page.route(
        f'{stack.url}/example/**',
        lambda route: route.fulfill(path=str(web_chat_bundle / route.request.url.rsplit('/', 1)[-1].split('?')[0])),
    )
    chat_requests: list[Any] = []
    page.on('request', lambda r: chat_requests.append(r) if r.method == 'POST' and '/threads/' in r.url else None)
    page.goto(f'{stack.url}/example/index.html?resource={RESOURCE}&thread={thread}')
    behaviour.observer_delay_s = 1.0
    try:
        page.fill('[data-testid=input]', 'What should Maya pack first?')
        page.click('[data-testid=send]')
        # An "observing" indicator while the synchronous observation runs
        page.wait_for_selector('[data-testid=observing]', state='visible', timeout=10_000)
        # Then text, while the reply is still being written
        first_text = "document.querySelector('[data-testid=message-assistant] [data-testid=text]')?.textContent"
        page.wait_for_function(f"() => ({first_text} ?? '').length > 0", timeout=15_000)
        early_text = page.locator('[data-testid=message-assistant] [data-testid=text]').first.text_content() or ''
        early_status = page.locator('[data-testid=status]').text_content()
        assert page.locator('[data-testid=observing]').count() == 0  # the observation ended before the reply began
        # And the memory's status once the turn is done
        page.wait_for_selector('[data-testid=memory-status]', timeout=15_000)
    finally:
        behaviour.observer_delay_s = 0.0
    final_text = page.locator('[data-testid=message-assistant] [data-testid=text]').first.text_content() or ''
    assert early_status == 'streaming' and 0 < len(early_text) < len(final_text)
    memory = page.locator('[data-testid=memory-status]').text_content() or ''
    assert memory.startswith('memory: ') and '/ 400 message tokens' in memory
    assert stored(api, thread)[-1]['parts'][0]['text'] == final_text
    # om-client's transport sent it: to the chat's thread, the newest message alone, asking for the stream
    [sent] = chat_requests
    body = json.loads(sent.post_data or '{}')
    assert urlsplit(sent.url).path == f'/threads/{thread}/chat' and sent.headers['accept'] == 'text/event-stream'
    assert body['resourceId'] == RESOURCE and [m['role'] for m in body['messages']] == ['user']
