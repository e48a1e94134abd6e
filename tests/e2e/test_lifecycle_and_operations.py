"""End to end over real HTTP on the local stack (one stack for the module): lifecycle events read back in order with
the model's usage, temporal gap markers, activation on idle and on a change of the Actor's model, pinned titles,
`observeAttachments`, and observe (with imported history) / reflect / buffer on demand. The real google-genai client
talks to the fake Gemini, which records every request.

Time is the messages' own (`createdAt`): the idle time runs from the last reply's time to the new input's, so the tests
set the clock through the times they send instead of sleeping.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from om_cli.local_stack import EVENTS_PATH, LocalStack
from tests.e2e.conftest import Api, running_stack
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

pytestmark = pytest.mark.e2e

CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {
        'messageTokens': 400,
        'bufferTokens': 100,
        'threadTitle': True,
        'observeAttachments': ['image/png'],
    },
    'reflection': {'observationTokens': 20_000},
    'temporalMarkers': {'minGap': '1h'},
    'activateAfterIdle': '10m',
    'activateOnProviderChange': True,
}
OBSERVER = 'You are the memory of an AI assistant'
REFLECTION = '<observations>\nDate: May 4, 2019\n* 🔴 (08:00) Trip talk\n</observations>'
PNG = base64.b64encode(b'\x89PNG\r\n\x1a\n' + b'p' * 64).decode()
JPEG = base64.b64encode(b'\xff\xd8\xff\xe0' + b'j' * 64).decode()
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)


class Gemini:
    """The Observer (observations and a thread title), the Reflector and the Actor; every request is kept."""

    def __init__(self) -> None:
        self.requests: list[FakeRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: FakeRequest) -> FakeReply:
        with self._lock:
            self.requests.append(request)
        if 'observation reflector' in request.system_text:
            return FakeReply.text(REFLECTION)
        if OBSERVER in request.system_text:
            return FakeReply.text(
                '<observations>\nDate: May 4, 2019\n* 🔴 (08:00) User talked about the trip\n</observations>\n'
                '<thread-title>Observer title</thread-title>'
            )
        return FakeReply.text('Noted.')

    def observer_requests(self, marker: str) -> list[FakeRequest]:
        """The Observer's requests whose transcript holds `marker`."""
        with self._lock:
            found = list(self.requests)
        return [r for r in found if OBSERVER in r.system_text and marker in ' '.join(r.user_texts)]


@pytest.fixture(scope='module')
def gemini() -> Iterator[tuple[FakeGemini, Gemini]]:
    behaviour = Gemini()
    with FakeGemini(behaviour) as server:
        yield server, behaviour


@pytest.fixture(scope='module')
def stack(gemini: tuple[FakeGemini, Gemini]) -> Iterator[LocalStack]:
    with running_stack(gemini[0], CONFIG) as running:
        yield running


@pytest.fixture(scope='module')
def api(stack: LocalStack) -> Api:
    return Api(stack.url)


@pytest.fixture
def observer(gemini: tuple[FakeGemini, Gemini]) -> Gemini:
    return gemini[1]


def message(role: str, text: str, at: datetime | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {'role': role, 'content': text, **extra}
    if at is not None:
        body['createdAt'] = at.isoformat().replace('+00:00', 'Z')
    return body


def step(api: Api, thread: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': 'r1', 'messages': list(messages), **extra})
    assert status == 200, body
    return body


def turn(api: Api, thread: str, *messages: dict[str, Any]) -> None:
    status, body = api.post(f'/threads/{thread}/turns', {'resourceId': 'r1', 'messages': list(messages)})
    assert status == 200, body


def operation(api: Api, thread: str, name: str, **body: Any) -> dict[str, Any]:
    status, answer = api.post(f'/threads/{thread}/memory/{name}', {'resourceId': 'r1', **body})
    assert status == 200, answer
    return answer


def events(api: Api, after: int = 0) -> list[dict[str, Any]]:
    status, body = api.get(f'{EVENTS_PATH}?after={after}')
    assert status == 200, body
    return body['events']


def kinds(parts: list[dict[str, Any]]) -> list[str]:
    return [p['type'] for p in parts]


def imported(start: datetime, tag: str) -> list[dict[str, Any]]:
    """History from another system: four dated messages, the last saying `tag` (to find the Observer's request)."""
    return [
        message(
            'user' if n % 2 == 0 else 'assistant',
            f'Imported fact {n}: my sister lives in Porto{f" ({tag})" if n == 3 else ""}.',
            start + timedelta(minutes=n),
        )
        for n in range(4)
    ]


# -- lifecycle events -------------------------------------------------------------------------------------------------
def test_events_are_read_back_in_order_with_the_models_usage(api: Api, stack: LocalStack) -> None:
    seen = len(events(api))
    thread = 'events'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread})[0] == 201
    done = operation(api, thread, 'observe', messages=imported(T0, 'events test'))
    assert done['status'] == 'done'
    mine = [e for e in events(api, seen) if e['detail']['threadId'] == thread]
    assert [e['detailType'] for e in mine] == ['data-om-observation-start', 'data-om-observation-end']
    start, end = (e['detail'] for e in mine)
    assert all(e['source'] == 'observational-memory' and e['time'] for e in mine)
    assert end['cycleId'] == start['cycleId'] and end['resourceId'] == 'r1'
    assert end['observations'].endswith('* 🔴 (08:00) User talked about the trip')
    # The usage the fake Gemini reported for the call (11 tokens in, 7 out), as the provider said it.
    assert end['usage'] == {
        'model': 'google/gemini-2.5-flash',
        'calls': 1,
        'inputTokens': 11,
        'outputTokens': 7,
        'totalTokens': 18,
    }
    # A turn queues buffering (the API publishes its start) and the worker buffers (publishing the end), in order.
    seen = len(events(api))
    step(api, thread, message('user', 'Tell me about Porto. ' * 30))
    turn(api, thread, message('assistant', 'Porto is a city in the north of Portugal. ' * 20))
    stack.drain(60)
    buffered = [e for e in events(api, seen) if e['detail']['threadId'] == thread]
    assert [e['detailType'] for e in buffered] == ['data-om-buffering-start', 'data-om-buffering-end']
    assert buffered[1]['detail']['usage']['outputTokens'] == 7
    assert buffered[0]['detail']['cycleId'] == buffered[1]['detail']['cycleId']


def test_only_loopback_callers_read_the_events(stack: LocalStack) -> None:
    from om_cli.local_stack import api_gateway_event

    event = api_gateway_event('GET', EVENTS_PATH, {'Host': ['x']}, b'', source_ip='192.0.2.7')
    assert stack.api_handler(event, None)['statusCode'] == 403


# -- imported history and the other operations ------------------------------------------------------------------------
def test_imported_messages_are_observed_with_their_dates_and_absent_from_the_thread(api: Api, observer: Gemini) -> None:
    thread = 'import'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread})[0] == 201
    step(api, thread, message('user', 'Hello again.'))
    dated = datetime(2019, 5, 4, 8, 0, tzinfo=UTC)
    done = operation(api, thread, 'observe', messages=imported(dated, 'import test'))
    assert done['status'] == 'done' and done['observationTokens'] > 0
    assert kinds(done['parts']) == ['data-om-observation-start', 'data-om-observation-end']
    (call,) = observer.observer_requests('(import test)')
    transcript = ' '.join(call.user_texts)
    assert 'May 4 2019:' in transcript and '(08:03)' in transcript and 'Hello again' not in transcript
    status, listed = api.get(f'/threads/{thread}/messages?resourceId=r1')
    assert status == 200 and [m['parts'][0]['text'] for m in listed['messages']] == ['Hello again.']
    assert listed['messages'][0]['omStatus'] == 'unobserved'
    status, memory = api.get(f'/threads/{thread}/memory?resourceId=r1')
    assert 'User talked about the trip' in memory['observations']
    # Sent again (a retry, other ids): observed once.
    again = [{**m, 'id': f'retry-{n}'} for n, m in enumerate(imported(dated, 'import test'))]
    assert operation(api, thread, 'observe', messages=again)['status'] == 'nothing_to_do'
    assert len(observer.observer_requests('(import test)')) == 1


def test_reflect_and_buffer_run_now_once(api: Api, stack: LocalStack, observer: Gemini) -> None:
    thread = 'ops'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread})[0] == 201
    operation(api, thread, 'observe', messages=imported(T0 - timedelta(days=30), 'ops test'))
    reflected = operation(api, thread, 'reflect')
    assert reflected['status'] == 'done' and reflected['generationCount'] == 1, reflected
    assert 'data-om-observation-end' in kinds(reflected['parts'])
    assert operation(api, thread, 'reflect')['status'] == 'nothing_to_do'
    step(api, thread, message('user', 'Something new to buffer.'))
    buffered = operation(api, thread, 'buffer')
    assert buffered['status'] == 'done'
    assert kinds(buffered['parts']) == ['data-om-buffering-start', 'data-om-buffering-end']
    assert operation(api, thread, 'buffer')['status'] == 'nothing_to_do'
    status, messages = api.get(f'/threads/{thread}/messages?resourceId=r1')
    assert [m['omStatus'] for m in messages['messages']] == ['buffered']


def test_bad_operations_are_refused_and_write_nothing(api: Api) -> None:
    assert api.post('/threads/nope/memory/reflect', {'resourceId': 'r1'})[0] == 404
    no_date = {'resourceId': 'r1', 'messages': [{'role': 'user', 'content': 'when?'}]}
    status, body = api.post('/threads/import/memory/observe', no_date)
    assert status == 422 and 'createdAt' in str(body)
    huge = {'resourceId': 'r1', 'messages': [message('user', 'word ' * 2000, T0)]}
    status, body = api.post('/threads/import/memory/observe', huge)
    assert status == 413 and body['error']['code'] == 'too_large' and 'smaller parts' in body['error']['message']


# -- temporal gap markers ---------------------------------------------------------------------------------------------
def test_gap_markers_are_shown_past_the_configured_gap_and_absent_below_it(api: Api, observer: Gemini) -> None:
    thread = 'gap'
    step(api, thread, message('user', 'Planning the Lisbon trip (gap test).', T0))
    turn(api, thread, message('assistant', 'When do you leave?', T0 + timedelta(minutes=1)))
    later = step(api, thread, message('user', 'We leave in May.', T0 + timedelta(hours=3, minutes=1)))
    texts = [m['parts'][0]['text'] for m in later['messages']]
    at = T0 + timedelta(hours=3, minutes=1)
    clock = f'{at.hour % 12 or 12}:{at:%M} {"AM" if at.hour < 12 else "PM"}'
    assert texts[-2] == (
        f'<system-reminder type="temporal-gap">3 hours later — {at:%m/%d/%Y}, {clock} UTC</system-reminder>'
    )
    assert texts[-1] == 'We leave in May.'
    soon = step(api, thread, message('user', 'And back in June.', T0 + timedelta(hours=3, minutes=40)))
    assert sum('temporal-gap' in m['parts'][0]['text'] for m in soon['messages']) == 1  # 39 minutes: no marker
    # The Observer reads the same gap in its transcript.
    assert operation(api, thread, 'buffer')['status'] == 'done'
    (call,) = observer.observer_requests('(gap test)')
    transcript = ' '.join(call.user_texts)
    assert 'system-reminder' in transcript and '3 hours later —' in transcript
    assert transcript.count('later —') == 1


# -- activation on idle and on a model change -------------------------------------------------------------------------
def activations(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [p['data'] for p in answer['parts'] if p['type'] == 'data-om-activation']


def test_buffered_chunks_activate_after_the_thread_was_idle(api: Api) -> None:
    thread = 'idle'
    step(api, thread, message('user', 'The garden needs new fences.', T0))
    turn(api, thread, message('assistant', 'Which wood do you prefer?', T0 + timedelta(minutes=1)))
    assert operation(api, thread, 'buffer')['status'] == 'done'
    quick = step(api, thread, message('user', 'Oak.', T0 + timedelta(minutes=6)))
    assert activations(quick) == []  # 5 minutes idle: the chunk waits for the threshold
    idle = step(api, thread, message('user', 'Or maybe pine.', T0 + timedelta(minutes=31)))
    (activation,) = activations(idle)
    assert activation['triggeredBy'] == 'ttl' and activation['activateAfterIdle'] == 600_000
    assert activation['ttlExpiredMs'] == 30 * 60 * 1000
    assert activation['lastActivityAt'] == int((T0 + timedelta(minutes=1)).timestamp() * 1000)
    assert 'User talked about the trip' in idle['system']


def test_a_change_of_the_actors_model_activates_what_is_buffered(api: Api) -> None:
    thread = 'model'
    step(api, thread, message('user', 'Book the train to Porto.'), actorModel='openai/gpt-5.5')
    turn(api, thread, message('assistant', 'Which day?'))
    assert operation(api, thread, 'buffer')['status'] == 'done'
    same = step(api, thread, message('user', 'Friday.'), actorModel='openai/gpt-5.5')
    assert activations(same) == []
    changed = step(api, thread, message('user', 'Morning.'), actorModel='anthropic/claude-sonnet-4-5')
    (activation,) = activations(changed)
    assert activation['triggeredBy'] == 'provider_change'
    assert (activation['previousModel'], activation['currentModel']) == (
        'openai/gpt-5.5',
        'anthropic/claude-sonnet-4-5',
    )
    status, body = api.post(f'/threads/{thread}/steps', {'resourceId': 'r1', 'messages': [], 'actorModel': 'gpt'})
    assert status == 422  # `provider/model`


# -- pinned titles ----------------------------------------------------------------------------------------------------
def test_a_pinned_title_survives_observations_and_clearing_it_unpins(api: Api) -> None:
    thread = 'title'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread})[0] == 201
    status, body = api.request('PATCH', f'/threads/{thread}', {'resourceId': 'r1', 'title': 'My trip'})
    assert status == 200 and body['thread']['titlePinned'] is True
    step(api, thread, message('user', 'Let us plan the trip.'))
    observed = operation(api, thread, 'observe')
    assert observed['status'] == 'done' and 'data-om-thread-update' not in kinds(observed['parts'])
    assert api.get(f'/threads/{thread}?resourceId=r1')[1]['thread']['title'] == 'My trip'
    status, body = api.request('PATCH', f'/threads/{thread}', {'resourceId': 'r1', 'title': None})
    assert status == 200 and body['thread']['title'] is None and body['thread']['titlePinned'] is False
    step(api, thread, message('user', 'More about the trip.'))
    observed = operation(api, thread, 'observe')
    assert 'data-om-thread-update' in kinds(observed['parts'])
    assert api.get(f'/threads/{thread}?resourceId=r1')[1]['thread']['title'] == 'Observer title'


# -- observeAttachments -----------------------------------------------------------------------------------------------
def test_an_attachment_outside_the_allow_list_is_not_sent_to_the_observer(api: Api, observer: Gemini) -> None:
    thread = 'pics'
    parts = [
        {'type': 'text', 'text': 'Two photos of the kitchen (attachment test).'},
        {'type': 'image', 'mediaType': 'image/png', 'data': PNG, 'filename': 'plan.png'},
        {'type': 'image', 'mediaType': 'image/jpeg', 'data': JPEG, 'filename': 'photo.jpg'},
    ]
    step(api, thread, {'role': 'user', 'parts': parts})
    assert operation(api, thread, 'observe')['status'] == 'done'
    (call,) = observer.observer_requests('(attachment test)')
    assert [d.get('mimeType', d.get('mime_type')) for d in call.inline_data] == ['image/png']
    transcript = ' '.join(call.user_texts)
    assert '[Image #1: plan.png]' in transcript and '[Image #2: photo.jpg]' in transcript
    # Kept, and shown to the Actor: both images are still the message's.
    status, listed = api.get(f'/threads/{thread}/messages?resourceId=r1')
    assert [p['type'] for p in listed['messages'][0]['parts']] == ['text', 'image', 'image']


# -- a title the Observer proposed in the background ------------------------------------------------------------------
def thread_updates(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p['data'] for p in parts if p['type'] == 'data-om-thread-update']


def test_a_title_from_a_buffered_chunk_is_reported_once_where_it_is_applied(api: Api) -> None:
    thread = 'bt'
    seen = len(events(api))
    turn(
        api,
        thread,
        message('user', 'Can you help me learn Spanish verbs?'),
        message('assistant', 'Of course: start with the regular -ar verbs like hablar.'),
    )
    buffered = operation(api, thread, 'buffer')
    assert kinds(buffered['parts']) == ['data-om-buffering-start', 'data-om-buffering-end']
    assert api.get(f'/threads/{thread}?resourceId=r1')[1]['thread']['title'] is None  # a chunk's title waits
    observed = operation(api, thread, 'observe')
    assert 'data-om-activation' in kinds(observed['parts'])
    # Activation applied the chunk's title: its answer says so, once, like a synchronous observation's
    (update,) = thread_updates(observed['parts'])
    assert (update.get('oldTitle'), update['newTitle'], update['threadId']) == (None, 'Observer title', thread)
    assert api.get(f'/threads/{thread}?resourceId=r1')[1]['thread']['title'] == 'Observer title'
    published = [e for e in events(api, seen) if e['detail']['threadId'] == thread]
    renames = [e['detail'] for e in published if e['detailType'] == 'data-om-thread-update']
    assert [(r.get('oldTitle'), r['newTitle']) for r in renames] == [(None, 'Observer title')]
    # Told once: the next step does not repeat it
    assert thread_updates(step(api, thread, message('user', 'What about -er verbs?'))['parts']) == []


def test_a_pinned_title_survives_a_buffered_chunks_title(api: Api) -> None:
    thread = 'bt-pinned'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread, 'title': 'Verbs'})[0] == 201
    status, body = api.request('PATCH', f'/threads/{thread}', {'resourceId': 'r1', 'title': 'Verbs'})
    assert status == 200 and body['thread']['titlePinned'] is True
    turn(api, thread, message('user', 'Help me with French verbs.'), message('assistant', 'Sure: être and avoir.'))
    assert operation(api, thread, 'buffer')['status'] == 'done'
    observed = operation(api, thread, 'observe')
    assert 'data-om-activation' in kinds(observed['parts']) and thread_updates(observed['parts']) == []
    assert api.get(f'/threads/{thread}?resourceId=r1')[1]['thread']['title'] == 'Verbs'


# -- imported history goes with a clone -------------------------------------------------------------------------------
def test_imported_history_goes_with_a_clone_of_a_thread_without_observed_messages(api: Api) -> None:
    thread = 'imp3'
    assert api.post('/threads', {'resourceId': 'r1', 'id': thread})[0] == 201
    history = imported(T0 - timedelta(days=3), 'clone test')
    assert operation(api, thread, 'observe', messages=history)['status'] == 'done'
    status, source = api.get(f'/threads/{thread}/memory?resourceId=r1')
    assert status == 200 and 'User talked about the trip' in source['observations']
    # A thread with no messages at all
    status, _ = api.post(f'/threads/{thread}/clone', {'resourceId': 'r1', 'newThreadId': 'imp3c'})
    assert status == 201
    status, clone = api.get('/threads/imp3c/memory?resourceId=r1')
    assert status == 200 and clone['observations'] == source['observations']
    # A thread whose messages are not observed yet: they are copied unobserved, the import goes with them
    step(api, thread, message('user', 'Not observed yet.'))
    status, _ = api.post(f'/threads/{thread}/clone', {'resourceId': 'r1', 'newThreadId': 'imp3d'})
    assert status == 201
    status, clone = api.get('/threads/imp3d/memory?resourceId=r1')
    assert status == 200 and clone['observations'] == source['observations']
    status, listed = api.get('/threads/imp3d/messages?resourceId=r1')
    assert [m['omStatus'] for m in listed['messages']] == ['unobserved']
    # The clone knows the import: the same history sent to it again is observed once
    assert operation(api, 'imp3d', 'observe', messages=history)['status'] == 'nothing_to_do'
