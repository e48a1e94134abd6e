"""Resource scope in the engine: one memory across a resource's threads (in-memory store, scripted model)."""

from __future__ import annotations

import re

from om_lib.errors import ModelRequestError
from om_lib.llm import ModelRequest
from om_lib.observation.resource_scope import shown_thread_id
from om_lib.work import CollectingWork
from tests.fakes.scripted_model import ScriptedModel
from tests.unit.test_engine import Harness, words

THREAD_INPUT = re.compile(r'<thread id="([^"]+)">\n(.*?)\n</thread>', re.DOTALL)


def echo_observer(request: ModelRequest) -> str:
    """A multi-thread Observer that records each thread's first user line, per thread, as the prompt asks."""
    prompt = request.contents[0].parts[0]
    assert isinstance(prompt, str)
    sections = []
    # Only the new messages: the previous observations above them hold `<thread>` sections too.
    new_messages = prompt.split('## New Message History to Observe', 1)[-1]
    for shown, transcript in THREAD_INPUT.findall(new_messages):
        said = next((line.split(': ', 1)[1] for line in transcript.splitlines() if line.startswith('User')), '?')
        sections.append(
            f'<thread id="{shown}">\nDate: Jan 1, 2025\n* 🔴 (09:00) User said: {said[:80]}\n'
            f'<current-task>\nPrimary: follow up on {said[:20]}\n</current-task>\n</thread>'
        )
    return '<observations>\n' + '\n'.join(sections) + '\n</observations>'


def resource_config(message_tokens: int = 100, **observation) -> dict:
    return {
        'model': 'default',
        'scope': 'resource',
        'obscureThreadIds': False,
        'observation': {'messageTokens': message_tokens, **observation},
        'reflection': {'observationTokens': 10_000},
    }


def harness(config: dict, *, work: CollectingWork | None = None) -> Harness:
    h = Harness(config, model=ScriptedModel(fallback=echo_observer))
    if work is not None:
        h.engine.work = work
    return h


def record(h: Harness, resource: str = 'r1'):
    return h.store.get_record(f'resource:{resource}')


def test_a_fact_from_thread_a_reaches_thread_b_before_and_after_observation():
    h = harness(resource_config(message_tokens=60))
    # Given the user said something in thread A (below the threshold: nothing observed yet)
    h.step(h.user('I moved to Berlin last month ' + words(5)), thread='A')
    # When they step in thread B
    result = h.step(h.user('where do I live?'), thread='B')
    # Then B's Actor sees A's unobserved message as another conversation, and B's own message as history
    assert 'I moved to Berlin' in result.system and '<other-conversation id="A">' in result.system
    assert [m.id for m in result.messages] == ['u2']
    assert h.model.calls == []
    # When enough is said for an observation (A + B together pass 60 tokens)
    result = h.step(h.user(words(10, 'b')), thread='B')
    # Then one multi-thread Observer call observed both threads (B's new input is the message B's Actor answers: it
    # is observed later, never shown twice); the fact now lives in the shared observations
    assert len(h.model.calls_for('observer')) == 1
    head = record(h)
    assert '<thread id="A">' in head.active_observations and 'I moved to Berlin' in head.active_observations
    assert head.cursors == {'A': 1, 'B': 1}
    assert 'I moved to Berlin' in result.system and '<other-conversation' not in result.system
    assert [m.id for m in result.messages] == ['om-continuation', 'u3']
    # And each thread got its own continuation hints
    assert h.store.get_thread('r1', 'A').current_task.startswith('Primary: follow up on I moved')
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == ['B']


def test_two_resources_never_see_each_others_memory():
    h = harness(resource_config(message_tokens=30))
    h.step(h.user('alice secret ' + words(40)), thread='a1', resource='alice')
    h.step(h.user('and more'), thread='a1', resource='alice')
    result = h.step(h.user('hello'), thread='b1', resource='bob')
    assert 'alice secret' not in result.system
    assert 'alice secret' in record(h, 'alice').active_observations
    assert record(h, 'bob') is None or 'alice' not in record(h, 'bob').active_observations
    for call in h.model.calls:
        assert 'bob' not in str(call.request.contents) or 'alice' not in str(call.request.contents)


def test_selection_observes_the_largest_threads_and_leaves_the_rest_pending_not_skipped():
    h = harness(resource_config(message_tokens=140, maxTokensPerBatch=10_000))
    # Messages saved by turns (a step never observes its own new input, so the content arrives through turns)
    h.engine.complete_turn('r1', 'small', [h.user('small thread ' + words(10))])
    h.engine.complete_turn('r1', 'big', [h.user('big one ' + words(60))])
    h.engine.complete_turn('r1', 'mid', [h.user('middle ' + words(45))])
    assert h.model.calls == []
    h.step(thread='mid')  # due now; big + mid reach the threshold without small
    head = record(h)
    assert set(head.cursors) == {'big', 'mid'}
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == ['small']
    # The small thread's message is not lost: it is still shown to the Actor elsewhere, and observed later
    result = h.step(h.user('hi'), thread='mid')
    assert 'small thread' in result.system
    h.engine.observe_now('r1', 'small')
    assert record(h).cursors['small'] == 1 and 'small thread' in record(h).active_observations


def test_batches_run_separately_and_a_failed_batch_keeps_its_threads_pending():
    model = ScriptedModel(fallback=echo_observer)
    h = Harness(resource_config(message_tokens=180, maxTokensPerBatch=80), model=model)
    h.step(h.user('first ' + words(50)), thread='t1')
    h.step(h.user('second ' + words(50)), thread='t2')
    h.engine.complete_turn('r1', 't3', [h.user('third ' + words(50))])
    assert model.calls == []
    # When the third thread's step makes it due, each thread is its own batch (80 tokens each at most), and one fails
    model.script('observer', ModelRequestError('scripted refusal'))
    result = h.step(thread='t3')
    assert len(model.calls_for('observer')) == 3
    observed = set(record(h).cursors)
    assert len(observed) == 2, record(h).cursors
    (left,) = {'t1', 't2', 't3'} - observed
    failed = [p for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert [p['data']['threadId'] for p in failed] == [left]
    # Then the failed thread stays pending (its messages are not skipped) and a later run observes it
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == [left]
    h.engine.observe_now('r1', left)
    assert set(record(h).cursors) == {'t1', 't2', 't3'}


def test_a_quiet_thread_is_observed_by_the_worker_below_the_threshold():
    work = CollectingWork()
    h = harness(resource_config(message_tokens=10_000), work=work)
    h.step(h.user('a quiet remark ' + words(5)), thread='quiet')
    assert record(h).cursors == {}
    parts = h.engine.run_job(work.jobs[0]).to_json() if work.jobs else None
    if parts is None:  # nothing queued below the threshold: the sweeper's job is the same observe job
        from om_lib.work import Job

        parts = h.engine.run_job(Job('observe', 'r1', 'quiet', 'resource:r1', 'sweep')).to_json()
    assert record(h).cursors == {'quiet': 1}
    assert any(p['type'] == 'data-om-observation-end' for p in parts)


def test_obscured_thread_ids_never_reach_the_models():
    h = harness({**resource_config(message_tokens=40), 'obscureThreadIds': True})
    h.step(h.user('project-atlas notes ' + words(10)), thread='project-atlas')
    result = h.step(h.user(words(40)), thread='other-thread')
    prompt = str(h.model.calls_for('observer')[0].request.contents)
    assert 'project-atlas"' not in prompt and 'other-thread' not in prompt
    shown = shown_thread_id('r1', 'project-atlas')
    assert f'<thread id="{shown}">' in record(h).active_observations
    assert record(h).cursors['project-atlas'] == 1  # cursors keep the real ids
    assert 'project-atlas"' not in result.system
    # Readers (GET /memory, the generations, the inspector) see the real ids in the sections
    for observations in (
        h.engine.memory_view('r1', 'other-thread')['observations'],
        h.engine.generations_view('r1', 'other-thread')['generations'][0]['observations'],
    ):
        assert '<thread id="project-atlas">' in observations and shown not in observations


def test_reflection_waits_for_older_unobserved_messages():
    work = CollectingWork()
    config = resource_config(message_tokens=40)
    config['reflection'] = {'observationTokens': 20}
    config['observation']['archive'] = {'afterTokens': 10_000}  # this test is about reflection, not the bound
    h = harness(config, work=work)
    h.step(h.user('older thread ' + words(5)), thread='old')
    h.engine.complete_turn('r1', 'new', [h.user(words(45))])
    h.step(thread='new')  # observes only the new thread: the log passes the reflection threshold
    assert set(record(h).cursors) == {'new'}
    # The old thread's message predates this cycle and is unobserved: reflection waits for it
    assert h.model.calls_for('reflector') == []
    h.engine.run_job(next(j for j in work.jobs if j.kind == 'observe')) if any(
        j.kind == 'observe' for j in work.jobs
    ) else h.engine.observe_now('r1', 'old', reflect=False)
    h.model.script('reflector', '<observations>\nDate: Jan 1, 2025\n* 🔴 (09:00) condensed\n</observations>')
    h.step(h.user('next'), thread='new')  # nothing older is pending now: the step reflects (sync mode)
    assert len(h.model.calls_for('reflector')) == 1 and record(h).generation == 1


def observed_pair(h: Harness) -> None:
    """Two threads of r1, both observed into the shared log."""
    h.step(h.user('keep this fact ' + words(30)), thread='keep')
    h.step(h.user('forget this fact ' + words(30)), thread='gone')
    h.engine.observe_now('r1', 'keep')
    assert set(record(h).cursors) == {'keep', 'gone'}


def test_erasing_a_thread_removes_its_sections_from_the_shared_memory():
    from om_lib.history.history import erase_thread_from_resource_memory

    h = harness(resource_config(message_tokens=10_000))
    observed_pair(h)
    h.store.delete_thread('r1', 'gone')
    assert erase_thread_from_resource_memory(h.store, 'r1', 'gone', now=h.clock.now(), count=h.counter.count_string)
    head = record(h)
    assert 'forget this fact' not in head.active_observations and 'keep this fact' in head.active_observations
    assert head.cursors == {'keep': 1}
    assert head.observation_tokens == h.counter.count_string(head.active_observations)
    assert h.store.list_pending_threads('r1') == []


def test_deleting_observed_messages_drops_that_threads_sections_and_observes_the_rest_again():
    from om_lib.history.history import forget_messages

    h = harness(resource_config(message_tokens=10_000))
    observed_pair(h)
    h.step(h.user('second message ' + words(3), mid='gone-2'), thread='gone')
    h.engine.observe_now('r1', 'gone')
    forget_messages(h.store, 'r1', 'gone', ['u2'], now=h.clock.now(), count=h.counter.count_string)
    head = record(h)
    assert 'forget this fact' not in head.active_observations and 'keep this fact' in head.active_observations
    assert 'gone' not in head.cursors
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == ['gone']
    h.engine.observe_now('r1', 'gone')
    head = record(h)
    assert 'second message' in head.active_observations and 'forget this fact' not in head.active_observations


def test_imported_history_goes_into_the_threads_section_and_leaves_it_pending():
    from datetime import UTC, datetime

    from om_lib.messages import Message

    h = harness(resource_config(message_tokens=200))
    h.step(h.user('hello from A'), thread='A')
    imported = [
        Message.model_validate(
            {
                'id': 'x1',
                'role': 'user',
                'createdAt': datetime(2019, 5, 4, tzinfo=UTC).isoformat(),
                'content': 'I lived in Lisbon for years',
            }
        )
    ]
    _, parts = h.engine.observe_imported('r1', 'A', imported)
    assert [p.kind() for p in parts] == ['data-om-observation-start', 'data-om-observation-end']
    head = record(h)
    assert '<thread id="A">' in head.active_observations and 'I lived in Lisbon' in head.active_observations
    assert head.cursors.get('A', 0) == 0 and [g.kind for g in head.groups] == ['import']
    assert [p.thread_id for p in h.store.list_pending_threads('r1')] == ['A']  # its own message is still pending
    assert h.engine.observe_imported('r1', 'A', imported)[1].to_json() == []  # the same import, once
