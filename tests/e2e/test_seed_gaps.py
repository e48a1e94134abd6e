"""Seed behaviour that was missing (seed 000 / 003 names), over real HTTP on the local stack (issue 21, items 7-14).

The fake Gemini answers as an Observer that writes down what the user said (so a test can see where a message
went), a Reflector that echoes the reference's anchor ids, and an Actor.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from om_cli.local_stack import LocalStack
from tests.e2e.conftest import Api, running_stack, wait_for
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

pytestmark = pytest.mark.e2e

ANCHORED_REFLECTION = (
    '<observations>\nDate: Mar 3, 2025\n[O1] * 🔴 (09:00) User said several things (condensed)\n'
    '* [O2-N1] 🟡 (09:05) User asked about trains\n</observations>'
)


class SeedGemini:
    """Observer: one line per user message it was shown (its first words); Reflector: anchored lines; Actor: 'ok'."""

    def __init__(self) -> None:
        self.fail_observer = False
        self.lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        system = request.system_text
        if 'observation reflector' in system:
            return FakeReply.text(ANCHORED_REFLECTION)
        if 'You are the memory of an AI assistant' in system:
            if self.fail_observer:
                return FakeReply.error(503, 'scripted outage')
            prompt = ''.join(request.user_texts)
            history = prompt.split('## New Message History to Observe', 1)[-1]
            said = re.findall(r'^User \([\d:]+\): (.+)$', history, re.MULTILINE)
            lines = [f'* 🔴 (09:{i % 60:02d}) User said: {text[:60]}' for i, text in enumerate(said)]
            body = '\n'.join(lines) or '* 🟢 (09:00) Nothing said'
            return FakeReply.text(f'<observations>\nDate: Mar 3, 2025\n{body}\n</observations>')
        return FakeReply.text('ok')


@pytest.fixture(scope='module')
def seed_gemini() -> Iterator[tuple[FakeGemini, SeedGemini]]:
    behaviour = SeedGemini()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture
def fake(seed_gemini) -> Iterator[SeedGemini]:
    _, behaviour = seed_gemini
    behaviour.fail_observer = False
    yield behaviour
    behaviour.fail_observer = False


def stack_with(seed_gemini, config: dict[str, Any]) -> Iterator[LocalStack]:
    # Class-scoped: one stack at a time (a local stack configures this process's environment).
    with running_stack(seed_gemini[0], config) as running:
        yield running


SYNC = {
    'model': 'default',
    'retrieval': True,
    'observation': {'messageTokens': 200, 'bufferTokens': False},
    'reflection': {'observationTokens': 120},
}


@pytest.fixture(scope='class')
def sync(seed_gemini) -> Iterator[LocalStack]:
    yield from stack_with(seed_gemini, SYNC)


def words(topic: str, n: int = 120) -> str:
    return ' '.join(f'{topic}{i}' for i in range(n))


def step(api: Api, resource: str, thread: str, text: str | None = None, mid: str | None = None) -> dict:
    messages = [{'role': 'user', 'content': text, **({'id': mid} if mid else {})}] if text else []
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': resource, 'messages': messages})
    assert status == 200, body
    return body


def turn(api: Api, resource: str, thread: str, text: str) -> dict:
    status, body = api.post(
        f'/threads/{thread}/turns', {'resourceId': resource, 'messages': [{'role': 'assistant', 'content': text}]}
    )
    assert status == 200, body
    return body


def memory(api: Api, resource: str, thread: str) -> dict:
    status, body = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, body
    return body


def texts(body: dict) -> list[str]:
    return [p.get('text', '') for m in body['messages'] for p in m.get('parts') or []] + [
        m.get('content') or '' for m in body['messages']
    ]


def background_cycles(body: dict) -> list[str]:
    """The cycle ids of the observation start/end parts of an answer."""
    return [
        p['data']['cycleId']
        for p in body['parts']
        if p['type'] in ('data-om-observation-start', 'data-om-observation-end')
    ]


class TestSynchronousThreadScope:
    """Thread scope, buffering off, retrieval on: one stack for items 7, 11, 12, 13 and 14."""

    # -- item 7
    def test_seed000_recall_messages_with_a_thread_and_no_cursor_browses_that_thread(self, sync):
        api = Api(sync.url)
        step(api, 'r7', 'other', 'The spare key is under the blue flowerpot', mid='o1')
        step(api, 'r7', 'here', 'Where did I leave the key?', mid='h1')
        # threadId without a cursor reads that thread from its start: any thread of the caller's resource
        for thread in ('other', 'here'):
            status, body = api.post('/recall', {'resourceId': 'r7', 'threadId': thread, 'mode': 'messages'})
            assert status == 200, body
            assert body['count'] >= 1 and body['hasPrevPage'] is False
        status, body = api.post('/recall', {'resourceId': 'r7', 'threadId': 'other', 'mode': 'messages'})
        assert 'blue flowerpot' in body['messages']
        # another resource's thread does not exist for this caller
        assert api.post('/recall', {'resourceId': 'r7-b', 'threadId': 'other', 'mode': 'messages'})[0] == 404

    # -- item 12
    def test_seed000_a_step_never_shows_the_new_user_message_twice(self, sync):
        api = Api(sync.url)
        step(api, 'r12', 'twice', 'first-said ' + words('alpha'))
        body = step(api, 'r12', 'twice', 'second-said ' + words('beta'))  # past messageTokens: due
        assert any(p['type'] == 'data-om-observation-end' for p in body['parts']), body['parts']
        # The earlier message is observed (in `system`, gone from `messages`); the new one is a message, once, and only
        assert 'first-said' in body['system'] and not any('first-said' in t for t in texts(body))
        assert 'second-said' not in body['system']
        assert sum('second-said' in m.get('content', '') + str(m.get('parts')) for m in body['messages']) == 1

    # -- item 13 (thread scope, buffering off)
    def test_seed000_background_observation_parts_reach_the_next_step_exactly_once(self, sync):
        api = Api(sync.url)
        step(api, 'r13', 'bg', 'said-before ' + words('gamma', 150))
        scheduled = turn(api, 'r13', 'bg', 'noted')['parts']
        assert {'type': 'data-om-scheduled', 'data': {'operations': ['observe']}} in scheduled
        sync.drain(timeout=30)
        assert memory(api, 'r13', 'bg')['observationTokens'] > 0  # the worker observed it
        # When two steps arrive at once, the worker's parts are answered by exactly one of them
        with ThreadPoolExecutor(max_workers=2) as pool:
            first, second = pool.map(lambda n: step(api, 'r13', 'bg', f'next {n}'), range(2))
        delivered = background_cycles(first) + background_cycles(second)
        ends = [
            p
            for body in (first, second)
            for p in body['parts']
            if p['type'] == 'data-om-observation-end' and p['data']['operationType'] == 'observation'
        ]
        assert len(ends) == 1 and ends[0]['data']['observations'], (first['parts'], second['parts'])
        assert len(delivered) == 2 and len(set(delivered)) == 1  # its start and its end, once
        # and never again
        assert background_cycles(step(api, 'r13', 'bg', 'and later')) == []

    # -- items 11 and 14
    def test_seed002_earlier_generations_are_readable_and_anchor_ids_are_not_stored(self, sync):
        api = Api(sync.url)
        for n in range(6):
            step(api, 'r11', 'gens', f'topic-{n} ' + words(f't{n}', 80))
            turn(api, 'r11', 'gens', 'noted')
            sync.drain(timeout=30)
            if memory(api, 'r11', 'gens')['generationCount'] >= 1:
                break
        view = memory(api, 'r11', 'gens')
        assert view['generationCount'] >= 1
        # item 14: the Reflector's ephemeral anchors never reach the stored memory
        assert '[O1]' not in view['observations'] and '[O2-N1]' not in view['observations']
        assert 'User said several things (condensed)' in view['observations']
        # item 11: newest first, the current one first, what triggered each, its observations and tokens
        status, body = api.get('/threads/gens/memory/generations?resourceId=r11&limit=10')
        assert status == 200, body
        generations = body['generations']
        assert [g['generation'] for g in generations] == list(range(view['generationCount'], -1, -1))
        assert generations[0]['current'] and generations[0]['recordId'] == view['recordId'] == body['recordId']
        assert generations[0]['trigger'] == 'reflection' and generations[-1]['trigger'] == 'initial'
        assert 'topic-0' in generations[-1]['observations'] and generations[-1]['observationTokens'] > 0
        assert all(g['createdAt'].endswith('Z') for g in generations) and not body['hasMore']
        status, page = api.get('/threads/gens/memory/generations?resourceId=r11&limit=1')
        assert status == 200 and len(page['generations']) == 1 and page['hasMore'] is True
        assert api.get('/threads/gens/memory/generations?resourceId=someone-else')[0] == 404
        assert api.get('/threads/gens/memory/generations?resourceId=r11&limit=0')[0] == 422


# -- item 10: shareTokenBudget thresholds ------------------------------------------------------------------------------
@pytest.fixture(scope='class')
def shared_budget(seed_gemini) -> Iterator[LocalStack]:
    config = {
        'model': 'default',
        'shareTokenBudget': True,
        'observation': {'messageTokens': 300, 'bufferTokens': False},
        'reflection': {'observationTokens': 500},
    }
    yield from stack_with(seed_gemini, config)


class TestSharedTokenBudget:
    """shareTokenBudget on (item 10)."""

    def test_seed000_memory_shows_the_thresholds_in_force_under_share_token_budget(self, shared_budget):
        api = Api(shared_budget.url)
        step(api, 'r10', 'budget', 'first ' + words('delta', 400))
        body = step(api, 'r10', 'budget', 'second ' + words('eps', 10))  # observes the first message
        status = next(p['data'] for p in body['parts'] if p['type'] == 'data-om-status')['windows']['active']
        view = memory(api, 'r10', 'budget')
        assert view['observationTokens'] > 0
        # The message budget grew by what the observations leave unused; the memory view shows the same figures
        thresholds = view['thresholds']
        assert {k: thresholds[k] for k in ('messageTokens', 'observationTokens')} == {
            'messageTokens': status['messages']['threshold'],
            'observationTokens': status['observations']['threshold'],
        }
        # (messages may use what observations leave of the 800-token budget: more than their own 300)
        assert 300 < view['thresholds']['messageTokens'] < 800


# -- items 10 and 13 in resource scope ---------------------------------------------------------------------------------
@pytest.fixture(scope='class')
def resource(seed_gemini) -> Iterator[LocalStack]:
    config = {'model': 'default', 'scope': 'resource', 'observation': {'messageTokens': 400}}
    yield from stack_with(seed_gemini, config)


class TestResourceScope:
    """Resource scope (items 10 and 13)."""

    def test_seed004_status_counts_every_threads_unobserved_tokens_in_resource_scope(self, resource):
        api = Api(resource.url)
        step(api, 'r10b', 'x', 'other-thread ' + words('zeta', 60))
        pending_x = memory(api, 'r10b', 'x')['pendingMessageTokens']
        body = step(api, 'r10b', 'y', 'hello')
        tokens = next(p['data'] for p in body['parts'] if p['type'] == 'data-om-status')['windows']['active']
        assert tokens['messages']['tokens'] >= pending_x + 1, (tokens, pending_x)

    def test_seed000_background_parts_reach_the_next_step_in_resource_scope(self, resource):
        api = Api(resource.url)
        step(api, 'r13b', 'a', 'resource-said ' + words('eta', 200))
        scheduled = turn(api, 'r13b', 'a', 'ok')['parts']
        assert {'type': 'data-om-scheduled', 'data': {'operations': ['observe']}} in scheduled
        resource.drain(timeout=30)
        assert memory(api, 'r13b', 'a')['observationTokens'] > 0
        body = step(api, 'r13b', 'b', 'hi')  # any thread of the resource: its memory is shared
        ends = [p for p in body['parts'] if p['type'] == 'data-om-observation-end']
        assert len(ends) == 1 and 'resource-said' in ends[0]['data']['observations']
        assert not [p for p in step(api, 'r13b', 'a', 'again')['parts'] if p['type'] == 'data-om-observation-end']


# -- item 10: buffering-failed carries `observations` and says why -----------------------------------------------------
@pytest.fixture(scope='class')
def buffered(seed_gemini) -> Iterator[LocalStack]:
    config = {'model': 'default', 'observation': {'messageTokens': 600, 'bufferTokens': 100}}
    yield from stack_with(seed_gemini, config)


class TestAsyncBuffering:
    """Async buffering with an Observer that fails (item 10)."""

    def test_seed000_buffering_failed_carries_observations_and_says_why(self, buffered, fake):
        api = Api(buffered.url)
        fake.fail_observer = True
        step(api, 'r10a', 'buf', 'buffer-me ' + words('theta', 80))
        assert 'buffer' in turn(api, 'r10a', 'buf', 'ok')['parts'][-1]['data']['operations']

        def failed() -> list[dict]:
            body = step(api, 'r10a', 'buf')
            return [p['data'] for p in body['parts'] if p['type'] == 'data-om-buffering-failed']

        [part] = wait_for(failed, timeout=30, interval=0.5)
        assert part['observations'] == '' and part['operationType'] == 'observation'
        assert part['reason'] == 'model_unavailable' and '503' in part['error'], part


# -- item 9: lastMessages ----------------------------------------------------------------------------------------------
@pytest.fixture(scope='class')
def history_only(seed_gemini) -> Iterator[LocalStack]:
    yield from stack_with(seed_gemini, {'enabled': False, 'lastMessages': 3})


class TestMessageHistoryOnly:
    """Observational memory off: message history (item 9)."""

    def test_seed003_last_messages_is_the_history_a_step_includes(self, history_only):
        api = Api(history_only.url)
        for n in range(5):
            body = step(api, 'r9', 'h', f'message {n}', mid=f'm{n}')
        assert [m['id'] for m in body['messages']] == ['m2', 'm3', 'm4']
