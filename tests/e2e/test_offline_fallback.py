"""`om serve` without a model key, over real HTTP: the offline model stands in for the configured provider
(`OM_OFFLINE_FALLBACK`), and what it did is reported as its own — the lifecycle events' usage names the model that
ran, not the one configured — with the buffered path's title change reported like the synchronous path's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from om_cli.local_stack import EVENTS_PATH, LocalStack
from tests.e2e.conftest import Api

pytestmark = pytest.mark.e2e

# The review's configuration: no `model`, so every role is on the default (google/gemini-2.5-flash), with no key.
CONFIG: dict[str, Any] = {'observation': {'messageTokens': 1000, 'bufferTokens': 100, 'threadTitle': True}}
KEYS = ('GEMINI_API_KEY', 'GOOGLE_API_KEY', 'AWS_ENDPOINT_URL')


@pytest.fixture(scope='module')
def api() -> Iterator[Api]:
    for name in KEYS:
        if os.environ.get(name):
            pytest.skip(f'{name} is set; this stack must run without a model key, on the embedded emulator')
    env = {'POWERTOOLS_LOG_LEVEL': 'ERROR', 'POWERTOOLS_METRICS_DISABLED': 'true'}
    with LocalStack(port=0, config=CONFIG, env=env, sweep_interval_s=None, visibility_timeout_s=2) as stack:
        yield Api(stack.url)


def post(api: Api, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = api.post(path, {'resourceId': 'r1', **body})
    assert status == 200, answer
    return answer


def events(api: Api, after: int = 0) -> list[dict[str, Any]]:
    status, body = api.get(f'{EVENTS_PATH}?after={after}')
    assert status == 200, body
    return list(body['events'])


def test_events_name_the_offline_model_that_ran_and_a_buffered_title_is_reported(api: Api) -> None:
    seen = len(events(api))
    messages = [
        {'role': 'user', 'content': 'Can you help me learn Spanish verbs? I always mix up ser and estar.'},
        {'role': 'assistant', 'content': 'Of course. Ser is for lasting traits, estar for states and places.'},
    ]
    post(api, '/threads/bt/turns', {'messages': messages})
    buffered = post(api, '/threads/bt/memory/buffer', {})
    assert [p['type'] for p in buffered['parts']] == ['data-om-buffering-start', 'data-om-buffering-end']
    observed = post(api, '/threads/bt/memory/observe', {})
    types = [p['type'] for p in observed['parts']]
    assert 'data-om-activation' in types and types.count('data-om-thread-update') == 1, types
    (update,) = [p['data'] for p in observed['parts'] if p['type'] == 'data-om-thread-update']
    title = api.get('/threads/bt?resourceId=r1')[1]['thread']['title']
    assert title and update['newTitle'] == title and update.get('oldTitle') is None
    published = [e for e in events(api, seen) if e['detail']['threadId'] == 'bt']
    assert [e['detailType'] for e in published].count('data-om-thread-update') == 1
    # The Observer call behind the buffered chunk ran on the offline model, and its usage says so
    (ended,) = [e['detail'] for e in published if e['detailType'] == 'data-om-buffering-end']
    assert ended['usage']['model'] == 'offline/gemini-2.5-flash', ended['usage']
    assert all(e['detail']['usage']['model'].startswith('offline') for e in published if 'usage' in e['detail'])
