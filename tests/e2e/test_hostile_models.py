"""Misbehaving models, a dead lease holder and a brown-out, on the local stack over HTTP (issue 16).

The real google-genai client talks to the loopback fake Gemini; each test scripts how the Observer and the Reflector
answer. Memory is never wiped or grown from an answer that is not an observation log, messages a bad answer did not
cover stay unobserved until a good one arrives, a dead holder's lease stops blocking within one lease period, and an
outage makes steps fast (the circuit breaker) instead of slow.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from functions import _wiring
from om_cli.local_stack import LocalStack
from om_lib.records import Lease
from tests.e2e.conftest import Api, running_stack
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 200, 'bufferTokens': False},
    'reflection': {'observationTokens': 300},
}
LEASE_TTL_S = 3.0
OBSERVER = 'You are the memory of an AI assistant'
REFLECTOR = 'observation reflector'
DAYS = ('Mar 3, 2025', 'Mar 4, 2025', 'Mar 5, 2025', 'Mar 6, 2025')


def observations(day: str, tag: str) -> str:
    lines = '\n'.join(
        f'* 🔴 (09:{i:02d}) User stated fact {tag}.{i} about the launch plan and its owners' for i in range(7)
    )
    return f'<observations>\nDate: {day}\n{lines}\n</observations>'


class Models:
    """The fake's role answers, switchable per test: `observer(request)` and `reflector(request)` give replies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, int] = {'observer': 0, 'reflector': 0, 'actor': 0}
        self.reset()

    def reset(self) -> None:
        self.observer: Callable[[FakeRequest, int], FakeReply] = lambda _r, n: FakeReply.text(
            observations(DAYS[n % len(DAYS)], f'o{n}')
        )
        self.reflector: Callable[[FakeRequest, int], FakeReply] = lambda _r, _n: FakeReply.text(
            '<observations>\n'
            + '\n'.join(f'Date: {day}\n* 🔴 (09:00) Condensed facts of {day}' for day in DAYS)
            + '\n</observations>'
        )

    def __call__(self, request: FakeRequest) -> FakeReply:
        system = request.system_text
        role = 'reflector' if REFLECTOR in system else 'observer' if OBSERVER in system else 'actor'
        with self.lock:
            self.calls[role] += 1
            n = self.calls[role]
        if role == 'observer':
            return self.observer(request, n)
        if role == 'reflector':
            return self.reflector(request, n)
        return FakeReply.text('ok')


@pytest.fixture(scope='module')
def models() -> Iterator[tuple[FakeGemini, Models]]:
    behaviour = Models()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture(scope='module')
def stack(models) -> Iterator[LocalStack]:
    env = {'POWERTOOLS_LOG_LEVEL': 'ERROR', 'OM_LEASE_TTL_S': str(LEASE_TTL_S)}
    with running_stack(models[0], CONFIG, env) as running:
        yield running


@pytest.fixture
def model(models) -> Iterator[Models]:
    _, behaviour = models
    behaviour.reset()
    yield behaviour
    behaviour.reset()


@pytest.fixture(scope='module')
def api(stack) -> Api:
    return Api(stack.url)


def fresh_thread() -> tuple[str, str]:
    return 'hostile', f't-{uuid.uuid4().hex[:8]}'


def step(api: Api, resource: str, thread: str, text: str) -> dict[str, Any]:
    status, body = api.post(
        f'/threads/{thread}/steps', {'resourceId': resource, 'messages': [{'role': 'user', 'content': text}]}
    )
    assert status == 200, body
    return body


def failures(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [p['data'] for p in body['parts'] if p['type'] == 'data-om-observation-failed']


def memory(api: Api, resource: str, thread: str) -> dict[str, Any]:
    status, view = api.get(f'/threads/{thread}/memory?resourceId={resource}')
    assert status == 200, view
    return view


def long_text(tag: str) -> str:
    return f'{tag}: ' + ' '.join(f'word{i}' for i in range(260))


def record(resource: str, thread: str):
    return _wiring.engine().store.get_record(f'thread:{resource}/{thread}')


def grow_past_reflection_threshold(api: Api, resource: str, thread: str) -> dict[str, Any]:
    """Steps until the observations pass observationTokens; returns the step that got there."""
    for n in range(6):
        body = step(api, resource, thread, long_text(f'step {n}'))
        if memory(api, resource, thread)['observationTokens'] > CONFIG['reflection']['observationTokens']:
            return body
    raise AssertionError('observations never passed the reflection threshold')


# -- the Reflector ----------------------------------------------------------------------------------------------------
REFUSAL = "I'm sorry, but I can't help with rewriting these notes."
PROSE = (
    '<observations>\nThe user has been talking about a launch for a few days. They seem organised and keen, and the '
    'assistant has been helping them think through owners and dates in some detail.\n</observations>'
)


@pytest.mark.parametrize(
    'answer',
    [
        pytest.param(lambda _r, _n: FakeReply.text(REFUSAL), id='refusal'),
        pytest.param(lambda _r, _n: FakeReply.text(PROSE), id='prose'),
    ],
)
def test_a_reflection_that_is_not_an_observation_log_never_replaces_memory(api, stack, model, answer) -> None:
    resource, thread = fresh_thread()
    model.reflector = answer
    before_calls = model.calls['reflector']
    body = grow_past_reflection_threshold(api, resource, thread)
    # The step tried to reflect (every compression level), refused each answer, and kept the log as it was
    assert model.calls['reflector'] > before_calls
    [failed] = [f for f in failures(body) if f['operationType'] == 'reflection' and not f['retrying']]
    assert failed['reason'] == 'invalid_reflection', failed
    view = memory(api, resource, thread)
    assert view['generationCount'] == 0
    assert 'fact o' in view['observations'] and "I'm sorry" not in view['observations']
    assert view['recentFailures'][0]['reason'] == 'invalid_reflection'
    assert view['recentFailures'][0]['operationType'] == 'reflection'
    # And once the Reflector behaves (after the backoff), the log is condensed for real
    model.reset()
    current = record(resource, thread)
    _wiring.engine().store.put_record(
        current.model_copy(update={'reflection_retry_at': None, 'reflection_failures': None}),
        expected_version=current.version,
    )
    body = step(api, resource, thread, 'and one more thing')
    assert memory(api, resource, thread)['generationCount'] == 1
    assert 'Condensed facts' in memory(api, resource, thread)['observations']


def test_a_reflection_without_date_headers_is_one_call_and_a_new_generation(api, stack, model) -> None:
    # Bold section titles, dates written inside the lines, no `Date:` header: an observation log all the same
    resource, thread = fresh_thread()
    model.reflector = lambda _r, _n: FakeReply.text(
        '<observations>\n- 🔴 **Launch plan** (Mar 3–6, 2025)\n  - facts o1-o4 about the plan and its owners\n'
        '- 🟡 **Open questions**\n  - who signs off the budget\n</observations>'
    )
    before_calls = model.calls['reflector']
    for n in range(6):  # until the log passes observationTokens: the step that gets there reflects
        body = step(api, resource, thread, long_text(f'step {n}'))
        if model.calls['reflector'] > before_calls:
            break
    assert model.calls['reflector'] - before_calls == 1
    assert not [f for f in failures(body) if f['operationType'] == 'reflection']
    view = memory(api, resource, thread)
    assert view['generationCount'] == 1 and '**Launch plan**' in view['observations']
    assert view['observationTokens'] < CONFIG['reflection']['observationTokens']


# -- the Observer -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'answer',
    [
        pytest.param(lambda _r, _n: FakeReply.text(''), id='empty'),
        pytest.param(lambda _r, _n: FakeReply.text(REFUSAL), id='refusal'),
        pytest.param(
            lambda _r, _n: FakeReply.text(
                '<observations>\nDate: Mar 3, 2025\n'
                + '* 🟡 (09:00) The agent called the same tool again with identical arguments and the same result\n'
                * 300
                + '</observations>'
            ),
            id='a-long-line-repeated-in-a-loop',
        ),
    ],
)
def test_an_observer_answer_that_is_not_an_observation_log_leaves_the_messages_unobserved(
    api, stack, model, answer
) -> None:
    resource, thread = fresh_thread()
    model.observer = answer
    # A step observes what came before its own input: the second step makes the first message due
    assert not failures(step(api, resource, thread, long_text('first')))
    body = step(api, resource, thread, 'second')
    # Observation was due and the answer was refused (after a second sample): nothing became memory
    [failed] = failures(body)
    assert failed['operationType'] == 'observation' and failed['reason'] == 'invalid_output', failed
    view = memory(api, resource, thread)
    assert view['observations'] == '' and view['pendingMessageTokens'] > 0
    assert record(resource, thread).cursor(thread) == 0
    # The failure is kept for every client (and the inspector), and the message is listed as unobserved
    assert view['recentFailures'][0]['reason'] == 'invalid_output'
    assert view['recentFailures'][0]['operationType'] == 'observation'
    status, page = api.get(f'/threads/{thread}/messages?resourceId={resource}')
    assert status == 200 and [m['omStatus'] for m in page['messages']] == ['unobserved', 'unobserved']
    # When the model recovers, the next step observes everything that was said before it
    model.reset()
    body = step(api, resource, thread, 'third')
    assert not failures(body)
    assert record(resource, thread).cursor(thread) == 2 and memory(api, resource, thread)['observations']
    status, page = api.get(f'/threads/{thread}/messages?resourceId={resource}')
    assert [m['omStatus'] for m in page['messages']] == ['observed', 'observed', 'unobserved']


# -- a dead lease holder ----------------------------------------------------------------------------------------------
def test_a_worker_that_died_holding_the_lease_blocks_the_next_step_for_at_most_one_lease_period(
    api, stack, model
) -> None:
    # Given a thread whose record a worker leased and then died with (its lease is never renewed)
    resource, thread = fresh_thread()
    step(api, resource, thread, long_text('said before'))
    store = _wiring.engine().store
    current = record(resource, thread)
    dead = Lease(owner='worker-that-died', expires_at=_wiring.engine().clock.now() + timedelta(seconds=LEASE_TTL_S))
    store.put_record(current.model_copy(update={'observing': dead}), expected_version=current.version)
    # When a step makes observation due
    started = time.monotonic()
    body = step(api, resource, thread, 'due now')
    took = time.monotonic() - started
    # Then it waited for the dead holder's lease to expire (one lease period), then observed: nothing was skipped
    assert any(p['type'] == 'data-om-observation-end' for p in body['parts']), body['parts']
    assert took < LEASE_TTL_S + 3.0, took
    assert record(resource, thread).cursor(thread) == 1


# -- a brown-out -----------------------------------------------------------------------------------------------------
def test_during_an_outage_steps_answer_fast_and_everything_is_observed_after_it(api, stack, model) -> None:
    # Given a Gemini outage of 30 s (every Observer call answers 503), with a step every 1.5 s in it
    resource, thread = fresh_thread()
    outage_ends = time.monotonic() + 30.0

    def observer(request: FakeRequest, n: int) -> FakeReply:
        if time.monotonic() < outage_ends:
            return FakeReply.error(503, 'backend overloaded')
        return FakeReply.text(observations(DAYS[0], f'after-{n}'))

    model.observer = observer
    durations: list[float] = []
    reasons: list[str] = []
    for n in range(20):
        started = time.monotonic()
        body = step(api, resource, thread, long_text(f'during {n}') if n % 4 == 0 else f'short message {n}')
        durations.append(time.monotonic() - started)
        reasons += [f['reason'] for f in failures(body)]
        time.sleep(max(0.0, 1.5 - durations[-1]))
    # Then only the steps before the breaker opened paid for the retries; once it was open, steps answered at once
    assert 'model_unavailable' in reasons
    slow = [d for d in durations if d > 2.0]
    assert len(slow) <= 2, durations
    assert all(d < 1.0 for d in durations[len(slow) + 1 :]), durations
    # And after the outage, once the breaker's trial call succeeds, the backlog is observed: nothing said is lost
    while time.monotonic() < outage_ends:
        time.sleep(0.5)
    for n in range(40):
        body = step(api, resource, thread, f'the model is back {n}')
        if any(p['type'] == 'data-om-observation-end' for p in body['parts']):
            break
        time.sleep(1.0)
    else:
        pytest.fail('nothing was observed within 40 s after the outage')
    # (everything before the last step's own input, which the turn answering it observes)
    last = _wiring.engine().store.list_messages(resource, thread, limit=1, newest_first=True).messages[0]
    assert record(resource, thread).cursor(thread) == last.seq - 1
