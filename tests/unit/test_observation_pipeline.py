"""The observation pipeline's promise: an Observer answer must account for its input, or nothing advances.

A cursor moves past a message only when a committed observation covers it; a thread the answer leaves out is asked
about alone, and what still fails stays unobserved (and is reported). Resource scope, in-memory store.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock, SystemClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import ModelRequestError
from om_lib.llm import ModelRequest, ModelResponse
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.models.offline_model import OfflineLanguageModel
from om_lib.work import Job
from tests.fakes.scripted_model import ScriptedModel
from tests.unit.test_engine import Harness, WordTokenizer, words

NEW_HISTORY = re.compile(r'## New Message History to Observe(.*)', re.DOTALL)
SECTION = re.compile(r'<thread id="([^"]+)">\n(.*?)\n</thread>', re.DOTALL)
MESSAGE_ID = re.compile(r'\bmsg-[a-z0-9]+-\d+\b')


def resource_config(message_tokens: int, *, obscure: bool = False, **observation: Any) -> dict[str, Any]:
    return {
        'model': 'default',
        'scope': 'resource',
        'obscureThreadIds': obscure,
        'observation': {'messageTokens': message_tokens, **observation},
        'reflection': {'observationTokens': 100_000},
    }


def new_history(request: ModelRequest) -> str:
    prompt = request.contents[0].parts[0]
    assert isinstance(prompt, str)
    match = NEW_HISTORY.search(prompt)
    return match.group(1) if match else ''


def lines_for(transcript: str) -> str:
    """One observation line per message id in the transcript (so memory names every message it covers)."""
    ids = MESSAGE_ID.findall(transcript)
    return '\n'.join(f'* 🔴 (09:00) User said {mid}' for mid in dict.fromkeys(ids))


def section_answer(request: ModelRequest, *, skip: Callable[[str], bool] = lambda _: False) -> str:
    """A multi-thread answer with a section for each thread of the prompt, except those `skip` names."""
    history = new_history(request)
    sections = SECTION.findall(history)
    if not sections:  # a single-thread prompt: plain observations
        return f'<observations>\nDate: Jan 1, 2025\n{lines_for(history)}\n</observations>'
    body = '\n'.join(
        f'<thread id="{shown}">\nDate: Jan 1, 2025\n{lines_for(transcript)}\n</thread>'
        for shown, transcript in sections
        if not skip(shown)
    )
    return f'<observations>\n{body}\n</observations>'


def sectionless_answer(request: ModelRequest) -> str:
    """An Observer that ignores the section format: one flat list for everything it was shown."""
    return f'<observations>\nDate: Jan 1, 2025\n{lines_for(new_history(request))}\n</observations>'


def say(h: Harness, thread: str, n: int, text: str = '') -> Message:
    h.n += 1
    return Message.model_validate(
        {
            'id': f'msg-{thread}-{n}',
            'role': 'user',
            'createdAt': h.clock.now().isoformat(),
            'content': f'msg-{thread}-{n} {text or words(12)}',
        }
    )


def head(h: Harness, resource: str = 'r1'):
    return h.store.get_record(f'resource:{resource}')


def assert_cursors_cover_only_observed(h: Harness, resource: str = 'r1') -> None:
    """The invariant: every message at or below its thread's cursor is named in the committed observations."""
    record = head(h, resource)
    if record is None:
        return
    for thread_id, cursor in record.cursors.items():
        for message in h.store.list_messages(resource, thread_id, limit=1000).messages:
            if (message.seq or 0) <= cursor:
                assert message.id in record.active_observations, (thread_id, message.id, cursor)


# -- an Observer that ignores the section format -----------------------------------------------------------------------
def test_an_observer_that_ignores_sections_still_gets_every_message_into_memory():
    # Given three threads with unobserved messages and an Observer that never writes <thread> sections
    model = ScriptedModel(fallback=sectionless_answer)
    h = Harness(resource_config(message_tokens=170), model=model)
    h.step(say(h, 'a', 1, words(48)), thread='a')
    h.step(say(h, 'b', 1, words(48)), thread='b')
    h.engine.complete_turn('r1', 'c', [say(h, 'c', 1, words(48))])
    # When the third thread's step makes observation due (all three are selected: none alone covers the threshold)
    h.step(thread='c')
    # Then the batch answer covered no thread, so each thread was asked about alone (no sections needed there)
    assert len(model.calls_for('observer')) == 4
    record = head(h)
    assert record.cursors == {'a': 1, 'b': 1, 'c': 1}
    for mid in ('msg-a-1', 'msg-b-1', 'msg-c-1'):
        assert mid in record.active_observations
    assert_cursors_cover_only_observed(h)
    assert h.store.list_pending_threads('r1') == []


def test_a_batch_where_only_some_threads_come_back_keeps_the_missing_one_unobserved():
    # Given an Observer whose batch answer leaves thread c out, and whose answer about c alone is refused
    model = ScriptedModel(fallback=lambda r: section_answer(r, skip=lambda shown: shown == 'c'))
    h = Harness(resource_config(message_tokens=170), model=model)
    h.step(say(h, 'a', 1, words(48)), thread='a')
    h.step(say(h, 'b', 1, words(48)), thread='b')
    model.script('observer', lambda r: section_answer(r, skip=lambda shown: shown == 'c'))
    model.script('observer', ModelRequestError('scripted refusal for c'))
    h.engine.complete_turn('r1', 'c', [say(h, 'c', 1, words(48))])
    # When observation becomes due with c in the batch
    result = h.step(thread='c')
    # Then a and b are observed, c is not: its cursor did not move and it is still pending, with the reason said
    record = head(h)
    assert record.cursors == {'a': 1, 'b': 1}
    assert 'msg-c-1' not in record.active_observations
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == ['c']
    failed = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert [(f['threadId'], f['reason']) for f in failed] == [('c', 'error')]
    assert_cursors_cover_only_observed(h)
    # And c's message still reaches the Actor (it is unobserved), and is observed once the model recovers
    assert [m.id for m in result.messages if m.id.startswith('msg-')] == ['msg-c-1']
    model.script('observer', section_answer)
    h.engine.observe_now('r1', 'c')
    assert head(h).cursors['c'] == 1 and 'msg-c-1' in head(h).active_observations


# -- the offline model in resource scope ---------------------------------------------------------------------------
class CountingOffline(OfflineLanguageModel):
    def __init__(self) -> None:
        super().__init__()
        self.purposes: list[str] = []

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        self.purposes.append(request.purpose)
        return super().generate(model_id, request, timeout_s=timeout_s)


@pytest.mark.parametrize('obscure', [True, False])
def test_the_offline_model_observes_every_thread_in_resource_scope(obscure: bool):
    # Given the built-in offline model and two threads, with obscured thread ids or real ones
    offline = CountingOffline()
    clock = ManualClock(tick=timedelta(seconds=1))
    store = InMemoryStore()
    engine = MemoryEngine(
        OMConfig.model_validate(resource_config(message_tokens=100, obscure=obscure)),
        store=store,
        router=ModelRouter({'google': offline, 'offline': offline}, clock=clock, sleep=clock.advance),
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
        sleep=clock.advance,
    )

    def user(mid: str, text: str) -> Message:
        return Message.model_validate(
            {'id': mid, 'role': 'user', 'createdAt': clock.now().isoformat(), 'content': text}
        )

    engine.prepare_step('r1', 'home', [user('h1', 'I live in Lisbon with my two cats, Miso and Tofu. ' + words(30))])
    work_fact = 'I am a data engineer and I work remotely for a bank. ' + words(30)
    engine.complete_turn('r1', 'work', [user('w1', work_fact)])
    engine.prepare_step('r1', 'work', [])  # a step observes what came before its own input
    # Then one multi-thread Observer call covered both threads: both facts are in memory, both cursors moved
    assert offline.purposes.count('observer') == 1
    record = store.get_record('resource:r1')
    assert record.cursors == {'home': 1, 'work': 1}
    assert 'Lisbon' in record.active_observations and 'data engineer' in record.active_observations
    assert ('"home"' in record.active_observations) is not obscure


# -- synchronous mode: a step never hands the Actor an oversized window because a background run is still going --------
class SlowModel:
    """Observer and Reflector answers that take `delay_s` of real time."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        with self.lock:
            self.calls.append(request.purpose)
        time.sleep(self.delay_s)
        if request.purpose == 'reflector':
            text = '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User shared many facts (condensed)\n</observations>'
        else:
            ids = MESSAGE_ID.findall(new_history(request))
            detail = ' '.join(f'detail{i}' for i in range(40))
            body = '\n'.join(f'* 🔴 (09:00) User said {mid} and gave details: {detail}' for mid in ids)
            text = f'<observations>\nDate: Jan 1, 2025\n{body}\n</observations>'
        return ModelResponse(text=text, model=model_id)


class BackgroundWork:
    """Runs each job on its own thread shortly after it is submitted (like SQS and the buffer worker)."""

    def __init__(self) -> None:
        self.engine: MemoryEngine | None = None
        self.threads: list[threading.Thread] = []
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> None:
        self.jobs.append(job)
        assert self.engine is not None
        worker = threading.Thread(target=self.engine.run_job, args=(job,), daemon=True)
        self.threads.append(worker)
        worker.start()

    def join(self) -> None:
        for worker in self.threads:
            worker.join(timeout=30)


def test_sync_mode_steps_wait_for_background_work_and_keep_the_actor_window_within_budget():
    # Given sync mode with a work queue, a 1 s Observer and Reflector, and small thresholds
    message_tokens, observation_tokens = 300, 500
    model = SlowModel(delay_s=1.0)
    clock = SystemClock()
    work = BackgroundWork()
    counter = TokenCounter(WordTokenizer())
    engine = MemoryEngine(
        OMConfig.model_validate(
            {
                'model': 'default',
                'observation': {'messageTokens': message_tokens, 'bufferTokens': False},
                'reflection': {'observationTokens': observation_tokens},
            }
        ),
        store=InMemoryStore(),
        router=ModelRouter({'google': model}, clock=clock),
        counter=counter,
        clock=clock,
        work=work,
    )
    work.engine = engine

    def message(role: str, n: int, size: int) -> Message:
        mid = f'msg-t-{n}'
        text = f'{mid} ' + words(size)
        return Message.model_validate({'id': mid, 'role': role, 'createdAt': clock.now().isoformat(), 'content': text})

    # When every turn queues the observation that is due, and the next step arrives while it still runs
    peaks: list[float] = []
    waited: list[float] = []
    for turn in range(8):
        started = time.monotonic()
        step = engine.prepare_step('r1', 't1', [message('user', 2 * turn, 60)])
        waited.append(time.monotonic() - started)
        actor_window = counter.count_messages(step.messages) + (step.record.observation_tokens if step.record else 0)
        own_input = counter.count_messages([message('user', 2 * turn, 60)])
        peaks.append((actor_window - own_input) / (message_tokens + observation_tokens))
        engine.complete_turn('r1', 't1', [message('assistant', 2 * turn + 1, 90)])
        time.sleep(0.2)
    work.join()
    # Then background observations and reflections ran, steps waited for them rather than skipping them,
    # and the Actor never got more than messageTokens + observationTokens besides the step's own input
    assert 'observer' in model.calls and 'reflector' in model.calls
    assert any(w > 0.5 for w in waited), waited
    assert max(peaks) <= 1.0, peaks


# -- the invariant, for any Observer behaviour -----------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(['a', 'b', 'c', 'd']),  # which thread speaks
            st.integers(min_value=3, max_value=40),  # how many words
            st.sampled_from(['sections', 'sectionless', 'omit-first', 'omit-all', 'fail', 'garbage']),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_cursors_never_pass_a_message_no_committed_observation_covers(plan):
    behaviour = {'now': 'sections'}

    def answer(request: ModelRequest) -> str:
        kind = behaviour['now']
        if kind == 'fail':
            raise ModelRequestError('scripted failure')
        if kind == 'garbage':
            return 'I am sorry, I cannot help with that.'
        if kind == 'sectionless':
            return sectionless_answer(request)
        if kind == 'omit-all':
            return '<observations>\n</observations>'
        if kind == 'omit-first':
            sections = SECTION.findall(new_history(request))
            first = sections[0][0] if sections else ''
            return section_answer(request, skip=lambda shown: shown == first)
        return section_answer(request)

    h = Harness(resource_config(message_tokens=50, maxTokensPerBatch=60), model=ScriptedModel(fallback=answer))
    counts: dict[str, int] = {}
    cursors_seen: dict[str, int] = {}
    for thread, size, kind in plan:
        behaviour['now'] = kind
        counts[thread] = counts.get(thread, 0) + 1
        h.step(say(h, thread, counts[thread], words(size)), thread=thread)
        assert_cursors_cover_only_observed(h)
        record = head(h)
        for tid, cursor in (record.cursors if record else {}).items():
            assert cursor >= cursors_seen.get(tid, 0)  # cursors never move back
            cursors_seen[tid] = cursor
    # Once the model behaves, everything said is observed: nothing was skipped
    behaviour['now'] = 'sections'
    h.engine.observe_now('r1', plan[0][0])
    assert_cursors_cover_only_observed(h)
    record = head(h)
    for thread, said in counts.items():
        assert record.cursor(thread) == said, (thread, record.cursors)
