"""Thread titles: `generateTitle` (om_lib/history/titles.py, a background job after the first turn) and the Observer's
`observation.threadTitle` (engine), over the in-memory store and a scripted model."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from om_lib.adapters.memory.store import InMemoryStore
from om_lib.clock import ManualClock
from om_lib.config import OMConfig
from om_lib.context.tokens import TokenCounter
from om_lib.engine.engine import MemoryEngine
from om_lib.errors import ModelUnavailableError
from om_lib.history.titles import clean_title, generate_title, title_job
from om_lib.messages import Message
from om_lib.models.model_router import ModelRouter
from om_lib.service import MemoryService
from om_lib.work import CollectingWork, Job
from tests.fakes.scripted_model import ScriptedModel


class WordTokenizer:
    version = 'words'

    def count(self, text: str) -> int:
        return len(text.split())


def make(config: dict[str, Any], *, work: CollectingWork | None = None) -> tuple[MemoryEngine, ScriptedModel]:
    clock = ManualClock(tick=timedelta(seconds=1))
    model = ScriptedModel()
    engine = MemoryEngine(
        OMConfig.model_validate(
            {'model': 'default', 'observation': {'messageTokens': 10_000, 'bufferTokens': False}, **config}
        ),
        store=InMemoryStore(),
        router=ModelRouter({'google': model, 'offline': model}, clock=clock, sleep=clock.advance),
        counter=TokenCounter(WordTokenizer()),
        clock=clock,
        work=work,
    )
    return engine, model


def user(engine: MemoryEngine, text: str, mid: str) -> Message:
    return Message.model_validate(
        {'id': mid, 'role': 'user', 'createdAt': engine.clock.now().isoformat(), 'content': text}
    )


def test_first_turn_queues_a_title_job_and_later_turns_do_not() -> None:
    work = CollectingWork()
    engine, model = make({'generateTitle': True}, work=work)
    model.script('actor', 'Sure.', 'Again.')

    first = MemoryService(engine).chat('r1', 't1', user(engine, 'Plan a trip to Lisbon in May', 'u1'))
    second = MemoryService(engine).chat('r1', 't1', user(engine, 'And Porto?', 'u2'))

    assert work.jobs == [title_job('r1', 't1')]
    [scheduled] = [p for p in first.parts.to_json() if p['type'] == 'data-om-scheduled']
    assert 'title' in scheduled['data']['operations']
    assert not any(p['type'] == 'data-om-scheduled' for p in second.parts.to_json())
    assert model.calls_for('title') == []  # nothing ran in the request


def test_the_job_titles_the_thread_once_with_the_configured_model_and_instructions() -> None:
    work = CollectingWork()
    engine, model = make({'generateTitle': {'model': 'offline/small', 'instructions': 'One word title'}}, work=work)
    model.script('actor', 'Sure.')
    model.script('title', '"Lisbon Trip Planning."\nextra line')
    MemoryService(engine).chat('r1', 't1', user(engine, 'Plan a trip to Lisbon in May', 'u1'))
    [job] = work.jobs

    assert Job.from_json(job.to_json()) == job and job.kind == 'title'
    assert not engine.run_job(job)
    engine.run_job(job)  # a duplicate does nothing

    assert engine.store.get_thread('r1', 't1').title == 'Lisbon Trip Planning'
    [call] = model.calls_for('title')
    assert call.model_id == 'small' and call.request.system == 'One word title'
    assert 'Plan a trip to Lisbon in May' in call.request.contents[0].parts[0]


def test_without_background_work_the_title_is_made_after_the_turn() -> None:
    engine, model = make({'generateTitle': True})
    model.script('actor', 'Sure.')
    model.script('title', 'Lisbon in May')

    MemoryService(engine).chat('r1', 't1', user(engine, 'Plan a trip to Lisbon in May', 'u1'))

    assert engine.store.get_thread('r1', 't1').title == 'Lisbon in May'


def test_a_titled_thread_is_left_alone_and_a_failing_model_changes_nothing() -> None:
    engine, model = make({'generateTitle': True})
    engine.store.create_thread('r1', 't1', title='Mine', now=engine.clock.now())
    engine.store.append_messages('r1', 't1', [user(engine, 'hello there', 'u1')], now=engine.clock.now())
    assert generate_title(engine.rt, 'r1', 't1') is None

    engine.store.append_messages('r1', 't2', [user(engine, 'hello there', 'u1')], now=engine.clock.now())
    model.script('title', *[ModelUnavailableError('down', status_code=503)] * 10)
    assert generate_title(engine.rt, 'r1', 't2') is None
    assert engine.store.get_thread('r1', 't2').title is None


def test_title_generation_off_queues_nothing() -> None:
    work = CollectingWork()
    engine, model = make({}, work=work)
    model.script('actor', 'Sure.')
    MemoryService(engine).chat('r1', 't1', user(engine, 'hello', 'u1'))
    assert work.jobs == []


def test_clean_title() -> None:
    assert clean_title('## Title: **Trip to Lisbon.**') == 'Trip to Lisbon'
    assert clean_title('\n\n  “Quoted”  \n') == 'Quoted'
    assert len(clean_title('word ' * 100)) == 80
    assert clean_title('') == ''


# -- observation.threadTitle: the Observer renames the thread when the topic changes ------------------------------
OBSERVED = '<observations>\n* 🔴 (09:00) User {0}\n</observations>\n<thread-title>{1}</thread-title>'


def test_observer_thread_title_renames_the_thread_when_on() -> None:
    engine, model = make({'observation': {'messageTokens': 5, 'bufferTokens': False, 'threadTitle': True}})
    model.script('observer', OBSERVED.format('plans a trip', 'Trip to Lisbon'))
    engine.prepare_step('r1', 't1', [user(engine, 'I plan a trip to Lisbon next May', 'u1')])
    step = engine.prepare_step('r1', 't1', [])  # the input is observed by the step after it

    [update] = [p for p in step.parts.to_json() if p['type'] == 'data-om-thread-update']
    assert update['data']['newTitle'] == 'Trip to Lisbon' and 'oldTitle' not in update['data']
    assert engine.store.get_thread('r1', 't1').title == 'Trip to Lisbon'

    # The topic changes: a new title replaces it, and the Observer was shown the old one.
    model.script('observer', OBSERVED.format('asks about taxes', 'Tax return questions'))
    engine.prepare_step('r1', 't1', [user(engine, 'Now something else: my tax return forms', 'u2')])
    step = engine.prepare_step('r1', 't1', [])
    [update] = [p for p in step.parts.to_json() if p['type'] == 'data-om-thread-update']
    assert (update['data']['oldTitle'], update['data']['newTitle']) == ('Trip to Lisbon', 'Tax return questions')
    assert 'Trip to Lisbon' in model.calls_for('observer')[-1].request.contents[0].parts[0]

    # The same title again is no update.
    model.script('observer', OBSERVED.format('more taxes', 'Tax return questions'))
    step = engine.prepare_step('r1', 't1', [user(engine, 'More about the tax forms and deadlines', 'u3')])
    assert not [p for p in step.parts.to_json() if p['type'] == 'data-om-thread-update']


def test_observer_thread_title_is_ignored_when_off() -> None:
    engine, model = make({'observation': {'messageTokens': 5, 'bufferTokens': False}})
    model.script('observer', OBSERVED.format('plans a trip', 'Trip to Lisbon'))
    step = engine.prepare_step('r1', 't1', [user(engine, 'I plan a trip to Lisbon next May', 'u1')])

    assert not [p for p in step.parts.to_json() if p['type'] == 'data-om-thread-update']
    assert engine.store.get_thread('r1', 't1').title is None
