"""`GET /inspector` through `lambda_handler` under moto (events/api/inspector_get.json): off unless the deployment
turns it on, then the page and its files, behind the same authentication as every route, never in the OpenAPI
document."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from functions import _wiring
from tests.integration.test_api_handler import Api, assert_error
from tests.integration.test_api_handler import api as api  # noqa: F401 - the fixture, shared
from tests.integration.test_api_handler import aws as aws  # noqa: F401
from tests.integration.test_api_handler import aws_env as aws_env  # noqa: F401


@pytest.fixture
def inspector_on(api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:  # noqa: F811
    monkeypatch.setenv('OM_INSPECTOR', 'true')
    _wiring.reset()
    yield api
    _wiring.reset()


def test_the_page_is_off_unless_the_deployment_turns_it_on(api: Api) -> None:  # noqa: F811
    status, body, _ = api.call('inspector_get')
    error = assert_error(body, 'not_found')
    assert status == 404 and 'inspector=true' in error['message'] and 'om inspect' in error['message']
    status, body, _ = api.call('inspector_get', path='/inspector/inspector.js')
    assert status == 404


def test_the_page_and_its_files_are_served_with_a_strict_policy(inspector_on: Api) -> None:
    status, html, headers = call_raw(inspector_on, '/inspector')
    assert status == 200 and headers['Content-Type'] == 'text/html; charset=utf-8'
    # Assets are named relative to the page, so the stage prefix (/prod/inspector) needs no configuration
    assert 'src="inspector/inspector.js"' in html and 'href="inspector/inspector.css"' in html
    assert "script-src 'self'" in headers['Content-Security-Policy'] and headers['X-Frame-Options'] == 'DENY'
    status, html, _ = call_raw(inspector_on, '/inspector/')
    assert status == 200 and 'src="inspector.js"' in html
    for name, media_type in [
        ('inspector.js', 'text/javascript; charset=utf-8'),
        ('inspector.css', 'text/css; charset=utf-8'),
        ('failure-reasons.json', 'application/json'),
    ]:
        status, text, headers = call_raw(inspector_on, f'/inspector/{name}')
        assert status == 200 and headers['Content-Type'] == media_type and text
    status, body, _ = inspector_on.call('inspector_get', path='/inspector/secrets.py')
    assert status == 404 and assert_error(body, 'not_found')


def test_the_page_sits_behind_the_same_authentication(inspector_on: Api) -> None:
    # IAM mode: a request API Gateway did not sign through (no caller identity) is refused before any route runs
    anonymous = {'caller': None, 'user': None, 'userArn': None, 'accessKey': None, 'accountId': None}
    status, body, _ = inspector_on.call('inspector_get', identity=anonymous)
    assert status == 401 and assert_error(body, 'unauthenticated')


def test_the_page_is_not_part_of_the_api_document(inspector_on: Api) -> None:
    _, document, _ = inspector_on.call('openapi_get')
    assert not [path for path in document['paths'] if path.startswith('/inspector')]
    memory = document['components']['schemas']['MemoryOut']['properties']
    assert {'recentFailures', 'thresholds'} <= set(memory)
    listed = document['components']['schemas']['ListedMessageOut']['properties']
    assert listed['omStatus']['enum'] == ['observed', 'buffered', 'unobserved']


def call_raw(api: Api, path: str) -> tuple[int, str, dict[str, str]]:
    """The handler's answer without JSON decoding (the page is HTML)."""
    from tests.integration.test_api_handler import Context, load_event

    event = load_event('inspector_get')
    event['path'] = path
    event['pathParameters'] = {'proxy': path.lstrip('/')}
    event['requestContext']['path'] = '/prod' + path
    result = api.handler.lambda_handler(event, Context())
    headers = {k: ', '.join(v) for k, v in (result.get('multiValueHeaders') or {}).items()}
    headers.update(result.get('headers') or {})
    return result['statusCode'], result.get('body') or '', headers
