"""Back-dated messages: a message's own `createdAt` dates it for the Observer, the context builder, buffering,
resource scope and the recall tool, while arrival order still orders the thread (replayed history, LongMemEval).

The service's clock stands at 2026-11-28; the conversation happened in May 2023.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.history.recall import RecallRequest, recall
from om_lib.llm import ModelRequest
from om_lib.messages import Message, now_of, time_of
from om_lib.models.model_router import ModelRouter
from om_lib.service import MemoryService
from om_lib.work import CollectingWork
from tests.fakes.scripted_model import ScriptedModel

SERVER_NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
MAY_20 = datetime(2023, 5, 20, 9, 15, tzinfo=UTC)


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def words(n: int, tag: str = 'w') -> str:
    return ' '.join(f'{tag}{i}' for i in range(n))


def said(mid: str, role: str, text: str, at: datetime) -> Message:
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': at.isoformat(), 'content': text})


def dated_observer(request: ModelRequest) -> str:
    """An Observer that dates what it writes by the transcript's own `Mon D YYYY:` headers (as a real one does); as
    the Reflector, it keeps one line per date."""
    prompt = request.contents[0].parts[0]
    if request.purpose == 'reflector':
        return '<observations>\nDate: May 19, 2023\n* 🔴 B talk\nDate: May 20, 2023\n* 🔴 A talk\n</observations>'
    assert isinstance(prompt, str)
    new = prompt.split('## New Message History to Observe', 1)[-1]
    sections = []
    for shown, transcript in re.findall(r'<thread id="([^"]+)">\n(.*?)\n</thread>', new, re.DOTALL) or [('', new)]:
        header = re.search(r'^(\w{3}) (\d{1,2}) (\d{4}):$', transcript, re.M)
        assert header is not None, transcript
        time = re.search(r'\((\d\d:\d\d)\)', transcript)
        line = f'Date: {header[1]} {header[2]}, {header[3]}\n* 🔴 ({time[1] if time else "00:00"}) User talked'
        sections.append(f'<thread id="{shown}">\n{line}\n</thread>' if shown else line)
    return '<observations>\n' + '\n'.join(sections) + '\n</observations>'


class Service:
    def __init__(self, config: dict, *, work: bool = False) -> None:
        self.clock = ManualClock(SERVER_NOW, tick=timedelta(seconds=1))
        self.store = InMemoryStore()
        self.model = ScriptedModel(fallback=dated_observer)
        self.work = CollectingWork() if work else None
        self.engine = MemoryEngine(
            OMConfig.model_validate({'model': 'default', **config}),
            store=self.store,
            router=ModelRouter({'google': self.model}, clock=self.clock, sleep=self.clock.advance),
            counter=TokenCounter(WordTokenizer()),
            clock=self.clock,
            work=self.work,
        )
        self.service = MemoryService(self.engine)

    def observer_prompts(self) -> list[str]:
        return [str(call.request.contents[0].parts[0]) for call in self.model.calls_for('observer')]

    def run_jobs(self) -> None:
        assert self.work is not None
        while self.work.jobs:
            self.engine.run_job(self.work.jobs.pop(0))


def sync_config(**observation: object) -> dict:
    return {'observation': {'messageTokens': 30, 'bufferTokens': False, **observation}}


def test_time_of_is_the_messages_own_time_and_now_of_the_newest_of_a_steps_input() -> None:
    message = said('u1', 'user', 'hi', MAY_20)
    naive = Message(id='u2', role='user', created_at=MAY_20.replace(tzinfo=None), parts=message.parts)
    assert time_of(message) == MAY_20 and time_of(naive) == MAY_20
    later = said('u3', 'user', 'later', MAY_20 + timedelta(days=2))
    assert now_of([later, message], SERVER_NOW) == MAY_20 + timedelta(days=2)
    assert now_of([], SERVER_NOW) == SERVER_NOW


def test_the_observer_dates_back_dated_messages_by_their_own_time() -> None:
    s = Service(sync_config())
    # Given a conversation of May 20, 2023, replayed today
    s.service.step('r1', 't1', [said('u1', 'user', 'I adopted a beagle named Rex ' + words(20), MAY_20)])
    s.service.turn(
        'r1', 't1', [said('a1', 'assistant', 'Congratulations on Rex! ' + words(10), MAY_20 + timedelta(minutes=1))]
    )
    # When the next step makes observation due
    s.service.step('r1', 't1', [said('u2', 'user', 'What should he eat?', MAY_20 + timedelta(minutes=5))])
    # Then the Observer read May 20, 2023 with the messages' times, not today's date
    [prompt] = s.observer_prompts()
    assert 'May 20 2023:' in prompt and 'User (09:15): I adopted a beagle' in prompt
    assert 'Assistant (09:16): Congratulations' in prompt
    assert 'Nov 28 2026' not in prompt
    record = s.store.get_record('thread:r1/t1')
    assert record is not None and record.last_observed_at == MAY_20 + timedelta(minutes=1)


def test_relative_times_count_from_the_steps_own_time_not_the_servers() -> None:
    s = Service(sync_config())
    s.service.step('r1', 't1', [said('u1', 'user', 'I adopted a beagle named Rex ' + words(30), MAY_20)])
    s.service.step('r1', 't1', [said('u2', 'user', 'ok', MAY_20 + timedelta(minutes=3))])
    # When the user asks two weeks later (the question's createdAt), the memory is two weeks old
    asked = s.service.step('r1', 't1', [said('u3', 'user', 'When did I adopt Rex?', MAY_20 + timedelta(days=14))])
    assert 'Date: May 20, 2023 (2 weeks ago)' in asked.system
    # And a message sent without a time of its own (the server's clock fills it in) sees it as years ago
    today = s.service.step('r1', 't1', [said('u4', 'user', 'And now?', s.clock.now())])
    assert 'Date: May 20, 2023 (3 years ago)' in today.system


def test_arrival_order_orders_the_thread_when_client_times_disagree() -> None:
    s = Service(sync_config())
    # Given a client whose clock went backwards between messages
    s.service.step('r1', 't1', [said('u1', 'user', 'first said ' + words(20), MAY_20 + timedelta(hours=2))])
    s.service.turn('r1', 't1', [said('a1', 'assistant', 'second said ' + words(10), MAY_20 + timedelta(hours=1))])
    s.service.step('r1', 't1', [said('u2', 'user', 'third said', MAY_20)])
    # Then the thread and the Observer keep arrival order, and the cursor covers exactly what was observed
    stored = s.store.list_messages('r1', 't1', limit=10).messages
    assert [m.id for m in stored] == ['u1', 'a1', 'u2'] and [m.seq for m in stored] == [1, 2, 3]
    [prompt] = s.observer_prompts()
    assert prompt.index('first said') < prompt.index('second said')
    record = s.store.get_record('thread:r1/t1')
    assert record is not None and record.cursor('t1') == 2
    # The observation is dated by the newest time it covers, whatever the order
    assert record.last_observed_at == MAY_20 + timedelta(hours=2)


def test_chat_asked_as_of_a_date_tells_the_actor_that_date_and_dates_its_reply_from_it() -> None:
    s = Service(sync_config())
    s.service.step('r1', 't1', [said('u1', 'user', 'I adopted a beagle named Rex ' + words(30), MAY_20)])
    s.service.step('r1', 't1', [said('u2', 'user', 'ok', MAY_20 + timedelta(minutes=3))])
    s.model.script('actor', 'You adopted Rex on May 20, 2023.')
    question_date = datetime(2023, 5, 30, 23, 40, tzinfo=UTC)
    # When the question is sent with the date it is asked on
    result = s.service.chat('r1', 't1', said('q1', 'user', 'When did I adopt Rex?', question_date))
    # Then the Actor is told that day, and its memory is dated relative to it
    [call] = s.model.calls_for('actor')
    assert "Today's date is Tuesday, May 30, 2023 (UTC)." in call.request.system
    assert 'Date: May 20, 2023 (1 week ago)' in call.request.system
    # And the reply is dated on the question's time line (seconds later), stored after it
    assert result.reply is not None
    assert question_date <= time_of(result.reply) < question_date + timedelta(minutes=1)
    stored = s.store.list_messages('r1', 't1', limit=10).messages
    assert [m.id for m in stored][-2:] == ['q1', result.reply.id]


def test_chat_without_a_client_time_runs_on_the_servers_clock() -> None:
    s = Service(sync_config())
    s.model.script('actor', 'Hello!')
    result = s.service.chat('r1', 't1', said('q1', 'user', 'Hi there', s.clock.now()))
    [call] = s.model.calls_for('actor')
    assert "Today's date is Saturday, November 28, 2026 (UTC)." in call.request.system
    assert result.reply is not None and time_of(result.reply) >= SERVER_NOW


def test_buffered_chunks_and_their_activation_are_dated_by_the_messages() -> None:
    s = Service(
        {'observation': {'messageTokens': 300, 'bufferTokens': 60, 'bufferActivation': 0.8}},
        work=True,
    )
    at = MAY_20
    for n in range(8):
        # Days apart: each background slice covers its own dates
        s.service.step('r1', 't1', [said(f'u{n}', 'user', f'day {n} ' + words(40), at)])
        s.service.turn('r1', 't1', [said(f'a{n}', 'assistant', f'noted {n} ' + words(20), at + timedelta(minutes=1))])
        s.run_jobs()
        at += timedelta(days=1)
    record = s.store.get_record('thread:r1/t1')
    assert record is not None and record.active_observations.strip(), 'the chunks were activated'
    # Every chunk and the activated log carry May 2023 dates, never the server's
    boundaries = re.findall(r'--- message boundary \((\S+)\) ---', record.active_observations)
    assert boundaries and all(b.startswith('2023-05-2') for b in boundaries)
    assert all(c.last_observed_at is not None and c.last_observed_at.year == 2023 for c in record.buffered_chunks)
    assert record.last_observed_at is not None and record.last_observed_at.year == 2023
    assert '2026' not in record.active_observations


def resource_config() -> dict:
    return {
        'scope': 'resource',
        'obscureThreadIds': False,
        'observation': {'messageTokens': 200},
        'reflection': {'observationTokens': 10},
    }


def test_resource_scope_orders_threads_by_their_messages_time_and_still_reflects() -> None:
    s = Service(resource_config())
    # Given thread B's conversation happened before A's, but was replayed after it
    s.service.turn('r1', 'A', [said('a-u1', 'user', 'thread A talk ' + words(100), MAY_20)])
    s.service.turn('r1', 'B', [said('b-u1', 'user', 'thread B talk ' + words(30), MAY_20 - timedelta(days=1))])
    # When A's next step shows the Actor B's unobserved conversation, it carries B's own date
    seen = s.service.step('r1', 'A', [said('a-u2', 'user', 'and?', MAY_20 + timedelta(hours=1))])
    assert s.model.calls == []
    assert '<other-conversation id="B">' in seen.system and 'May 19 2023:' in seen.system
    # And when both are observed, B's section comes first (time order), then the log reflects: reflection waits on
    # the server's arrival times, which back-dated messages do not hold back
    s.service.turn('r1', 'B', [said('b-a1', 'assistant', 'more of B ' + words(100), MAY_20 - timedelta(days=1))])
    s.service.step('r1', 'A', [said('a-u3', 'user', 'anything new?', MAY_20 + timedelta(hours=2))])
    [prompt] = s.observer_prompts()
    assert prompt.index('<thread id="B">') < prompt.index('<thread id="A">')
    record = s.store.get_record('resource:r1')
    assert record is not None and {'A', 'B'} <= set(record.cursors)
    # dated by the messages, not the server
    assert 'Date: May 20, 2023' in record.active_observations and '2026' not in record.active_observations
    # When what is left (A's newest input) is observed, the log passes the threshold and is reflected
    s.engine.observe_now('r1', 'A')
    assert s.model.calls_for('reflector'), 'reflection ran'
    record = s.store.get_record('resource:r1')
    # (with a threshold this small the archive also moves groups out of the log: memory stays bounded)
    assert record is not None and record.generation >= 1
    kept = record.active_observations + ''.join(g.observations for g in record.archived)
    assert '2023' in kept and '2026' not in kept


def test_the_recall_tool_pages_by_arrival_and_shows_the_messages_own_times() -> None:
    s = Service(sync_config(messageTokens=10_000))
    s.service.step('r1', 't1', [said('u1', 'user', 'first', MAY_20 + timedelta(hours=1))])
    s.service.turn('r1', 't1', [said('a1', 'assistant', 'second', MAY_20)])
    result = recall(
        s.store,
        s.engine.counter,
        resource_id='r1',
        current_thread_id='t1',
        request=RecallRequest.from_args({'threadId': 't1', 'page': 1}),
    )
    text = str(result['messages'])
    assert text.index('[u1]') < text.index('[a1]')
    assert '**user (2023-05-20 10:15:00Z)** [u1]' in text and '**assistant (2023-05-20 09:15:00Z)** [a1]' in text
