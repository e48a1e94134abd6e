"""What the API edge refuses so that a web page, a look-alike id or a loosely typed body cannot get in: the findings of
a security probe, over HTTP on the local stack.

- A write from a web page of another origin is 403 (an allow-listed origin may write, with CORS answers); a body
  without a Content-Type is 415 on every route, so a browser's no-preflight request never reaches a route.
- Ids are NFC, with no default-ignorable character and no Hangul filler; request bodies are strictly typed (no
  string → bool/int coercion); duplicate JSON keys are 400; message parts link only `https:`, `data:` and the
  caller's own `s3:` objects.
- `GET /_om/local-stack` answers only loopback callers of a stack without authentication; JSON answers carry
  `X-Content-Type-Options: nosniff`.

"Nothing was written" is checked on the storage itself (every table item and bucket object). Thresholds are out of
reach, so no background work changes the storage behind a test's back.
"""

from __future__ import annotations

import http.client
import json
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from om_cli.local_stack import DESCRIBE_PATH, LocalStack, api_gateway_event
from tests.e2e.browser import browser as browser  # noqa: F401 - the fixture
from tests.e2e.conftest import Storage, running_stack

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 1_000_000, 'bufferTokens': False},
    'reflection': {'observationTokens': 1_000_000},
    'workingMemory': {'enabled': True},
    'retrieval': True,
}
ALLOWED = 'http://allowed.example:3000'


@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, _ = gemini
    with running_stack(server, CONFIG, {'OM_ALLOWED_ORIGINS': f'{ALLOWED}, https://other.example'}) as running:
        yield running


@pytest.fixture(scope='module')
def storage(stack) -> Storage:
    return Storage(stack)


def send(
    stack: LocalStack, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """A raw request: exactly these headers (http.client adds Host and Content-Length only)."""
    parts = urlsplit(stack.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        payload = response.read()
        answer = json.loads(payload) if payload and 'json' in (response.getheader('Content-Type') or '') else payload
        return response.status, {k.lower(): v for k, v in response.getheaders()}, answer
    finally:
        connection.close()


def send_json(stack: LocalStack, method: str, path: str, body: Any, **headers: str) -> tuple[int, dict[str, str], Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send(stack, method, path, raw, {'Content-Type': 'application/json', **headers})


def refused(status: int, answer: Any, expected: int, code: str) -> dict[str, Any]:
    assert status == expected, (status, answer)
    assert set(answer) == {'error'} and answer['error']['code'] == code and answer['error']['message'], answer
    return answer['error']


def user(text: str, mid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {'role': 'user', 'content': text, **({'id': mid} if mid else {}), **extra}


def steps(resource: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {'resourceId': resource, 'messages': list(messages), **extra}


# ---------------------------------------------------------------------------------------------------------------------
# A browser on another origin
# ---------------------------------------------------------------------------------------------------------------------
def _every_operation(stack: LocalStack) -> list[tuple[str, str]]:
    """(method, path) of every operation in the OpenAPI document, path parameters filled in."""
    status, _, document = send(stack, 'GET', '/openapi.json')
    assert status == 200
    out = []
    for template, operations in document['paths'].items():
        path = template.replace('{threadId}', 'ct-1').replace('{resourceId}', 'ct')
        out += [(method.upper(), path) for method in operations if method != 'parameters']
    return out


def test_a_body_without_content_type_is_415_on_every_route_and_writes_nothing(stack, storage):
    assert send_json(stack, 'POST', '/threads/ct-1/steps', steps('ct', user('hello', 'ct-m1')))[0] == 200
    before = storage.snapshot()
    operations = _every_operation(stack)
    assert len(operations) > 20
    body = json.dumps({'resourceId': 'ct', 'content': 'from a page', 'messages': [user('x')]}).encode()
    for method, path in operations:
        status, headers, answer = send(stack, method, f'{path}?resourceId=ct', body, {})
        error = refused(status, answer, 415, 'unsupported_media_type')
        assert 'Content-Type: application/json' in error['message'], (method, path, error)
        assert headers['x-content-type-options'] == 'nosniff'
    # A `text/plain` body (the other type a page may send without asking) is refused the same way
    status, _, answer = send(stack, 'POST', '/threads/ct-1/chat', body, {'Content-Type': 'text/plain'})
    refused(status, answer, 415, 'unsupported_media_type')
    assert storage.snapshot() == before
    # A request without a body needs no Content-Type
    status, _, answer = send(stack, 'GET', '/threads/ct-1/messages?resourceId=ct')
    assert status == 200 and [m['id'] for m in answer['messages']] == ['ct-m1'], answer


def test_a_write_from_another_origin_is_403_and_stores_nothing(stack, storage):
    before = storage.snapshot()
    host = urlsplit(stack.url).netloc
    port = urlsplit(stack.url).port
    for origin in (f'http://127.0.0.1:{port + 1}', f'http://localhost:{port}', 'https://evil.example', 'null'):
        for method, path, body in (
            ('POST', '/threads/xo-1/chat', {'resourceId': 'xo', 'content': 'written by a page'}),
            ('POST', '/threads', {'resourceId': 'xo', 'id': 'xo-2'}),
            ('DELETE', '/resources/xo', None),
            ('PUT', '/resources/xo/working-memory', {'workingMemory': '# page'}),
        ):
            status, _, answer = send_json(stack, method, path, body or {}, Origin=origin, Host=host)
            error = refused(status, answer, 403, 'origin_not_allowed')
            assert 'allowed origins' in error['message'], error
    assert storage.snapshot() == before
    # Reads from another origin are answered (the browser keeps the answer from the page: no CORS header)
    status, headers, _ = send(stack, 'GET', '/threads/xo-1?resourceId=xo', None, {'Origin': 'https://evil.example'})
    assert status == 404 and 'access-control-allow-origin' not in headers
    # The server's own origin (its pages: the inspector) writes as usual
    status, _, answer = send_json(stack, 'POST', '/threads', {'resourceId': 'xo', 'id': 'xo-own'}, Origin=stack.url)
    assert status == 201, answer


def test_an_allowed_origin_writes_and_gets_cors_answers(stack):
    preflight = {
        'Origin': ALLOWED,
        'Access-Control-Request-Method': 'POST',
        'Access-Control-Request-Headers': 'content-type, authorization',
    }
    status, headers, _ = send(stack, 'OPTIONS', '/threads/al-1/chat', None, preflight)
    assert status == 204, headers
    assert headers['access-control-allow-origin'] == ALLOWED and 'origin' in headers['vary'].lower()
    assert 'POST' in headers['access-control-allow-methods']
    assert 'content-type' in headers['access-control-allow-headers'].lower()
    status, headers, answer = send_json(
        stack, 'POST', '/threads/al-1/chat', {'resourceId': 'al', 'content': 'hello'}, Origin=ALLOWED
    )
    assert status == 200 and answer['reply'], answer
    assert headers['access-control-allow-origin'] == ALLOWED
    # Another origin's preflight is refused: the browser never sends its request
    status, headers, _ = send(stack, 'OPTIONS', '/threads/al-1/chat', None, {**preflight, 'Origin': 'https://x.test'})
    assert status == 403 and 'access-control-allow-origin' not in headers


def test_a_page_on_another_loopback_origin_cannot_write(stack, storage, browser):  # noqa: F811 - the fixture
    """A real browser: a page served from another loopback origin tries every way to post a chat message."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    target = stack.url.replace('127.0.0.1', 'localhost')  # another origin for the browser, the same server
    script = f"""
    async () => {{
      const body = JSON.stringify({{resourceId: 'page', content: 'written by a page'}});
      const url = '{target}/threads/page-1/chat';
      const results = [];
      for (const init of [
        {{method: 'POST', mode: 'no-cors', body: new Blob([body])}},
        {{method: 'POST', mode: 'no-cors', body, headers: {{'Content-Type': 'text/plain'}}}},
        {{method: 'POST', mode: 'cors', body, headers: {{'Content-Type': 'application/json'}}}},
        {{method: 'POST', mode: 'no-cors', body: new URLSearchParams({{resourceId: 'page'}})}},
      ]) {{
        try {{ const r = await fetch(url, init); results.push(r.type + ':' + r.status); }}
        catch (e) {{ results.push('blocked'); }}
      }}
      const form = document.createElement('form');
      form.method = 'POST'; form.action = url; form.enctype = 'text/plain';
      const field = document.createElement('input'); field.name = body.slice(0, -2); field.value = '"}}';
      form.appendChild(field); document.body.appendChild(form);
      return results;
    }}
    """

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            payload = b'<!doctype html><title>another site</title><p>hello</p>'
            self.send_response(200)
            self.send_header('Content-Type', 'text/html')
            self.send_header('Content-Length', str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    site = ThreadingHTTPServer(('127.0.0.1', 0), Page)
    Thread(target=site.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        before = storage.snapshot()
        page = context.new_page()
        page.goto(f'http://127.0.0.1:{site.server_address[1]}/')
        results = page.evaluate(script)
        assert len(results) == 4, results
        # The form posts too (a top-level navigation: no CORS at all)
        with page.expect_navigation():
            page.evaluate('() => document.forms[0].submit()')
        assert storage.snapshot() == before, results
        status, _, _ = send(stack, 'GET', '/threads/page-1?resourceId=page')
        assert status == 404
    finally:
        context.close()
        site.shutdown()
        site.server_close()


# ---------------------------------------------------------------------------------------------------------------------
# Ids, strict bodies, duplicate keys, URLs
# ---------------------------------------------------------------------------------------------------------------------
INVISIBLE = ['\u3164', '\u115f', '\u1160', '\uffa0', '\u3164\u3164', 'a\u034fb', 'a\ufe0fb', 'a\u2065b', 'a\U000e0041']
NOT_NFC = [unicodedata.normalize('NFD', 'café'), '\u212b', 'Ohm\u2126', '\u1112\u1161']  # é, Å, Ω, 하 decomposed


@pytest.mark.parametrize('bad', INVISIBLE + NOT_NFC, ids=lambda v: v.encode('unicode_escape').decode())
def test_invisible_and_unnormalised_ids_are_422_in_paths_and_bodies(stack, storage, bad):
    before = storage.snapshot()
    q = quote(bad, safe='')
    for method, path, body in (
        ('POST', '/threads', {'resourceId': bad}),
        ('POST', '/threads', {'resourceId': 'ids', 'id': bad}),
        ('POST', f'/threads/{q}/steps', steps('ids', user('hi'))),
        ('POST', '/threads/ids-1/steps', steps('ids', user('hi', bad))),
        ('GET', f'/resources/{q}/threads', None),
        ('DELETE', f'/threads/ids-1?resourceId={q}', None),
    ):
        status, _, answer = send_json(stack, method, path, body) if body else send(stack, method, path)
        error = refused(status, answer, 422, 'invalid_id')
        assert 'ids are 1-128' in error['message'], (path, error)
    assert storage.snapshot() == before


def test_the_nfc_form_of_an_id_is_accepted(stack):
    nfc = unicodedata.normalize('NFC', 'café-하-Å')
    status, _, answer = send_json(stack, 'POST', '/threads', {'resourceId': nfc, 'id': nfc})
    assert status == 201 and answer['thread']['id'] == nfc, answer


@pytest.mark.parametrize(
    ('path', 'body', 'field'),
    [
        ('/threads/st-1/steps', steps('st', user('hi'), readOnly='no'), 'readOnly'),
        ('/threads/st-1/steps', steps('st', user('hi'), stepNumber='3'), 'stepNumber'),
        ('/threads/st-1/chat', {'resourceId': 'st', 'content': 'hi', 'readOnly': 1}, 'readOnly'),
        (
            '/attachments',
            {'resourceId': 'st', 'threadId': 'st-1', 'filename': 'a.png', 'mediaType': 'image/png', 'size': '15'},
            'size',
        ),
        ('/threads/st-1/clone', {'resourceId': 'st', 'messageLimit': '2'}, 'messageLimit'),
        ('/threads/st-1/messages/query', {'resourceId': 'st', 'page': '1'}, 'page'),
        ('/threads/st-1/messages/query', {'resourceId': 'st', 'include': [{'id': 'a', 'withNextMessages': '2'}]},
         'include[0].withNextMessages'),
        ('/recall', {'resourceId': 'st', 'threadId': 'st-1', 'limit': '5'}, 'limit'),
        ('/threads/st-1/steps',
         steps('st', {'role': 'user', 'parts': [{'type': 'image', 'url': 'https://x.test/a.png', 'width': '10'}]}),
         'messages[0].parts[0].image.width'),
        ('/threads/st-1/turns',
         steps('st', {'role': 'tool', 'parts': [
             {'type': 'tool-result', 'toolCallId': 'c', 'toolName': 't', 'result': 1, 'isError': 'false'}]}),
         'messages[0].parts[0].tool-result.isError'),
    ],
)  # fmt: skip
def test_strings_are_not_coerced_to_booleans_or_numbers(stack, storage, path, body, field):
    assert send_json(stack, 'POST', '/threads', {'resourceId': 'st', 'id': 'st-1'})[0] in (201, 409)
    before = storage.snapshot()
    status, _, answer = send_json(stack, 'POST', path, body)
    error = refused(status, answer, 422, 'validation_error')
    assert field in [d['field'] for d in error['details']], error
    assert storage.snapshot() == before


def test_query_strings_still_carry_numbers(stack):
    assert send_json(stack, 'POST', '/threads', {'resourceId': 'st', 'id': 'st-2'})[0] == 201
    status, _, answer = send(stack, 'GET', '/threads/st-2/messages?resourceId=st&perPage=5&page=0')
    assert status == 200 and answer['perPage'] == 5, answer


@pytest.mark.parametrize(
    'raw',
    [
        b'{"resourceId": "dup", "resourceId": "other", "messages": [{"role": "user", "content": "hi"}]}',
        b'{"resourceId": "dup", "messages": [{"role": "user", "content": "hi", "content": "bye"}]}',
    ],
)
def test_duplicate_keys_are_400_invalid_json(stack, storage, raw):
    before = storage.snapshot()
    status, _, answer = send_json(stack, 'POST', '/threads/dup-1/steps', raw)
    error = refused(status, answer, 400, 'invalid_json')
    assert 'duplicate' in error['message'] and error['details'][0]['type'] == 'json_duplicate_key', error
    assert storage.snapshot() == before


def test_parts_link_only_https_data_and_the_callers_own_uploads(stack, storage):
    status, _, answer = send_json(stack, 'POST', '/threads', {'resourceId': 'urls', 'id': 'urls-1'})
    assert status == 201, answer
    status, _, upload = send_json(
        stack,
        'POST',
        '/attachments',
        {'resourceId': 'urls', 'threadId': 'urls-1', 'filename': 'a.png', 'mediaType': 'image/png', 'size': 3},
    )
    assert status == 201, upload
    bucket = stack.names.bucket
    png = 'iVBORw0KGgo='
    bad_urls = [
        'javascript:alert(1)',
        'http://example.com/a.png',
        'file:///etc/passwd',
        'ftp://example.com/a.png',
        'JAVASCRIPT:alert(1)',
        f's3://{bucket}/other/threads/t/attachments/x/a.png',  # another resource's prefix
        f's3://{bucket}/urlsx/threads/urls-1/attachments/x/a.png',
        's3://another-bucket/urls/threads/urls-1/attachments/x/a.png',
    ]
    before = storage.snapshot()
    for url in bad_urls:
        for kind in ('image', 'file'):
            part = {'type': kind, 'url': url, 'mediaType': 'image/png'}
            status, _, answer = send_json(
                stack, 'POST', '/threads/urls-1/steps', steps('urls', {'role': 'user', 'parts': [part]})
            )
            error = refused(status, answer, 422, 'validation_error')
            assert any(d['field'].endswith('.url') for d in error['details']), (url, error)
    assert storage.snapshot() == before
    for url in ('https://example.com/a.png', f'data:image/png;base64,{png}', upload['url']):
        part = {'type': 'image', 'url': url, 'mediaType': 'image/png'}
        status, _, answer = send_json(
            stack, 'POST', '/threads/urls-1/steps', steps('urls', {'role': 'user', 'parts': [part]})
        )
        assert status == 200, (url, answer)


# ---------------------------------------------------------------------------------------------------------------------
# Local-only surfaces
# ---------------------------------------------------------------------------------------------------------------------
def test_json_answers_say_nosniff(stack):
    for method, path, body in (
        ('GET', '/health', None),
        ('GET', '/openapi.json', None),
        ('GET', '/no-such-route', None),
        ('POST', '/threads', b'{'),
        ('GET', DESCRIBE_PATH, None),
    ):
        status, headers, _ = send_json(stack, method, path, body) if body else send(stack, method, path)
        assert headers.get('x-content-type-options') == 'nosniff', (path, status, headers)


def test_the_stack_description_is_for_loopback_callers_of_an_open_stack_only(stack, settings_env):
    status, _, answer = send(stack, 'GET', DESCRIBE_PATH)
    assert status == 200 and answer['endpoint'] == stack.endpoint
    # Not to a caller from another machine (`om serve --host 0.0.0.0`): the same event the server builds for it
    event = api_gateway_event('GET', DESCRIBE_PATH, {'Host': ['x']}, b'', source_ip='192.0.2.7')
    result = stack.api_handler(event, None)
    assert result['statusCode'] == 403 and json.loads(result['body'])['error']['code'] == 'forbidden'
    assert 'emulator' not in result['body'] and (stack.endpoint or '') not in result['body']
    # Not without the API's own authentication when the stack has one
    settings_env(OM_AUTH_MODE='jwt')
    status, _, answer = send(stack, 'GET', DESCRIBE_PATH)
    refused(status, answer, 401, 'unauthenticated')
    assert (stack.endpoint or '') not in json.dumps(answer)
