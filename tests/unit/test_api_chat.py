"""ChatService (om_lib/conversation/chat.py) over the in-memory store and a scripted model: what the Actor is sent, what
is saved."""

from __future__ import annotations

from datetime import timedelta

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import ModelUnavailableError
from om_lib.llm import FunctionCall, FunctionResponse
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.service import MemoryService
from tests.fakes.scripted_model import ScriptedModel


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def make_service(model: ScriptedModel) -> tuple[MemoryService, InMemoryStore, ManualClock]:
    clock = ManualClock(tick=timedelta(seconds=1))
    store = InMemoryStore()
    router = ModelRouter({'google': model}, clock=clock, sleep=clock.advance)
    engine = MemoryEngine(
        OMConfig.model_validate({'model': 'default', 'observation': {'messageTokens': 10_000, 'bufferTokens': False}}),
        store=store,
        router=router,
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
    )
    return MemoryService(engine), store, clock


def message(mid: str, role: str, clock: ManualClock, **body: object) -> Message:
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': clock.now().isoformat(), **body})


def test_chat_sends_history_as_alternating_turns_and_saves_the_reply() -> None:
    # Given a thread with a tool round trip already stored
    model = ScriptedModel()
    service, store, clock = make_service(model)
    history = [
        message('u1', 'user', clock, content='What is the weather in Lisbon?'),
        message(
            'a1',
            'assistant',
            clock,
            parts=[{'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'weather', 'args': {}}],
        ),
        message(
            't1',
            'tool',
            clock,
            parts=[{'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'weather', 'result': 21}],
        ),
        message('a2', 'assistant', clock, content='It is 21 degrees.'),
    ]
    store.append_messages('r1', 'th1', history, now=clock.now())
    model.script('actor', 'Take a light jacket.')

    # When the user asks something new
    result = service.chat('r1', 'th1', message('u2', 'user', clock, content='Do I need a jacket?'))

    # Then the Actor saw user/model turns with function calls and results, and the reply is stored after the input
    [call] = model.calls_for('actor')
    contents = call.request.contents
    assert [c.role for c in contents] == ['user', 'model', 'user', 'model', 'user']
    assert contents[1].parts == (FunctionCall(name='weather', args={}, id='c1'),)
    assert contents[2].parts == (FunctionResponse(name='weather', response={'result': 21}, id='c1'),)
    assert contents[-1].parts == ('Do I need a jacket?',)
    assert call.request.system.startswith('You are a helpful assistant')
    assert result.reply is not None and result.reply.text() == 'Take a light jacket.'
    assert result.reply.id.startswith('msg_') and result.actor_calls == 1
    stored = store.list_messages('r1', 'th1', limit=10).messages
    assert [m.id for m in stored][-2:] == ['u2', result.reply.id]


def test_actor_failure_keeps_the_user_message_and_reports_a_part() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    model.script('actor', *[ModelUnavailableError('overloaded', status_code=503)] * 5)

    result = service.chat('r1', 'th1', message('u1', 'user', clock, content='Hello?'))

    assert result.reply is None
    [failed] = [p for p in result.parts.to_json() if p['type'] == 'data-om-actor-failed']
    assert failed['data']['error'] == 'model_unavailable' and failed['data']['retryable'] is True
    assert [m.id for m in store.list_messages('r1', 'th1').messages] == ['u1']


def test_retrying_the_same_message_after_a_failure_saves_it_once() -> None:
    model = ScriptedModel()
    service, store, clock = make_service(model)
    model.script('actor', *[ModelUnavailableError('overloaded', status_code=503)] * 3, 'Hi there.')
    user = message('u1', 'user', clock, content='Hello?')

    assert service.chat('r1', 'th1', user).reply is None
    # Three failures in a row opened the model's circuit: a retry right away fails at once, without a call
    calls = len(model.calls_for('actor'))
    assert service.chat('r1', 'th1', user).reply is None
    assert len(model.calls_for('actor')) == calls
    # After the cooldown the trial call goes through
    clock.advance(6)
    retried = service.chat('r1', 'th1', user)

    assert retried.reply is not None and retried.reply.text() == 'Hi there.'
    assert [m.role for m in store.list_messages('r1', 'th1').messages] == ['user', 'assistant']
