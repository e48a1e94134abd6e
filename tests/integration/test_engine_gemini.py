"""The engine end to end with the REAL google-genai client against the loopback fake Gemini server.

The 100-turn test is the core issue's acceptance test: the steps at which observation and reflection must happen
are computed in advance from the token counts, then the engine must act exactly there, lose no message and use the
fallback model when the first one answers 503.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.adapters.models.gemini import GeminiLanguageModel
from om_lib.adapters.tiktoken_counter import get_tokenizer
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context import context as ctx
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.prompts import observer as obs
from tests.fakes.fake_gemini import FakeGemini, FakeReply, FakeRequest

FLASH, PRO = 'gemini-2.5-flash', 'gemini-2.5-pro'


def observer_block(n: int) -> str:
    return (
        '<observations>\nDate: Mar 3, 2025\n'
        f'* 🔴 (09:00) User stated fact number {n} about the project\n'
        f'* 🟡 (09:01) User asked follow-up question {n}\n'
        '</observations>\n'
        f'<current-task>\nPrimary: item {n}\n</current-task>'
    )


REFLECTION = (
    '<observations>\nDate: Mar 3, 2025\n* 🔴 (09:00) User shared many project facts (condensed)\n</observations>'
)


class ScriptedGemini:
    """Answers like an Observer (numbered blocks) or a Reflector, told apart by the system prompt."""

    def __init__(self) -> None:
        self.observations = 0

    def __call__(self, request: FakeRequest) -> FakeReply:
        if 'observation reflector' in request.system_text:
            return FakeReply.text(REFLECTION)
        self.observations += 1
        return FakeReply.text(observer_block(self.observations))


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini(ScriptedGemini()) as server:
        yield server


def make_engine(fake: FakeGemini, config: dict, clock: ManualClock) -> MemoryEngine:
    gemini = GeminiLanguageModel(api_key='test-key', base_url=fake.url)
    router = ModelRouter({'google': gemini}, clock=clock, sleep=lambda s: None)
    return MemoryEngine(
        OMConfig.model_validate(config),
        store=InMemoryStore(),
        router=router,
        counter=TokenCounter(get_tokenizer()),
        clock=clock,
    )


def conversation(n_turns: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    vocab = 'alpha beta gamma delta budget deploy lambda table queue retry cache window token memory user'.split()
    turns = []
    for i in range(n_turns):
        user = f'Turn {i}: ' + ' '.join(rng.choice(vocab) for _ in range(rng.randint(8, 40)))
        reply = f'Reply {i}: ' + ' '.join(rng.choice(vocab) for _ in range(rng.randint(5, 30)))
        turns.append((user, reply))
    return turns


def message(mid: str, role: str, text: str, at: datetime) -> Message:
    return Message.model_validate({'id': mid, 'role': role, 'createdAt': at.isoformat(), 'content': text})


def plan(
    turns: list[tuple[str, str]], counter: TokenCounter, message_tokens: int, observation_tokens: int, t0: datetime
):
    """Which steps must observe and which must reflect, from the token counts alone."""
    observe_at, reflect_at = [], []
    pending: list[Message] = []
    text, blocks = '', 0
    at = t0
    for i, (user, reply) in enumerate(turns):
        u = counter.with_token_counts(message(f'u{i}', 'user', user, at))
        if pending and counter.count_messages(pending) >= message_tokens:
            # Due when what came before the step's input passes the threshold; the step observes that (the Actor
            # answers the input, so it neither counts nor is observed there; issue 21 item 12)
            blocks += 1
            block = obs.parse_observer_output(observer_block(blocks)).observations
            observed_at = max(m.created_at for m in pending)
            text = text + ctx.message_boundary(observed_at) + block if text.strip() else block
            observe_at.append(i)
            pending = []
            if counter.count_observations(text) > observation_tokens:
                reflect_at.append(i)
                text = obs.parse_observer_output(REFLECTION).observations
        pending.append(u)
        at += timedelta(minutes=1)
        pending.append(counter.with_token_counts(message(f'a{i}', 'assistant', reply, at)))
        at += timedelta(minutes=1)
    return observe_at, reflect_at


def test_100_turns_observe_and_reflect_exactly_where_the_token_counts_say(fake: FakeGemini) -> None:
    t0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)
    clock = ManualClock(t0)
    config = {
        'model': [{'model': f'google/{FLASH}', 'maxRetries': 0}, {'model': f'google/{PRO}', 'maxRetries': 1}],
        'observation': {'messageTokens': 300, 'bufferTokens': False},
        'reflection': {'observationTokens': 220},
    }
    engine = make_engine(fake, config, clock)
    turns = conversation(100)
    expected_observe, expected_reflect = plan(turns, engine.counter, 300, 220, t0)
    assert len(expected_observe) >= 10 and len(expected_reflect) >= 2  # the script really exercises both

    # The very first Observer call hits a 503 on the first model: the fallback model must serve it.
    fake.script(FLASH, FakeReply.error(503, 'overloaded'))

    observed_at, reflected_at = [], []
    for i, (user, reply) in enumerate(turns):
        clock.set(t0 + timedelta(minutes=2 * i))
        result = engine.prepare_step('r1', 't1', [message(f'u{i}', 'user', user, clock.now())])
        ends = [p['data']['operationType'] for p in result.parts.to_json() if p['type'] == 'data-om-observation-end']
        assert not [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed'], (
            result.parts.to_json()
        )
        if 'observation' in ends:
            observed_at.append(i)
        if 'reflection' in ends:
            reflected_at.append(i)
        clock.set(t0 + timedelta(minutes=2 * i + 1))
        engine.complete_turn('r1', 't1', [message(f'a{i}', 'assistant', reply, clock.now())])

    assert observed_at == expected_observe
    assert reflected_at == expected_reflect

    # Every message id ends up exactly once: in an observed range or in the unobserved tail.
    store = engine.store
    record = store.get_record('thread:r1/t1')
    everything = store.list_messages('r1', 't1', limit=1000).messages
    by_seq = {m.seq: m.id for m in everything}
    covered: list[str] = []
    for group in sorted(record.groups, key=lambda g: g.start_seq):
        covered += [by_seq[s] for s in range(group.start_seq, group.end_seq + 1)]
    tail = [m.id for m in store.list_messages('r1', 't1', after_seq=record.cursor('t1'), limit=1000).messages]
    all_ids = [m.id for m in everything]
    assert sorted(covered + tail) == sorted(all_ids)
    assert len(covered + tail) == len(set(covered + tail)) == 200

    # The fallback is visible in the fake server's log.
    assert fake.calls_for(FLASH)[0].status == 503
    assert fake.calls_for(PRO) and fake.calls_for(PRO)[0].status == 200
    assert record.generation == len(expected_reflect)


def test_engine_sends_images_inline_and_prompts_in_order(fake: FakeGemini) -> None:
    clock = ManualClock(datetime(2025, 3, 3, 9, 0, tzinfo=UTC))
    engine = make_engine(fake, {'model': 'default', 'observation': {'messageTokens': 50, 'bufferTokens': False}}, clock)
    png = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=='
    msg = Message.model_validate(
        {
            'id': 'img',
            'role': 'user',
            'createdAt': clock.now().isoformat(),
            'parts': [
                {'type': 'text', 'text': 'Here is my whiteboard sketch of the architecture ' * 10},
                {'type': 'image', 'mediaType': 'image/png', 'data': png, 'filename': 'board.png'},
            ],
        }
    )
    engine.prepare_step('r1', 't1', [msg])
    result = engine.prepare_step('r1', 't1', [])  # the step after it observes it
    assert any(p['type'] == 'data-om-observation-end' for p in result.parts.to_json())
    request = fake.requests[-1]
    assert request.inline_data_count == 1
    prompt = '\n'.join(request.user_texts)
    assert '[Image #1: board.png]' in prompt
    # The task comes after the history (reference bug #22195).
    assert prompt.index('## New Message History to Observe') < prompt.index('## Your Task')
    assert request.generation_config.get('temperature') == pytest.approx(0.3)


@pytest.mark.parametrize(
    ('replies', 'observed'),
    [
        ([FakeReply.text('I am not sure what you want.'), FakeReply.text('still no structure')], False),
        ([FakeReply.empty(), FakeReply.empty(), FakeReply.empty(), FakeReply.empty()], False),
        ([FakeReply.blocked(), FakeReply.text(observer_block(1))], True),
        ([FakeReply.error(500), FakeReply.error(503), FakeReply.error(503)], False),
    ],
    ids=['garbage', 'empty', 'blocked-then-ok', 'failing'],
)
def test_engine_survives_bad_observer_answers(fake: FakeGemini, replies, observed) -> None:
    clock = ManualClock(datetime(2025, 3, 3, 9, 0, tzinfo=UTC))
    engine = make_engine(fake, {'model': 'default', 'observation': {'messageTokens': 50, 'bufferTokens': False}}, clock)
    fake.script(FLASH, *replies)
    text = 'A long message about the deployment plan and its many steps ' * 10
    engine.prepare_step('r1', 't1', [message('m1', 'user', text, clock.now())])
    result = engine.prepare_step('r1', 't1', [])  # the step after it observes it
    kinds = [p['type'] for p in result.parts.to_json()]
    record = engine.store.get_record('thread:r1/t1')
    if observed:
        assert 'data-om-observation-end' in kinds and record.cursor('t1') == 1
    else:
        assert 'data-om-observation-failed' in kinds
        assert record.active_observations == '' and record.cursor('t1') == 0
        assert [m.id for m in result.messages] == ['m1']  # nothing lost
