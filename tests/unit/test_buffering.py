"""Async buffering (issue 5): the pure activation math (spec §25 F, §11) and the engine's buffering lifecycle over the
in-memory store, a scripted model and a collecting work queue (jobs run by the test, as the worker would)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.observation import buffering as buf
from om_lib.records import BufferedChunk
from om_lib.work import CollectingWork, Job
from tests.fakes.scripted_model import ScriptedModel

T0 = datetime(2025, 1, 1, 9, 0, tzinfo=UTC)


def chunk(n: int, message_tokens: int, *, start: int, end: int, task: str | None = None) -> BufferedChunk:
    return BufferedChunk(
        id=f'ombuf-{n}',
        cycle_id=f'buffer-obs-{n}',
        thread_id='t1',
        observations=f'* 🟡 (09:0{n}) chunk {n}',
        token_count=5,
        message_ids=tuple(f'm{i}' for i in range(start, end + 1)),
        message_tokens=message_tokens,
        start_seq=start,
        end_seq=end,
        last_observed_at=T0 + timedelta(minutes=n),
        created_at=T0,
        current_task=task,
    )


# -- pure activation math ---------------------------------------------------------------------------------------------
def test_f34_activation_is_skipped_when_it_would_leave_far_more_than_the_floor() -> None:
    # messageTokens 30000, bufferTokens 6000, absolute retention 2000, three chunks of 3000, pending 30000
    count = buf.plan_activation(
        [3000, 3000, 3000], pending=30000, threshold=30000, buffer_activation=2000, buffer_tokens=6000, block_after=None
    )
    assert count == 0


def test_activation_plan_follows_the_storage_rule_and_force_max() -> None:
    # Ratio 0.5 of 10000: the floor is 5000, target 5000 → 3000 + 3000 is the first boundary over it.
    plan = {'pending': 10000, 'threshold': 10000, 'buffer_activation': 0.5, 'buffer_tokens': 2000, 'block_after': 12000}
    assert buf.plan_activation([3000, 3000, 4000], **plan) == 2
    # Below the threshold nothing activates, and there is nothing to activate without chunks.
    assert buf.plan_activation([3000], **{**plan, 'pending': 9999}) == 0
    assert buf.plan_activation([], **plan) == 0
    # Past blockAfter the skip rule is off: even a far-from-floor activation goes ahead.
    far = {'threshold': 30000, 'buffer_activation': 2000, 'buffer_tokens': 6000, 'block_after': 36000}
    assert buf.plan_activation([3000, 3000, 3000], pending=30000, **far) == 0
    assert buf.plan_activation([3000, 3000, 3000], pending=36000, **far) == 3


def test_activate_chunks_appends_after_a_boundary_moves_the_cursor_and_takes_the_last_hints() -> None:
    chunks = (
        chunk(1, 300, start=1, end=3, task='old task'),
        chunk(2, 300, start=4, end=6),
        chunk(3, 300, start=7, end=9),
    )
    act = buf.activate_chunks('* 🔴 earlier', chunks, 2, cursor=0, last_observed_at=None)
    assert act.active_observations == (
        '* 🔴 earlier\n\n--- message boundary (2025-01-01T09:02:00.000Z) ---\n\n'
        '* 🟡 (09:01) chunk 1\n\n* 🟡 (09:02) chunk 2'
    )
    assert act.cursor == 6
    assert act.last_observed_at == T0 + timedelta(minutes=2)
    assert [c.id for c in act.remaining] == ['ombuf-3']
    assert act.message_tokens == 600 and act.observation_tokens == 10
    assert act.message_ids == ['m1', 'm2', 'm3', 'm4', 'm5', 'm6']
    # Hints come from the last activated chunk only: it has none, so none (the engine then keeps the thread's).
    assert act.current_task is None
    # The cursor and lastObservedAt never move backward; an empty log gets the content alone.
    late = T0 + timedelta(hours=1)
    act = buf.activate_chunks('', chunks, 1, cursor=50, last_observed_at=late)
    assert act.active_observations == '* 🟡 (09:01) chunk 1'
    assert act.cursor == 50 and act.last_observed_at == late
    assert act.current_task == 'old task'


def test_slices_are_disjoint_and_stale_chunks_are_dropped() -> None:
    chunks = (chunk(1, 300, start=1, end=3), chunk(2, 300, start=4, end=6))
    assert buf.slice_start(0, chunks) == 7
    assert buf.slice_start(9, chunks) == 10
    assert buf.slice_start(0, ()) == 1
    assert [c.id for c in buf.live_chunks(chunks, 3)] == ['ombuf-2']


def test_a_chunk_the_cursor_stops_inside_is_dropped_with_every_later_chunk() -> None:
    # A synchronous observation of seqs 1-8 while chunks [1-10] and [11-12] were buffered: activating [11-12] would
    # move the cursor over 9-10, which no chunk covers. Both go; the next slice starts right after the cursor.
    chunks = (chunk(1, 300, start=1, end=10), chunk(2, 300, start=11, end=12))
    assert buf.live_chunks(chunks, 8) == ()
    assert buf.slice_start(8, buf.live_chunks(chunks, 8)) == 9
    assert [c.id for c in buf.live_chunks(chunks, 10)] == ['ombuf-2']
    assert buf.live_chunks(chunks, 12) == ()


def test_should_buffer_crosses_intervals_and_treats_a_stale_boundary_as_current() -> None:
    assert buf.should_buffer(5000, 0, 10000, 100000) is False
    assert buf.should_buffer(10000, 0, 10000, 100000) is True
    assert buf.should_buffer(12000, 10000, 10000, 100000) is False
    # The window shrank below the last boundary: no job until a fresh interval is crossed.
    assert buf.should_buffer(3000, 25000, 10000, 100000) is False


def test_projected_removal_matches_the_status_rule() -> None:
    chunks = (chunk(1, 3000, start=1, end=3), chunk(2, 3000, start=4, end=6), chunk(3, 4000, start=7, end=9))
    assert buf.projected_removal(chunks, 0.5, 10000, 10000) == 6000
    assert buf.projected_removal((), 0.5, 10000, 10000) == 0


def test_g44_reflection_slice() -> None:
    text = '\n'.join(f'line {i}' for i in range(300))
    part = buf.reflection_slice(text, 30000, 40000, 0.5)
    assert part.line_count == 200
    assert part.input_tokens == 20000
    assert part.target_tokens == 15000
    assert part.text.split('\n')[-1] == 'line 199'


# -- the engine -------------------------------------------------------------------------------------------------------
class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def words(n: int, tag: str = 'w') -> str:
    return ' '.join(f'{tag}{i}' for i in range(n))


OBS = '<observations>\nDate: Jan 1, 2025\n* 🟡 (09:00) User talked about {n}\n</observations>\n'
HINTS = '<current-task>\nPrimary: task {n}\n</current-task>'


def observer_answer(request) -> str:
    n = sum(1 for c in request.source_messages or ())
    return OBS.format(n=n) + HINTS.format(n=n)


class Harness:
    def __init__(self, config: dict, *, work: bool = True) -> None:
        self.clock = ManualClock(tick=timedelta(seconds=1))
        self.store = InMemoryStore()
        self.model = ScriptedModel(fallback=observer_answer)
        router = ModelRouter({'google': self.model}, clock=self.clock, sleep=lambda s: self.clock.advance(s))
        self.counter = TokenCounter(WordTokenizer())
        self.work = CollectingWork() if work else None
        self.engine = MemoryEngine(
            OMConfig.model_validate(config),
            store=self.store,
            router=router,
            counter=self.counter,
            clock=self.clock,
            work=self.work,
        )
        self.n = 0

    def user(self, text: str) -> Message:
        self.n += 1
        return Message.model_validate(
            {'id': f'u{self.n}', 'role': 'user', 'createdAt': self.clock.now().isoformat(), 'content': text}
        )

    def assistant(self, text: str) -> Message:
        self.n += 1
        return Message.model_validate(
            {'id': f'a{self.n}', 'role': 'assistant', 'createdAt': self.clock.now().isoformat(), 'content': text}
        )

    def turn(self, user_words: int = 100, assistant_words: int = 100):
        calls = len(self.model.calls)
        result = self.engine.prepare_step('r1', 't1', [self.user(words(user_words))])
        assert len(self.model.calls) == calls, 'a step with buffering on must not call a model'
        self.engine.complete_turn('r1', 't1', [self.assistant(words(assistant_words))])
        return result

    def jobs(self, kind: str) -> list[Job]:
        assert self.work is not None
        return [j for j in self.work.jobs if j.kind == kind]

    def run_jobs(self) -> None:
        assert self.work is not None
        while self.work.jobs:
            job = self.work.jobs.pop(0)
            self.engine.run_job(job)

    def record(self):
        return self.store.get_record('thread:r1/t1')


def buffering_config(**observation) -> dict:
    return {
        'model': 'default',
        'observation': {'messageTokens': 1000, 'bufferTokens': 200, 'bufferActivation': 0.8, **observation},
        'reflection': {'observationTokens': 100000},
    }


def test_steps_queue_buffer_jobs_and_never_call_the_model() -> None:
    h = Harness(buffering_config())
    result = h.turn()
    assert h.model.calls == []
    # ~208 pending tokens crossed the first 200-token interval: one job for the slice, announced to the client.
    jobs = h.jobs('buffer')
    assert len(jobs) == 1 and jobs[0].start_seq == 1
    assert 'data-om-buffering-start' not in [p['type'] for p in result.parts.to_json()]
    h.run_jobs()
    record = h.record()
    assert len(record.buffered_chunks) == 1
    assert record.active_observations == ''
    assert len(h.model.calls_for('observer')) == 1
    # The chunk is not active: the Actor still sees every message, and the status shows it staged.
    result = h.turn()
    status = result.parts.to_json()[-1]['data']['windows']['buffered']['observations']
    assert status['chunks'] == 1 and status['status'] in ('complete', 'running')
    assert {'u1', 'a2', 'u3'} <= {m.id for m in result.messages}


def test_consecutive_chunks_are_disjoint_activation_needs_no_model_call_and_loses_nothing() -> None:
    h = Harness(buffering_config())
    for _ in range(5):
        h.turn()
        h.run_jobs()
    record = h.record()
    ranges = [(c.start_seq, c.end_seq) for c in record.buffered_chunks]
    assert ranges == sorted(ranges)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    calls = len(h.model.calls)
    result = h.engine.prepare_step('r1', 't1', [h.user(words(100))])  # pending passes 1000 on this step
    assert len(h.model.calls) == calls
    record = h.record()
    activations = [p for p in result.parts.to_json() if p['type'] == 'data-om-activation']
    assert activations, [p['type'] for p in result.parts.to_json()]
    assert activations[0]['data']['operationType'] == 'observation'
    assert record.active_observations.strip()
    assert 'User talked about' in result.system
    # The activated messages left the context; nothing else did.
    cursor = record.cursor('t1')
    assert cursor > 0
    assert all((m.seq or 0) > cursor or m.id == result.messages[-1].id for m in result.messages if m.seq)
    # Hints from the last activated chunk reached the thread (they survive activation).
    assert h.store.get_thread('r1', 't1').current_task
    # Every message is either observed (cursor) or still visible.
    seen = {m.id for m in result.messages}
    all_messages = h.store.list_messages('r1', 't1', limit=1000).messages
    assert all((m.seq or 0) <= cursor or m.id in seen for m in all_messages)


def test_a_job_delivered_twice_makes_one_chunk() -> None:
    h = Harness(buffering_config())
    h.turn()
    job = h.jobs('buffer')[0]
    h.engine.run_job(job)
    h.engine.run_job(job)
    assert len(h.record().buffered_chunks) == 1
    assert len(h.model.calls_for('observer')) == 1


class CrashOnce(Exception):
    pass


def test_a_worker_dying_after_the_model_call_is_rerun_and_makes_one_chunk(monkeypatch) -> None:
    h = Harness(buffering_config())
    h.turn()
    job = h.jobs('buffer')[0]
    real_put = h.store.put_record
    crashed = []

    def dying_put(record, *, expected_version):
        if record.buffered_chunks and not crashed:
            crashed.append(True)
            raise CrashOnce('the worker died before its write')
        return real_put(record, expected_version=expected_version)

    monkeypatch.setattr(h.store, 'put_record', dying_put)
    with pytest.raises(CrashOnce):
        h.engine.run_job(job)
    assert h.record().buffered_chunks == ()
    h.engine.run_job(job)  # SQS redelivers it
    assert len(h.record().buffered_chunks) == 1
    assert len(h.model.calls_for('observer')) == 2


def test_a_failed_buffering_call_reports_a_part_and_keeps_the_messages() -> None:
    h = Harness(buffering_config())
    h.turn()
    h.model.script('observer', '', '')  # unusable twice: the call counts as failed
    parts = h.engine.run_job(h.jobs('buffer')[0]).to_json()
    assert [p['type'] for p in parts] == ['data-om-buffering-failed']
    assert parts[0]['data']['reason'] == 'invalid_output'
    assert h.record().buffered_chunks == ()


def test_block_after_observes_synchronously_as_a_last_resort() -> None:
    h = Harness(buffering_config(blockAfter=1.2))
    # Jobs are never run (the worker is down): pending grows past 1200 with nothing buffered.
    for _ in range(5):
        h.engine.prepare_step('r1', 't1', [h.user(words(100))])
        h.engine.complete_turn('r1', 't1', [h.assistant(words(100))])
    assert h.model.calls == []
    h.work.jobs.clear()
    result = h.engine.prepare_step('r1', 't1', [h.user(words(200))])
    types = [p['type'] for p in result.parts.to_json()]
    assert 'data-om-observation-end' in types
    assert h.record().cursor('t1') > 0


def test_without_a_work_queue_buffering_falls_back_to_synchronous_observation() -> None:
    h = Harness(buffering_config(), work=False)
    for _ in range(5):
        h.engine.prepare_step('r1', 't1', [h.user(words(100))])
        h.engine.complete_turn('r1', 't1', [h.assistant(words(100))])
    assert h.model.calls == []
    # What came before this step's input passed messageTokens: the step observes it
    result = h.engine.prepare_step('r1', 't1', [h.user(words(20))])
    assert 'data-om-observation-end' in [p['type'] for p in result.parts.to_json()]


def test_the_worker_observation_activates_chunks_first_and_then_observes_the_rest() -> None:
    h = Harness(buffering_config())
    h.turn()
    h.run_jobs()
    h.engine.prepare_step('r1', 't1', [h.user(words(30))])
    _, parts = h.engine.observe_now('r1', 't1')
    parts = parts.to_json()
    types = [p['type'] for p in parts]
    assert types.index('data-om-activation') < types.index('data-om-observation-end')
    record = h.record()
    assert record.buffered_chunks == ()
    assert record.cursor('t1') == 3


def reflection_config() -> dict:
    return {
        'model': 'default',
        'observation': {'messageTokens': 1000, 'bufferTokens': 200},
        'reflection': {'observationTokens': 50, 'bufferActivation': 0.5},
    }


def test_buffered_reflection_starts_early_activates_at_the_threshold_and_keeps_later_lines() -> None:
    h = Harness(reflection_config())
    lines = [f'* 🟡 (09:{i:02d}) fact number {i} about the plan' for i in range(6)]
    record = h.engine.rt.writer.get_or_create('thread', 'r1', 't1')
    text = '\n'.join(lines[:4])
    record = h.store.put_record(
        record.model_copy(
            update={'active_observations': text, 'observation_tokens': h.counter.count_observations(text)}
        ),
        expected_version=record.version,
    )
    assert 25 <= record.observation_tokens <= 50
    h.model.script('reflector', '<observations>\n* 🟡 (09:00) facts 0-1 condensed\n</observations>')
    h.turn(user_words=5, assistant_words=5)
    jobs = h.jobs('reflect')
    assert len(jobs) == 1 and jobs[0].reason == 'buffer'
    h.work.jobs.clear()
    h.engine.run_job(jobs[0])
    staged = h.record()
    assert staged.buffered_reflection and staged.reflected_line_count
    covered = staged.reflected_line_count
    # Lines appended after the reflection started; then observations pass the threshold.
    more = staged.active_observations + '\n' + '\n'.join(lines[4:]) + '\n* 🔴 (10:00) appended later'
    staged = h.store.put_record(
        staged.model_copy(
            update={
                'active_observations': more,
                'observation_tokens': h.counter.count_observations(more),
                'buffered_chunks': (chunk(1, 10, start=100, end=101),),
            }
        ),
        expected_version=staged.version,
    )
    assert staged.observation_tokens > 50
    calls = len(h.model.calls)
    result = h.engine.prepare_step('r1', 't1', [h.user('hello')])
    assert len(h.model.calls) == calls
    activation = [p for p in result.parts.to_json() if p['type'] == 'data-om-activation']
    assert activation and activation[0]['data']['operationType'] == 'reflection'
    # The activation carries the cycle id of the buffering that staged it, and the staging's end part reached
    # the client with the step's answer.
    assert activation[0]['data']['cycleId'] == jobs[0].cycle_id
    ended = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-buffering-end']
    assert [(d['cycleId'], d['operationType']) for d in ended] == [(jobs[0].cycle_id, 'reflection')]
    assert ended[0]['bufferedTokens'] < ended[0]['tokensBuffered']
    head = h.record()
    assert head.generation == staged.generation + 1
    assert head.active_observations.startswith('* 🟡 (09:00) facts 0-1 condensed')
    for line in more.split('\n')[covered:]:
        assert line.strip() in head.active_observations
    for line in more.split('\n')[:covered]:
        assert line not in head.active_observations
    # Chunks buffered before the reflection are carried into the new generation.
    assert [c.id for c in head.buffered_chunks] == ['ombuf-1']


def test_status_reports_the_buffered_windows() -> None:
    h = Harness(buffering_config())
    h.turn()
    h.run_jobs()
    result = h.engine.prepare_step('r1', 't1', [h.user(words(10))])
    buffered = result.parts.to_json()[-1]['data']['windows']['buffered']
    assert buffered['observations']['chunks'] == 1
    assert buffered['observations']['messageTokens'] > 0
    assert buffered['observations']['observationTokens'] > 0
    assert 'projectedMessageRemoval' in buffered['observations']
    assert buffered['reflection'] == {'inputObservationTokens': 0, 'observationTokens': 0, 'status': 'idle'}
    view = h.engine.memory_view('r1', 't1')
    assert view['buffered']['observations']['chunks'] == 1


def test_messages_inside_a_straddled_chunk_are_observed_not_skipped() -> None:
    h = Harness(buffering_config(messageTokens=100000))
    for _ in range(6):
        h.engine.prepare_step('r1', 't1', [h.user(words(50, 'early'))])
        h.engine.complete_turn('r1', 't1', [h.assistant(words(50, 'late'))])
    h.work.jobs.clear()
    stored = h.store.list_messages('r1', 't1', limit=100).messages
    assert [m.seq for m in stored] == list(range(1, 13))
    # The state a synchronous observation of 1-8 left behind while chunks [1-10] and [11-12] were buffered.
    record = h.record()
    straddled = (chunk(1, 500, start=1, end=10), chunk(2, 100, start=11, end=12))
    h.store.put_record(
        record.model_copy(update={'buffered_chunks': straddled, 'cursors': {'t1': 8}}), expected_version=record.version
    )
    h.engine.observe_now('r1', 't1')
    observed = {m.id for c in h.model.calls_for('observer') for m in c.request.source_messages or ()}
    assert {stored[8].id, stored[9].id} <= observed  # seqs 9 and 10 reached the Observer
    assert h.record().cursor('t1') == 12


def test_the_next_step_answers_the_workers_end_part_once_with_its_observations() -> None:
    h = Harness(buffering_config())
    h.turn()
    job = h.jobs('buffer')[0]
    h.run_jobs()
    assert h.record().buffering_observation is None  # the running hint is cleared by the worker's write
    result = h.engine.prepare_step('r1', 't1', [h.user(words(10))])
    ended = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-buffering-end']
    assert len(ended) == 1 and ended[0]['cycleId'] == job.cycle_id
    chunk_ = h.record().buffered_chunks[0]
    assert ended[0]['observations'] == chunk_.observations
    assert ended[0]['bufferedTokens'] == chunk_.token_count and ended[0]['tokensBuffered'] == chunk_.message_tokens
    again = h.engine.prepare_step('r1', 't1', [h.user(words(10))])
    assert not [p for p in again.parts.to_json() if p['type'] == 'data-om-buffering-end']


def test_a_failed_job_is_answered_to_the_next_step_and_its_running_status_cleared() -> None:
    h = Harness(buffering_config())
    h.turn()
    job = h.jobs('buffer')[0]
    assert h.record().buffering_observation is not None
    h.model.script('observer', '', '')
    h.run_jobs()
    assert h.record().buffering_observation is None
    result = h.engine.prepare_step('r1', 't1', [h.user(words(10))])
    failed = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-buffering-failed']
    assert len(failed) == 1 and failed[0]['cycleId'] == job.cycle_id and failed[0]['error']
    assert failed[0]['observations'] == ''  # the seed's field: no partial content from a failed call
    status = result.parts.to_json()[-1]['data']['windows']['buffered']['observations']
    assert status['status'] == 'idle'


def test_a_running_background_reflection_does_not_block_the_synchronous_one_past_block_after() -> None:
    config = reflection_config()
    config['reflection']['blockAfter'] = 1.2
    h = Harness(config)
    record = h.engine.rt.writer.get_or_create('thread', 'r1', 't1')
    text = '\n'.join(f'* 🟡 (09:{i:02d}) fact number {i} about the plan' for i in range(8))
    record = h.store.put_record(
        record.model_copy(
            update={'active_observations': text, 'observation_tokens': h.counter.count_observations(text)}
        ),
        expected_version=record.version,
    )
    assert record.observation_tokens >= 60  # past blockAfter (1.2 × 50)
    # A background reflection took its lease and is still running (its worker is slow: the lease lasts ~11 min).
    job = Job('reflect', 'r1', 't1', record.key, 'buffer', cycle_id='buffer-refl-slow')
    assert h.engine.workflow_check(job, 'execution-1')['due'] is True
    assert h.record().buffering_reflection.owner == 'execution-1'
    h.model.script('reflector', '<observations>\n* 🟡 (09:00) the plan, condensed\n</observations>')
    result = h.engine.prepare_step('r1', 't1', [h.user('hello')])
    assert h.model.calls_for('reflector'), [p['type'] for p in result.parts.to_json()]
    head = h.record()
    assert head.generation == record.generation + 1
    # The slow run's result can no longer be staged on the old generation.
    assert h.engine.workflow_reflect(job, 'execution-1')['outcome'] == 'lease_lost'


def test_a_synchronous_observation_past_block_after_keeps_the_retention_floor_in_context() -> None:
    h = Harness(buffering_config(blockAfter=1.2))
    for _ in range(6):
        h.engine.prepare_step('r1', 't1', [h.user(words(100))])
        h.engine.complete_turn('r1', 't1', [h.assistant(words(100))])
    h.work.jobs.clear()
    result = h.engine.prepare_step('r1', 't1', [h.user(words(30))])
    assert 'data-om-observation-end' in [p['type'] for p in result.parts.to_json()]
    cursor = h.record().cursor('t1')
    raw = [m for m in result.messages if m.id != 'om-continuation']
    # floor = 1000 × (1 − 0.8) = 200 tokens: the newest observed messages stay until the window holds it.
    kept = [m for m in raw if (m.seq or 0) <= cursor and m.role == 'assistant']
    assert kept and h.counter.count_messages(raw) >= 200
    assert h.counter.count_messages([m for m in raw if m not in kept]) < 200


def test_failed_reflection_runs_back_off_instead_of_starting_on_every_step() -> None:
    h = Harness(
        {
            'model': 'default',
            'observation': {'messageTokens': 100000, 'bufferTokens': False},
            'reflection': {'observationTokens': 50},
        }
    )
    record = h.engine.rt.writer.get_or_create('thread', 'r1', 't1')
    text = '\n'.join(f'* 🟡 (09:{i:02d}) fact number {i} about the plan' for i in range(8))
    h.store.put_record(
        record.model_copy(
            update={'active_observations': text, 'observation_tokens': h.counter.count_observations(text)}
        ),
        expected_version=record.version,
    )

    def reflect_jobs_after_a_step() -> list[Job]:
        # A turn queues the workflow when reflection is due (the step would reflect in the request: sync mode).
        h.work.jobs.clear()
        h.engine.complete_turn('r1', 't1', [h.assistant('hi')])
        return h.jobs('reflect')

    def fail(job: Job, owner: str) -> None:
        assert h.engine.workflow_check(job, owner)['due'] is True
        h.engine.workflow_release(job, owner)  # the state machine's catch, after the model's retries ran out

    job = reflect_jobs_after_a_step()[0]
    fail(job, 'ex-1')
    assert reflect_jobs_after_a_step() == []  # backing off: no execution per step while the model is down
    h.clock.advance(timedelta(seconds=35))
    job = reflect_jobs_after_a_step()[0]
    fail(job, 'ex-2')
    assert h.record().reflection_failures == 2
    h.clock.advance(timedelta(seconds=35))
    assert reflect_jobs_after_a_step() == []  # the second failure doubled the wait to 60 s
    h.clock.advance(timedelta(seconds=35))
    job = reflect_jobs_after_a_step()[0]
    # The model is back: the run commits and the backoff is forgotten.
    h.model.script('reflector', '<observations>\n* 🟡 (09:00) the plan, condensed\n</observations>')
    assert h.engine.workflow_check(job, 'ex-3')['due'] is True
    assert h.engine.workflow_reflect(job, 'ex-3')['outcome'] == 'reflected'
    h.engine.workflow_validate(job, 'ex-3')
    assert h.engine.workflow_commit(job, 'ex-3')['outcome'] == 'committed'
    head = h.record()
    assert head.reflection_failures is None and head.reflection_retry_at is None
