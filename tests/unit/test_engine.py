"""The step engine over the in-memory store and a scripted model (fast; the HTTP-level twin is in integration/)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import MessageConflictError, ModelUnavailableError
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.records import Lease
from om_lib.work import Job
from tests.fakes.scripted_model import ScriptedModel

OBS_A = (
    '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User stated they live in Lisbon\n</observations>\n'
    '<current-task>\nPrimary: plan a trip\n</current-task>\n'
    '<suggested-response>\nAsk about dates\n</suggested-response>'
)
OBS_B = '<observations>\nDate: Jan 1, 2025\n* 🟡 (09:05) User asked about trains to Porto\n</observations>'


class WordTokenizer:
    """One token per whitespace-separated word: easy to reason about in tests."""

    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def words(n: int, tag: str = 'w') -> str:
    return ' '.join(f'{tag}{i}' for i in range(n))


class Harness:
    def __init__(self, config: dict, *, model: ScriptedModel | None = None, budget: float = 20.0) -> None:
        self.clock = ManualClock(tick=timedelta(seconds=1))
        self.store = InMemoryStore()
        self.model = model or ScriptedModel()
        router = ModelRouter({'google': self.model}, clock=self.clock, sleep=self.clock.advance)
        self.counter = TokenCounter(WordTokenizer())
        self.engine = MemoryEngine(
            OMConfig.model_validate(config),
            store=self.store,
            router=router,
            counter=self.counter,
            clock=self.clock,
            time_budget_s=budget,
            sleep=self.clock.advance,  # waiting for another holder's lease moves the fake clock
        )
        self.n = 0

    def user(self, text: str, mid: str | None = None) -> Message:
        self.n += 1
        return Message.model_validate(
            {'id': mid or f'u{self.n}', 'role': 'user', 'createdAt': self.clock.now().isoformat(), 'content': text}
        )

    def assistant(self, text: str, mid: str | None = None) -> Message:
        self.n += 1
        return Message.model_validate(
            {'id': mid or f'a{self.n}', 'role': 'assistant', 'createdAt': self.clock.now().isoformat(), 'content': text}
        )

    def step(self, *messages: Message, thread: str = 't1', resource: str = 'r1'):
        return self.engine.prepare_step(resource, thread, list(messages))

    def record(self, thread: str = 't1', resource: str = 'r1'):
        return self.store.get_record(f'thread:{resource}/{thread}')


def config(message_tokens: int = 100, observation_tokens: int = 1000, *, archive_after: int = 100_000, **extra) -> dict:
    # The archive bound is far away unless a test is about it: these tests look at reflection with tiny thresholds.
    return {
        'model': 'default',
        'observation': {
            'messageTokens': message_tokens,
            'bufferTokens': False,
            'archive': {'afterTokens': archive_after, 'keepTokens': archive_after // 3},
        },
        'reflection': {'observationTokens': observation_tokens},
        **extra,
    }


def part_types(result) -> list[str]:
    return [p['type'] for p in result.parts.to_json()]


def test_below_threshold_no_model_call_and_status_every_step():
    # Given a fresh thread and a threshold of 100 tokens
    h = Harness(config())
    # When a short message arrives
    result = h.step(h.user(words(10)))
    # Then nothing is observed, the Actor sees the message, and a status part reports the window
    assert h.model.calls == []
    assert result.system == ''
    assert [m.id for m in result.messages] == ['u1']
    status = result.parts.to_json()[-1]
    assert status['type'] == 'data-om-status'
    assert status['data']['windows']['active']['messages']['threshold'] == 100
    assert status['data']['windows']['active']['messages']['tokens'] == h.counter.count_messages(result.messages)


def test_crossing_threshold_observes_and_drops_observed_messages():
    h = Harness(config())
    h.model.script('observer', OBS_A)
    h.step(h.user(words(40)))
    h.engine.complete_turn('r1', 't1', [h.assistant(words(40))])
    # The third message crosses 100 tokens of pending messages.
    result = h.step(h.user(words(30), mid='u-cross'))
    assert len(h.model.calls_for('observer')) == 1
    assert 'data-om-observation-start' in part_types(result)
    assert 'data-om-observation-end' in part_types(result)
    record = h.record()
    assert 'User stated they live in Lisbon' in record.active_observations
    assert '<current-task>' not in record.active_observations
    # The step's own input is not observed in its own step: it is the message the Actor answers (issue 21 item 12).
    assert record.cursor('t1') == 2
    # The Actor sees memory, the continuation reminder, and the in-flight input once.
    assert 'Lisbon' in result.system and '<current-task>' in result.system
    assert [m.id for m in result.messages] == ['om-continuation', 'u-cross']
    thread = h.store.get_thread('r1', 't1')
    assert thread.current_task == 'Primary: plan a trip'
    assert thread.suggested_response == 'Ask about dates'
    # The observer saw the two earlier messages and was told about previous (none) observations.
    request = h.model.calls_for('observer')[0].request
    assert [m.id for m in request.source_messages] == ['u1', 'a2']
    # Next step: only new messages are unobserved.
    nxt = h.step(h.user(words(5), mid='u-next'))
    assert [m.id for m in nxt.messages] == ['om-continuation', 'u-cross', 'u-next']


def test_a_step_never_shows_its_new_input_twice_and_an_oversized_message_is_observed_next():
    # Given a first message far over the threshold
    h = Harness(config())
    h.model.script('observer', OBS_A)
    result = h.step(h.user(words(500), mid='big'))
    # Then the step answers it as a message and does not also observe it (it would be in `system` and in `messages`)
    assert h.model.calls_for('observer') == []
    assert result.system == '' and [m.id for m in result.messages] == ['big']
    # When the turn is answered and the next step comes, the oversized message is observed with its answer
    h.engine.complete_turn('r1', 't1', [h.assistant('ok', mid='reply')])
    after = h.step(h.user('and now?', mid='next'))
    assert len(h.model.calls_for('observer')) == 1
    assert h.record().cursor('t1') == 2
    assert [m.id for m in after.messages] == ['om-continuation', 'next']


def test_failing_model_loses_nothing_and_backlog_is_observed_later():
    h = Harness(config())
    h.model.script('observer', *[ModelUnavailableError('503', status_code=503)] * 3)
    h.step(h.user(words(150), mid='m1'))
    result = h.step(h.user(words(5), mid='m2'))
    assert 'data-om-observation-failed' in part_types(result)
    failed = next(p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed')
    assert failed['data']['operationType'] == 'observation' and failed['data']['error']
    assert [m.id for m in result.messages] == ['m1', 'm2']
    record = h.record()
    assert record.cursor('t1') == 0 and record.observing is None  # lease released
    # Right after, the model's circuit is open: the next step answers at once, without calling it
    calls = len(h.model.calls_for('observer'))
    quick = h.step(h.user(words(3), mid='m1b'))
    [failed] = [p['data'] for p in quick.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed['reason'] == 'model_unavailable' and len(h.model.calls_for('observer')) == calls
    # A later step, once the cooldown passed, observes the whole backlog.
    h.clock.advance(10)
    h.model.script('observer', OBS_A)
    later = h.step(h.user(words(5), mid='m3'))
    assert 'data-om-observation-end' in part_types(later)
    assert h.record().cursor('t1') == 3


@pytest.mark.parametrize(
    'bad',
    [
        'Sure! I will now observe the conversation for you.',  # neither tags nor list lines
        '',  # empty
        '<observations>\n'
        + ('* 🔴 (09:00) loop loop loop loop loop loop loop loop loop loop\n' * 400)
        + '</observations>',
    ],
    ids=['garbage', 'empty', 'repetitive'],
)
def test_unusable_observer_output_is_never_stored(bad):
    h = Harness(config())
    h.model.script('observer', bad, bad)
    h.step(h.user(words(150)))
    result = h.step(h.user('next'))
    assert 'data-om-observation-failed' in part_types(result)
    assert h.record().active_observations == ''
    assert len(h.model.calls_for('observer')) >= 2


def test_unusable_then_valid_observer_output_succeeds_with_two_calls():
    h = Harness(config())
    h.model.script('observer', 'no structure here at all', OBS_A)
    h.step(h.user(words(150)))
    result = h.step(h.user('next'))
    assert 'data-om-observation-end' in part_types(result)
    assert len(h.model.calls_for('observer')) == 2


def test_retried_step_with_same_ids_changes_nothing():
    h = Harness(config())
    h.model.script('observer', OBS_A)
    h.step(h.user(words(150), mid='before'))
    first = h.user(words(5), mid='same')
    h.step(first)
    record = h.record()
    again = h.step(first)
    assert h.record() == record
    assert len(h.model.calls_for('observer')) == 1
    assert again.saved_ids == []
    assert len(h.store.list_messages('r1', 't1').messages) == 2


def test_conflicting_content_under_stored_id_is_refused():
    h = Harness(config())
    h.step(h.user('hello there', mid='x'))
    with pytest.raises(MessageConflictError):
        h.step(h.user('something else', mid='x'))
    assert [m.text() for m in h.store.list_messages('r1', 't1').messages] == ['hello there']


def test_pending_tool_call_defers_observation_until_result():
    h = Harness(config())
    call = Message.model_validate(
        {
            'id': 'call',
            'role': 'assistant',
            'createdAt': h.clock.now().isoformat(),
            'parts': [{'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'search', 'args': {'q': words(150)}}],
        }
    )
    h.step(h.user(words(10)))
    h.engine.complete_turn('r1', 't1', [call])
    deferred = h.step()
    assert h.model.calls_for('observer') == []
    assert 'data-om-observation-start' not in part_types(deferred)
    result = Message.model_validate(
        {
            'id': 'res',
            'role': 'tool',
            'createdAt': h.clock.now().isoformat(),
            'parts': [{'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'search', 'result': 'ok'}],
        }
    )
    h.model.script('observer', OBS_A)
    h.step(result)
    done = h.step(h.user('next'))
    assert 'data-om-observation-end' in part_types(done)


def test_continuation_reminder_sent_back_is_not_saved():
    h = Harness(config())
    h.model.script('observer', OBS_A)
    h.step(h.user(words(150)))
    result = h.step(h.user('next'))
    reminder = result.messages[0]
    assert reminder.id == 'om-continuation'
    h.step(reminder, h.user('next'))
    stored = [m.id for m in h.store.list_messages('r1', 't1').messages]
    assert 'om-continuation' not in stored


def test_active_lease_of_another_request_skips_observation_and_expired_lease_is_taken_over():
    h = Harness(config())
    h.step(h.user(words(150)))
    record = h.record()
    stale = Lease(owner='crashed-worker', expires_at=h.clock.now() + timedelta(minutes=10))
    h.store.put_record(record.model_copy(update={'observing': stale}), expected_version=record.version)
    result = h.step(h.user(words(10)))
    # The step waited for the holder as long as its budget allowed, then said why it did not observe
    assert h.model.calls_for('observer') == []
    [busy] = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert busy['reason'] == 'busy' and 'crashed-worker' in busy['error']
    # After the lease expires, the next step takes it over and observes.
    h.clock.advance(timedelta(minutes=15))
    h.model.script('observer', OBS_A)
    result = h.step(h.user('more'))
    assert 'data-om-observation-end' in part_types(result)
    assert h.record().observing is None


def test_stale_holder_late_commit_is_refused():
    h = Harness(config())
    # The first observer call is slow: while it runs, its lease expires and another request takes over.
    takeover_done = {}

    def slow_then_taken_over(request):
        h.clock.advance(timedelta(minutes=5))
        current = h.record()
        fresh = Lease(owner='other', expires_at=h.clock.now() + timedelta(minutes=2))
        h.store.put_record(current.model_copy(update={'observing': fresh}), expected_version=current.version)
        takeover_done['yes'] = True
        return OBS_A

    h.model.script('observer', slow_then_taken_over)
    h.step(h.user(words(150)))
    result = h.step(h.user('next'))
    assert takeover_done
    failed = [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed and failed[0]['data']['reason'] == 'conflict'
    record = h.record()
    assert record.active_observations == '' and record.observing.owner == 'other'


def test_reflection_creates_generation_and_keeps_history():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    long_obs = (
        '<observations>\nDate: Jan 1, 2025\n'
        + '\n'.join(f'* 🟡 (09:{i:02d}) User mentioned detail number {i} about the trip' for i in range(12))
        + '\n</observations>'
    )
    h.model.script('observer', long_obs)
    h.model.script(
        'reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User is planning a trip\n</observations>'
    )
    h.step(h.user(words(60)))
    result = h.step(h.user('next'))
    record = h.record()
    assert record.generation == 1 and record.origin == 'reflection'
    assert record.active_observations.strip().endswith('User is planning a trip')
    assert record.cursor('t1') == 1  # cursor carried into the new generation
    history = h.store.list_generations(record.key)
    assert [g.generation for g in history] == [1, 0]
    assert 'detail number 11' in history[1].active_observations
    ops = [(p['type'], p['data'].get('operationType')) for p in result.parts.to_json()]
    assert ('data-om-observation-end', 'reflection') in ops
    assert record.groups and record.groups[0].kind == 'reflection'
    # The generations timeline: the log before the reflection, and what the reflection left
    view = h.engine.generations_view('r1', 't1')['generations']
    assert [g['initialObservationTokens'] for g in view] == [record.observation_tokens, None]
    assert view[1]['observationTokens'] == history[1].observation_tokens > view[0]['initialObservationTokens']


def test_reflection_that_cannot_shrink_backs_off_until_log_grows():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    long_obs = (
        '<observations>\nDate: Jan 1, 2025\n'
        + '\n'.join(f'* 🟡 (09:{i:02d}) User mentioned detail number {i}' for i in range(12))
        + '\n</observations>'
    )
    h.model.script('observer', long_obs)
    # The reflector only ever answers with something larger than its input.
    h.model.script('reflector', *[long_obs + '\n* extra line'] * 4)
    h.step(h.user(words(60)))
    result = h.step(h.user('next'))
    assert len(h.model.calls_for('reflector')) == 4
    failed = [
        p
        for p in result.parts.to_json()
        if p['type'] == 'data-om-observation-failed' and p['data']['reason'] == 'not_smaller'
    ]
    assert failed
    record = h.record()
    assert record.generation == 0 and record.reflection_stalled_at_tokens == record.observation_tokens
    # Next step: the log has not changed, so no reflector call.
    h.step(h.user('short'))
    assert len(h.model.calls_for('reflector')) == 4


def test_disabled_memory_returns_recent_messages_only():
    h = Harness({'enabled': False})
    for _ in range(15):
        result = h.step(h.user('hi'))
    assert len(result.messages) == 10 and not result.parts
    assert h.model.calls == []


@pytest.mark.parametrize(('last_messages', 'shown'), [(3, ['u13', 'u14', 'u15']), (False, ['u15']), (0, ['u15'])])
def test_seed003_last_messages_sets_the_history_a_step_includes(last_messages, shown):
    # Given message history without observational memory and `lastMessages` (seed 003)
    h = Harness({'enabled': False, 'lastMessages': last_messages})
    for _ in range(15):
        result = h.step(h.user('hi'))
    # Then a step includes that many recent messages (`false`: no history), and always its own input
    assert [m.id for m in result.messages] == shown


# -- background work: deferral, hand-off, the reflection workflow ------------------------------------------------


def with_work(h: Harness):
    from om_lib.work import CollectingWork

    work = CollectingWork()
    h.engine.work = work
    return work


def test_observation_that_would_overrun_the_budget_is_deferred_to_the_worker():
    h = Harness(config(), budget=0.5)
    work = with_work(h)
    h.step(h.user(words(150), mid='m1'))
    result = h.step(h.user('next', mid='m2'))
    failed = [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed and failed[0]['data']['reason'] == 'deferred'
    assert h.model.calls == []  # not even started: too little time left
    assert [j.kind for j in work.jobs] == ['observe']
    assert [m.id for m in result.messages] == ['m1', 'm2']
    # The worker finishes it.
    h.model.script('observer', OBS_A)
    h.engine.run_job(work.jobs[0])
    assert h.record().cursor('t1') == 2 and 'Lisbon' in h.record().active_observations


def test_slow_observer_past_the_deadline_is_deferred_and_nothing_is_lost():
    h = Harness(config(), budget=10.0)
    work = with_work(h)

    def slow(request):
        h.clock.advance(30)  # the model takes longer than the request may wait
        raise __import__('om_lib.errors', fromlist=['DeadlineExceededError']).DeadlineExceededError('too slow')

    h.model.script('observer', slow)
    h.step(h.user(words(150), mid='m1'))
    result = h.step(h.user('next', mid='m2'))
    failed = [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed and failed[-1]['data']['reason'] == 'deferred'
    assert h.record().observing is None and h.record().cursor('t1') == 0
    assert [j.kind for j in work.jobs] == ['observe']


def over_the_reflection_threshold(h: Harness, long_obs: str) -> Job:
    """Observations past `observationTokens`, observed by the worker (no reflection yet), and the workflow's job."""
    h.model.script('observer', long_obs)
    h.engine.complete_turn('r1', 't1', [h.user(words(60))])
    h.engine.observe_now('r1', 't1', reflect=False)
    assert h.model.calls_for('reflector') == []
    return Job('reflect', 'r1', 't1', 'thread:r1/t1', 'threshold')


def test_sync_mode_with_a_work_queue_reflects_inside_the_step():
    # Given bufferTokens: false and a work queue, and a step that makes the observations pass observationTokens
    h = Harness(config(message_tokens=50, observation_tokens=40))
    work = with_work(h)
    h.model.script('observer', LONG_OBS)
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User plans a trip\n</observations>')
    h.step(h.user(words(60)))
    result = h.step(h.user('next'))
    # Then the step observed and reflected before answering: the Actor gets the condensed log, nothing is queued
    assert len(h.model.calls_for('reflector')) == 1
    assert work.jobs == []
    assert h.record().generation == 1 and 'User plans a trip' in result.system
    assert [p['data']['operationType'] for p in result.parts.to_json() if p['type'] == 'data-om-observation-end'] == [
        'observation',
        'reflection',
    ]


def test_sync_mode_hands_reflection_to_the_workflow_when_the_budget_cannot_hold_it():
    h = Harness(config(message_tokens=50, observation_tokens=40), budget=1.5)
    work = with_work(h)
    h.model.script('observer', LONG_OBS)
    h.step(h.user(words(60)))
    h.step(h.user('next'))  # the observation uses the budget's first second: less than 2 s are left to reflect
    assert h.model.calls_for('reflector') == []
    assert [j.kind for j in work.jobs] == ['reflect']


LONG_OBS = (
    '<observations>\nDate: Jan 1, 2025\n'
    + '\n'.join(f'* 🟡 (09:{i:02d}) User mentioned detail number {i} about the trip' for i in range(12))
    + '\n</observations>'
)


def test_the_reflection_workflow_keeps_lines_appended_while_it_ran():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    # check → reflect → validate → commit, as the state machine runs them
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User plans a trip\n</observations>')
    assert h.engine.workflow_check(job, 'exec-1')['due'] is True
    assert h.engine.workflow_check(job, 'exec-2')['due'] is False  # one execution at a time
    # an observation lands while the reflection runs: its lines must survive the commit
    staged = h.engine.workflow_reflect(job, 'exec-1')
    assert staged['outcome'] == 'reflected' and staged['tokens'] < staged['inputTokens']
    record = h.record()
    late = record.active_observations + '\n* 🔴 (10:00) User added a late fact'
    h.store.put_record(record.model_copy(update={'active_observations': late}), expected_version=record.version)
    assert h.engine.workflow_validate(job, 'exec-1')['valid'] is True
    done = h.engine.workflow_commit(job, 'exec-1')
    assert done['outcome'] == 'committed' and done['generation'] == 1
    head = h.record()
    assert 'User plans a trip' in head.active_observations and 'late fact' in head.active_observations
    assert 'detail number 3' not in head.active_observations
    assert head.reflecting is None and head.buffered_reflection is None


def test_workflow_failure_path_keeps_old_observations():
    from om_lib.engine.engine import ReflectionRejectedError

    h = Harness(config(message_tokens=50, observation_tokens=40))
    with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    before = h.record().active_observations
    assert h.engine.workflow_check(job, 'exec-1')['due']
    h.model.script('reflector', *[ModelUnavailableError('503', status_code=503)] * 3)
    with pytest.raises(ModelUnavailableError):
        h.engine.workflow_reflect(job, 'exec-1')
    with pytest.raises(ReflectionRejectedError):
        h.engine.workflow_validate(job, 'exec-1')
    assert h.engine.workflow_release(job, 'exec-1') == {'released': True}
    record = h.record()
    assert record.active_observations == before and record.reflecting is None and record.generation == 0


def test_complete_turn_schedules_due_observation():
    h = Harness(config())
    work = with_work(h)
    h.step(h.user(words(20)))
    turn = h.engine.complete_turn('r1', 't1', [h.assistant(words(120))])
    assert turn.scheduled == ['observe'] and work.jobs[0].kind == 'observe'


def test_sweeper_observes_quiet_threads_and_clears_done_ones():
    h = Harness(config())
    work = with_work(h)
    h.step(h.user(words(10)), thread='quiet')  # below the threshold
    h.model.script('observer', OBS_A)
    h.step(h.user(words(150)), thread='busy')
    h.engine.complete_turn('r1', 'busy', [h.assistant('ok')])  # the turn queues the observation
    h.engine.run_job(work.jobs.pop())  # observed: nothing left to do
    assert h.engine.sweep(quiet_for=timedelta(minutes=30)) == []  # nothing is quiet yet
    h.clock.advance(timedelta(hours=1))
    jobs = h.engine.sweep(quiet_for=timedelta(minutes=30))
    assert [(j.kind, j.thread_id, j.reason) for j in jobs] == [('observe', 'quiet', 'stale')]
    assert work.jobs[-1] == jobs[0]  # submitted to the work queue
    # The worker observes the quiet thread; the next sweep finds nothing to do and clears it.
    h.model.script('observer', OBS_B)
    h.engine.run_job(jobs[0])
    assert h.record(thread='quiet').cursor('quiet') == 1
    assert h.engine.sweep(quiet_for=timedelta(minutes=30)) == []
    assert h.store.list_attention(quiet_since=h.clock.now()) == []


def test_the_memory_view_says_when_memory_will_act_and_the_sweeper_keeps_that_promise():
    from datetime import datetime

    h = Harness(config(message_tokens=100, observation_tokens=1000))
    with_work(h)
    h.engine.sweep_interval_s = 300.0  # the schedule, as deployed
    h.step(h.user(words(30)))
    h.engine.complete_turn('r1', 't1', [h.assistant(words(10))])
    said_at = h.store.get_thread('r1', 't1').updated_at
    view = h.engine.memory_view('r1', 't1')
    upcoming = view['upcoming']
    assert upcoming['observation'] == {'tokensLeft': 100 - view['pendingMessageTokens']}
    assert 0 < upcoming['observation']['tokensLeft'] < 100
    assert upcoming['reflection'] == {'tokensLeft': 1000}
    sweep = upcoming['quietSweep']
    quiet_at = datetime.fromisoformat(sweep['quietAt'].replace('Z', '+00:00'))
    assert sweep['quietAfterSeconds'] == 1800 and sweep['intervalSeconds'] == 300.0
    assert quiet_at == said_at + timedelta(minutes=30)
    assert datetime.fromisoformat(sweep['sweptBy'].replace('Z', '+00:00')) == quiet_at + timedelta(minutes=5)
    # Before quietAt the sweeper leaves the thread alone; once past it, it observes the thread below the threshold
    h.clock.advance(quiet_at - h.clock.now() - timedelta(seconds=30))
    assert h.engine.sweep() == []
    h.clock.advance(timedelta(seconds=60))
    assert [(j.kind, j.thread_id) for j in h.engine.sweep()] == [('observe', 't1')]
    # Nothing unobserved: no sweep to announce; past the threshold: 0 tokens left
    h.model.script('observer', OBS_A)
    h.engine.observe_now('r1', 't1')
    assert h.engine.memory_view('r1', 't1')['upcoming']['quietSweep']['quietAt'] is None
    h.step(h.user(words(150)))
    assert h.engine.memory_view('r1', 't1')['upcoming']['observation'] == {'tokensLeft': 0}


# -- review fixes: trouble after the save, leases, sweeper, ids ---------------------------------------------------


class BrokenQueue:
    def __init__(self) -> None:
        self.calls = 0

    def submit(self, job) -> None:
        from om_lib.errors import StorageError

        self.calls += 1
        raise StorageError('queue unavailable')


def test_a_broken_queue_never_turns_a_saved_step_into_an_error():
    h = Harness(config(message_tokens=50, observation_tokens=40), budget=0.5)
    queue = BrokenQueue()
    h.engine.work = queue
    h.step(h.user(words(80), mid='kept'))
    result = h.step(h.user('next', mid='also'))  # due, deferred, and the queue is down
    assert queue.calls >= 1
    assert [m.id for m in result.messages] == ['kept', 'also']
    assert any(p['type'] == 'data-om-observation-failed' for p in result.parts.to_json())
    assert [m.id for m in h.store.list_messages('r1', 't1').messages] == ['kept', 'also']


def test_storage_trouble_after_the_save_is_reported_in_the_answer():
    h = Harness(config())

    def broken(*_a, **_k):
        from om_lib.errors import StorageError

        raise StorageError('throttled')

    h.store.list_messages = broken  # the append works, the read after it fails
    result = h.step(h.user('hello', mid='saved'))
    assert [m.id for m in result.messages] == ['saved']
    failed = [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed and 'throttled' in failed[0]['data']['error']


def test_reflection_commit_keeps_a_running_observation_lease():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User plans a trip\n</observations>')
    assert h.engine.workflow_check(job, 'exec')['due']
    h.engine.workflow_reflect(job, 'exec')
    h.engine.workflow_validate(job, 'exec')
    record = h.record()
    running = Lease(owner='a-step', expires_at=h.clock.now() + timedelta(minutes=1))
    h.store.put_record(record.model_copy(update={'observing': running}), expected_version=record.version)
    h.engine.workflow_commit(job, 'exec')
    assert h.record().observing == running and h.record().generation == 1


def test_sweeper_does_not_loop_on_a_tool_call_waiting_for_its_result():
    h = Harness(config())
    with_work(h)
    call = Message.model_validate(
        {
            'id': 'call',
            'role': 'assistant',
            'createdAt': h.clock.now().isoformat(),
            'parts': [{'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'search', 'args': {}}],
        }
    )
    h.step(h.user('look this up'))
    h.engine.complete_turn('r1', 't1', [call])
    h.clock.advance(timedelta(hours=1))
    assert h.engine.sweep() == []
    assert h.store.list_attention(quiet_since=h.clock.now()) == []


def test_ids_with_a_slash_are_refused_before_anything_is_written():
    from om_lib.errors import InvalidInputError

    h = Harness(config())
    with pytest.raises(InvalidInputError, match='/'):
        h.engine.prepare_step('a/b', 'c', [h.user('hi')])
    assert h.store.get_thread('a/b', 'c') is None


# -- background outcomes reach the next step, exactly once (issue 21 item 13) ------------------------------------------
def test_the_reflection_workflow_outcome_reaches_the_next_step_once():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) User plans a trip\n</observations>')
    # The workflow runs (Step Functions in AWS): check → reflect → validate → commit
    assert h.engine.workflow_check(job, 'exec-7')['due']
    h.engine.workflow_reflect(job, 'exec-7')
    h.engine.workflow_validate(job, 'exec-7')
    h.engine.workflow_commit(job, 'exec-7')
    # The client's next step hears of it: a reflection cycle named after the execution, its new log included
    parts = h.step(h.user('hello')).parts.to_json()
    cycle = [(p['type'], p['data']['operationType']) for p in parts if p['data'].get('cycleId') == 'exec-7']
    assert cycle == [('data-om-observation-start', 'reflection'), ('data-om-observation-end', 'reflection')]
    end = next(p['data'] for p in parts if p['type'] == 'data-om-observation-end')
    assert 'User plans a trip' in end['observations'] and end['tokensObserved'] > 0
    # and only once
    assert not [p for p in h.step(h.user('again')).parts.to_json() if p['data'].get('cycleId') == 'exec-7']


def test_a_workflow_run_that_cannot_shrink_the_log_reaches_the_next_step_and_recent_failures():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    h.model.script('reflector', *[LONG_OBS + '\n* extra line'] * 4)  # never smaller than its input
    assert h.engine.workflow_check(job, 'exec-9')['due']
    assert h.engine.workflow_reflect(job, 'exec-9')['outcome'] == 'not_smaller'
    parts = h.step(h.user('hello')).parts.to_json()
    cycle = [(p['type'], p['data'].get('reason')) for p in parts if p['data'].get('cycleId') == 'exec-9']
    assert cycle == [('data-om-observation-start', None), ('data-om-observation-failed', 'not_smaller')]
    failures = h.engine.memory_view('r1', 't1')['recentFailures']
    assert [(f['operationType'], f['reason']) for f in failures] == [('reflection', 'not_smaller')]
    assert h.record().generation == 0


def test_a_failed_workflow_run_and_a_worker_observation_reach_the_next_step_once():
    h = Harness(config(message_tokens=50, observation_tokens=40))
    work = with_work(h)
    job = over_the_reflection_threshold(h, LONG_OBS)
    h.model.script('reflector', *[ModelUnavailableError('503', status_code=503)] * 4)
    assert h.engine.workflow_check(job, 'exec-8')['due']
    with pytest.raises(ModelUnavailableError):
        h.engine.workflow_reflect(job, 'exec-8')
    h.engine.workflow_release(job, 'exec-8')
    # The Reflector's 503s opened the model's circuit; the worker runs once its cool-down has passed
    h.clock.advance(timedelta(seconds=10))
    # A worker's observation too (the turn queued it)
    h.model.script('observer', OBS_B)
    h.engine.complete_turn('r1', 't1', [h.assistant(words(80))])
    h.engine.run_job(next(j for j in work.jobs if j.kind == 'observe'))
    step = h.step(h.user('hi'))
    parts = step.parts.to_json()
    # What the step delivers was counted where it was made: the step's metrics see only its own parts
    own = step.parts.made_here()
    # (this step's own reflection, once the backoff has passed, is its own: the worker's observation is not)
    observed_here = [p for p in own if p['type'].endswith('-end') and p['data']['operationType'] == 'observation']
    assert own and not [p for p in own if p['data'].get('cycleId') == 'exec-8'] and not observed_here
    failed = [p['data'] for p in parts if p['type'] == 'data-om-observation-failed']
    failed = [f for f in failed if f['cycleId'] == 'exec-8']
    assert [(f['operationType'], f['reason']) for f in failed] == [('reflection', 'error')]
    ended = [p['data'] for p in parts if p['type'] == 'data-om-observation-end']
    ended = [e for e in ended if e['operationType'] == 'observation']
    assert len(ended) == 1 and 'trains to Porto' in ended[0]['observations']
    assert not [p for p in h.step(h.user('hi again')).parts.to_json() if p['type'] != 'data-om-status']
