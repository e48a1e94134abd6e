"""The chat turn as a listener hears it (the streamed route) and idempotent turns (one reply per user message), over
the in-memory store and a scripted model."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.conversation.chat import reply_id_for
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import MessageConflictError, ModelUnavailableError, TurnInProgressError
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.service import (
    ActorFinished,
    ActorStarted,
    ChatEvent,
    MemoryPart,
    MemoryService,
    TextDelta,
    TurnStarted,
)
from tests.fakes.scripted_model import ScriptedModel
from tests.unit.test_api_chat import WordTokenizer

OBSERVATIONS = '<observations>\n* 🔴 (09:00) User likes tea\n</observations>'


def make_service(
    model: ScriptedModel, tick: float = 1.0, **observation: object
) -> tuple[MemoryService, InMemoryStore, ManualClock]:
    clock = ManualClock(tick=timedelta(seconds=tick))
    store = InMemoryStore()
    router = ModelRouter({'google': model}, clock=clock, sleep=clock.advance)
    config = {'model': 'default', 'observation': {'messageTokens': 10_000, 'bufferTokens': False, **observation}}
    engine = MemoryEngine(
        OMConfig.model_validate(config), store=store, router=router, counter=TokenCounter(WordTokenizer()), clock=clock
    )
    return MemoryService(engine), store, clock


def user(mid: str, text: str, clock: ManualClock) -> Message:
    return Message.model_validate({'id': mid, 'role': 'user', 'createdAt': clock.now().isoformat(), 'content': text})


def heard_kinds(events: list[ChatEvent]) -> list[str]:
    return [e.part.kind() if isinstance(e, MemoryPart) else type(e).__name__ for e in events]


def test_a_listener_hears_the_turn_in_the_order_it_happens() -> None:
    # Given a thread that is due for a synchronous observation at its next step
    model = ScriptedModel()
    service, store, clock = make_service(model, messageTokens=30)
    store.append_messages(
        'r1', 't1', [user(f'old{i}', 'I like tea very much ' * 3, clock) for i in range(3)], now=clock.now()
    )
    model.script('observer', OBSERVATIONS)
    model.script('actor', 'Tea it is then.')
    events: list[ChatEvent] = []
    observer_calls_when_heard: dict[str, int] = {}

    def listen(event: ChatEvent) -> None:
        events.append(event)
        if isinstance(event, MemoryPart):
            observer_calls_when_heard.setdefault(event.part.kind(), len(model.calls_for('observer')))

    # When the user sends a message and a listener listens
    result = service.chat('r1', 't1', user('u1', 'What should I drink?', clock), listener=listen)

    # Then it hears the reply's id first, the windows as the step found them, the observation before and after the
    # Observer ran, the final windows, then the Actor's text as it was written
    kinds = heard_kinds(events)
    assert kinds[:5] == [
        'TurnStarted',
        'data-om-status',
        'data-om-observation-start',
        'data-om-observation-end',
        'data-om-status',
    ]
    assert observer_calls_when_heard['data-om-observation-start'] == 0
    assert observer_calls_when_heard['data-om-observation-end'] == 1
    assert kinds[5] == 'ActorStarted' and kinds.index('ActorFinished') > kinds.index('TextDelta')
    assert isinstance(events[0], TurnStarted) and result.reply is not None and events[0].reply_id == result.reply.id
    assert ''.join(e.text for e in events if isinstance(e, TextDelta)) == result.reply.text() == 'Tea it is then.'
    # The collected parts are the JSON answer's: one status (the final one), no preview
    collected = [p['type'] for p in result.parts.to_json()]
    assert collected.count('data-om-status') == 1 and 'data-om-observation-end' in collected


def test_a_message_is_answered_once_and_a_retry_gets_the_stored_reply() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    model.script('actor', 'First answer.', 'Second answer (never asked for).')
    first = service.chat('r1', 't1', user('u1', 'Hello?', clock))
    events: list[ChatEvent] = []

    # When the same message is sent again (a retry: same id, same content)
    again = service.chat('r1', 't1', user('u1', 'Hello?', clock), listener=events.append)

    # Then it gets the stored reply: no Actor call, nothing stored twice, and a listener hears it as one answer
    assert first.reply is not None and again.reply is not None
    assert again.replayed and again.reply.id == first.reply.id == reply_id_for('r1', 't1', 'u1')
    assert again.reply.text() == 'First answer.' and again.actor_calls == 0
    assert len(model.calls_for('actor')) == 1
    assert [m.id for m in store.list_messages('r1', 't1').messages] == ['u1', first.reply.id]
    assert heard_kinds(events) == ['TurnStarted', 'ActorStarted', 'TextDelta', 'ActorFinished']
    # Other content under that id is still a conflict
    with pytest.raises(MessageConflictError):
        service.chat('r1', 't1', user('u1', 'Something else', clock))


def test_a_failed_actor_leaves_the_message_open_for_a_retry() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    model.script('actor', *[ModelUnavailableError('down')] * 3, 'Back again.')
    failed = service.chat('r1', 't1', user('u1', 'Hello?', clock))
    assert failed.reply is None and 'data-om-actor-failed' in [p['type'] for p in failed.parts.to_json()]
    clock.advance(60)  # the model's circuit closes again
    retried = service.chat('r1', 't1', user('u1', 'Hello?', clock))
    assert retried.reply is not None and retried.reply.text() == 'Back again.' and not retried.replayed
    assert [m.role for m in store.list_messages('r1', 't1').messages] == ['user', 'assistant']


def test_a_concurrent_duplicate_waits_for_the_first_reply_or_says_in_progress() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model, tick=0)  # time moves only while the duplicate waits
    release = threading.Event()
    entered = threading.Event()

    def slow_actor(_: object) -> str:
        entered.set()
        release.wait(5)
        return 'The one reply.'

    model.script('actor', slow_actor)
    results: list[object] = []
    first = threading.Thread(target=lambda: results.append(service.chat('r1', 't1', user('u1', 'Hi', clock))))
    first.start()
    assert entered.wait(5)

    # A duplicate whose wait runs out (its clock passes the budget while it waits) says so, and wrote nothing
    service.chat_service._sleep = clock.advance
    with pytest.raises(TurnInProgressError):
        service.chat('r1', 't1', user('u1', 'Hi', clock))

    # A duplicate that waits long enough gets the first one's reply
    def waiting_sleep(seconds: float) -> None:
        release.set()
        first.join(5)

    service.chat_service._sleep = waiting_sleep
    waited = service.chat('r1', 't1', user('u1', 'Hi', clock))
    first.join(5)
    assert waited.replayed and waited.reply is not None and waited.reply.text() == 'The one reply.'
    assert len(model.calls_for('actor')) == 1
    assert [m.role for m in store.list_messages('r1', 't1').messages] == ['user', 'assistant']


def test_a_crashed_turns_claim_expires() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    lease = timedelta(seconds=60)
    store.claim_turn('r1', 't1', 'u1', owner='crashed', now=clock.now(), lease=lease)
    clock.advance(lease + timedelta(seconds=1))
    model.script('actor', 'Answered after all.')
    result = service.chat('r1', 't1', user('u1', 'Hi', clock))
    assert result.reply is not None and result.reply.text() == 'Answered after all.'


def test_the_listener_hears_nothing_when_the_message_is_refused() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    store.append_messages('r1', 't1', [user('u1', 'original', clock)], now=clock.now())
    events: list[ChatEvent] = []
    with pytest.raises(MessageConflictError):
        service.chat('r1', 't1', user('u1', 'changed', clock), listener=events.append)
    assert events == []
    assert not [e for e in events if isinstance(e, ActorStarted | ActorFinished)]
