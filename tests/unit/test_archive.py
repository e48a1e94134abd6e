"""The archive (om_lib/reflection/archive.py): memory stays within its bound without a model call, nothing is lost,
recall pages it back; and group markup stays well formed under every operation that rewrites the log (a property
test)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from om_lib.config import ArchiveSettings
from om_lib.context import context as ctx
from om_lib.history.forgetting import archive_without
from om_lib.history.history import forget_messages
from om_lib.history.recall import RecallRequest, recall
from om_lib.observation import buffering as buf
from om_lib.observation.resource_scope import shown_thread_id
from om_lib.parts import CycleParts
from om_lib.prompts.reflector import merge_buffered_reflection
from om_lib.records import ArchivedGroup, BufferedChunk, ObservationGroup, OMRecord
from om_lib.reflection.archive import Archive, archived_groups, catalog_line, page_archive, plan_archive
from tests.unit.test_engine import Harness, words

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


def count(text: str) -> int:
    return len(text.split())


def group(first: int, last: int, *lines: str, day: str = 'Nov 28, 2026') -> str:
    body = '\n'.join([f'Date: {day}', *lines])
    return ctx.wrap_in_observation_group(body, ctx.group_range(first, last), group_id=ctx.group_id_for(first))


def fact(n: int) -> str:
    return f'* 🔴 (09:{n % 60:02d}) User stated fact number {n} with code word W{n}'


def has(text: str, n: int) -> bool:
    return re.search(rf'\bW{n}\b', text) is not None


def log_of(n_groups: int) -> str:
    pieces = [group(10 * i + 1, 10 * i + 9, fact(2 * i), fact(2 * i + 1)) for i in range(n_groups)]
    return '\n\n'.join(pieces)


BOUND = ArchiveSettings(after_tokens=120, keep_tokens=40, max_catalog_tokens=200)


# ---------------------------------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------------------------------
def test_the_oldest_groups_move_out_until_about_keep_tokens_remain_and_nothing_is_lost() -> None:
    log = log_of(8)
    plan = plan_archive(log, count, BOUND)
    assert plan is not None
    assert count(plan.retained) <= BOUND.keep_tokens + 30 and ctx.group_markup_problem(plan.retained) is None
    moved = [p.group_id for p in plan.pieces]
    kept = [g.id for g in ctx.parse_observation_groups(plan.retained)]
    assert moved + kept == [ctx.group_id_for(10 * i + 1) for i in range(8)]  # a prefix moves, in order
    assert [p.range for p in plan.pieces][:2] == ['#1:#9', '#11:#19']
    everything = plan.retained + '\n'.join(p.observations for p in plan.pieces)
    assert all(has(everything, n) for n in range(16))


def test_a_log_within_its_bound_is_left_as_it_is() -> None:
    assert plan_archive(log_of(2), count, BOUND) is None


def test_a_single_group_past_the_bound_is_split_between_its_lines_keeping_its_range_and_day() -> None:
    log = group(1, 40, *(fact(n) for n in range(20)))
    plan = plan_archive(log, count, BOUND)
    assert plan is not None and len(plan.pieces) == 1
    (kept,) = ctx.parse_observation_groups(plan.retained)
    assert kept.range == plan.pieces[0].range == '#1:#40'
    assert kept.content.startswith('Date: Nov 28, 2026') and has(kept.content, 19) and not has(kept.content, 0)
    assert has(plan.pieces[0].observations, 0)


def test_a_plain_log_moves_whole_batches_between_message_boundaries() -> None:
    batches = ['\n'.join(['Date: Nov 28, 2026', fact(2 * i), fact(2 * i + 1)]) for i in range(8)]
    log = batches[0] + ''.join(ctx.message_boundary(T0) + b for b in batches[1:])
    plan = plan_archive(log, count, BOUND)
    assert plan is not None and all('message boundary' not in p.observations for p in plan.pieces)
    assert not plan.retained.startswith('---') and 'W15' in plan.retained


def test_resource_sections_move_whole() -> None:
    sections = [
        f'<thread id="t{i}">\nDate: Nov 28, 2026\n{fact(2 * i)}\n{fact(2 * i + 1)}\n</thread>' for i in range(8)
    ]
    plan = plan_archive('\n'.join(sections), count, BOUND)
    assert plan is not None and [p.shown_thread for p in plan.pieces] == [f't{i}' for i in range(len(plan.pieces))]
    assert plan.retained.count('<thread') == plan.retained.count('</thread>')


def test_an_archived_section_of_imported_history_names_its_real_thread() -> None:
    # Thread t0's history was only imported (no cursor); the other threads were observed
    sections = [
        f'<thread id="{shown_thread_id("r1", f"t{i}")}">\nDate: Nov 28, 2026\n{fact(2 * i)}\n{fact(2 * i + 1)}\n'
        '</thread>'
        for i in range(8)
    ]
    imported = ObservationGroup(
        id='import-x', thread_id='t0', start_id='a', end_id='b', start_seq=0, end_seq=0, created_at=T0, kind='import'
    )
    record = OMRecord(
        id='rec',
        key='resource:r1',
        scope='resource',
        resource_id='r1',
        thread_id=None,
        created_at=T0,
        updated_at=T0,
        active_observations='\n'.join(sections),
        cursors={f't{i}': 2 for i in range(1, 8)},
        groups=(imported,),
    )
    plan = plan_archive(record.active_observations, count, BOUND)
    assert plan is not None
    entries = archived_groups(plan, record, count, T0, thread_id=None)
    assert [e.thread_id for e in entries] == [f't{i}' for i in range(len(entries))]


# ---------------------------------------------------------------------------------------------------------------------
# The catalog line and recall
# ---------------------------------------------------------------------------------------------------------------------
def archived(n: int, text: str, *, thread: str | None = 't1') -> ArchivedGroup:
    return ArchivedGroup(
        id=f'g{n}',
        thread_id=thread,
        range=ctx.group_range(n, n + 1),
        start_seq=n,
        end_seq=n + 1,
        observations=f'Date: Nov {n}, 2026\n{text}',
        tokens=count(text),
        archived_at=T0,
        generation=0,
    )


def test_the_catalog_line_is_short_says_how_to_read_the_archive_and_respects_its_ceiling() -> None:
    groups = [archived(1, '* 🔴 fact one'), archived(5, '* 🔴 fact five')]
    line = catalog_line(groups, count, max_tokens=200, recall=True) or ''
    assert line.startswith('<archived-observations groups="2"') and 'Nov 1, 2026 – Nov 5, 2026' in line
    assert 'mode "observations"' in line and count(line) < 40
    assert 'inspector' in (catalog_line(groups, count, max_tokens=200, recall=False) or '')
    assert catalog_line(groups, count, max_tokens=5, recall=True) is None
    assert catalog_line([], count, max_tokens=200, recall=True) is None


def test_recall_pages_archived_groups_newest_first_and_filters_by_words() -> None:
    groups = [archived(n, f'* 🔴 fact {n} about {"tea" if n % 2 else "coffee"}') for n in range(1, 8)]
    first = page_archive(groups, query=None, page=0, limit=3, count=count, max_tokens=8000)
    assert first['count'] == 3 and first['hasNextPage'] and not first['hasPrevPage']
    assert first['observations'].index('fact 7') < first['observations'].index('fact 5')
    assert '## Messages #7–#8 · thread t1 · archived 2026-11-28 09:00Z' in first['observations']
    tea = page_archive(groups, query='TEA fact', page=0, limit=10, count=count, max_tokens=8000)
    assert tea['count'] == 4 and 'coffee' not in tea['observations']
    none = page_archive(groups, query='cocoa', page=0, limit=10, count=count, max_tokens=8000)
    assert none['count'] == 0 and none['observations'] == 'No archived observations match.'


# ---------------------------------------------------------------------------------------------------------------------
# Through the engine: a Reflector that always refuses
# ---------------------------------------------------------------------------------------------------------------------
REFUSAL = "I'm sorry, but I can't help with rewriting these notes."


def refusing_harness() -> Harness:
    config = {
        'model': 'default',
        'retrieval': True,
        'observation': {'messageTokens': 30, 'bufferTokens': False},
        'reflection': {'observationTokens': 100},
    }
    h = Harness(config)
    h.model.script('reflector', *[REFUSAL] * 400)

    def observer(request) -> str:  # one line per message, with its code word
        said = [m.text() for m in request.source_messages if m.role == 'user']
        codes = [re.search(r'W\d+', text) for text in said]
        lines = [f'* 🔴 (09:00) User stated code word {m.group(0)}' for m in codes if m]
        return (
            '<observations>\nDate: Nov 28, 2026\n' + '\n'.join(lines or ['* 🟡 (09:00) chatter']) + '\n</observations>'
        )

    h.model._fallback = observer  # noqa: SLF001 - the scripted model's default answer, for the Observer
    return h


def test_a_refusing_reflector_never_lets_the_log_pass_its_bound_and_nothing_said_is_lost() -> None:
    h = refusing_harness()
    started = h.clock.now()
    bound = h.engine.rt.settings.archive.after_tokens
    assert bound == 150  # 1.5 × observationTokens
    archived_parts = 0
    for n in range(60):
        result = h.step(h.user(f'code word W{n} ' + words(25)))
        parts = result.parts.to_json()
        status = next(p['data'] for p in parts if p['type'] == 'data-om-status')
        assert status['windows']['active']['observations']['tokens'] <= bound, n
        archived_parts += sum(p['type'] == 'data-om-observations-archived' for p in parts)
    record = h.record()
    assert archived_parts > 0 and record.archived and record.origin in ('archive', 'initial')
    assert ctx.group_markup_problem(record.active_observations) is None
    assert '<archived-observations groups=' in result.system
    # Every stated code word (but the step's own input, answered by the Actor) is in the log or the archive...
    stored = record.active_observations + '\n'.join(g.observations for g in record.archived)
    assert [n for n in range(59) if not has(stored, n)] == []
    # ...and an archived one comes back through recall
    oldest = re.search(r'W\d+', record.archived[0].observations)
    assert oldest is not None
    found = recall(
        h.store,
        h.counter,
        resource_id='r1',
        current_thread_id='t1',
        request=RecallRequest(mode='observations', query=oldest.group(0)),
        memory_key=record.key,
    )
    assert found['count'] >= 1 and oldest.group(0) in found['observations']
    # The Reflector failed and said so; it was not asked again on every step (backoff, unchanged input)
    failures = [f['reason'] for f in h.engine.memory_view('r1', 't1')['recentFailures']]
    assert 'invalid_reflection' in failures
    # (4 calls per ladder run; runs wait 30 s doubling, so their number grows with the log of the time elapsed)
    runs = len(h.model.calls_for('reflector')) / 4
    elapsed = (h.clock.now() - started).total_seconds()
    assert 1 <= runs <= 2 + math.log2(elapsed / 30), (runs, elapsed)


def test_the_archive_leaves_the_log_to_a_reflection_that_may_still_shrink_it_up_to_twice_the_bound() -> None:
    # Given a log past its bound (an observation that jumped past the reflection threshold and the bound at once)
    h = Harness(
        {
            'model': 'default',
            'retrieval': True,
            'observation': {'messageTokens': 30, 'bufferTokens': False, 'archive': {'afterTokens': 120}},
            'reflection': {'observationTokens': 100},
        }
    )
    rt = h.engine.rt
    head = rt.writer.get_or_create('thread', 'r1', 't1')

    def with_log(n_groups: int) -> OMRecord:
        log = log_of(n_groups)
        tokens = rt.counter.count_observations(log)
        committed = rt.writer.commit(
            rt.writer.fresh(head),
            lambda cur: cur.model_copy(update={'active_observations': log, 'observation_tokens': tokens}),
        )
        assert committed is not None
        return committed

    record = with_log(6)
    assert 120 < record.observation_tokens <= 240
    # When a reflection is due and nothing says it cannot run (it was handed to the worker): the log is left to it
    assert Archive(rt, lambda _r: True).enforce(record, 't1', CycleParts()).archived == ()
    # When the reflection cannot run (refused, backing off, the model down): the oldest groups are archived now
    assert Archive(rt, lambda _r: False).enforce(record, 't1', CycleParts()).archived
    # And past twice the bound the archive acts whatever a reflection might still do
    record = with_log(10)
    assert record.observation_tokens > 240
    assert Archive(rt, lambda _r: True).enforce(record, 't1', CycleParts()).archived


def test_deleting_messages_drops_the_archived_groups_derived_from_them() -> None:
    kept = archived(1, '* 🔴 fact one')
    doomed = archived(5, '* 🔴 fact five')
    other = archived(9, '* 🔴 other thread', thread='t2')
    unknown = kept.model_copy(update={'range': '', 'start_seq': None, 'end_seq': None, 'id': 'a1'})
    assert archive_without((kept, doomed, other), 't1', [6]) == (kept, other)
    assert archive_without((kept, doomed, other, unknown), 't1', [6]) == (kept, other)
    assert archive_without((kept, doomed, other), 't1', None) == (other,)


def test_clearing_a_thread_clears_its_archive() -> None:
    h = refusing_harness()
    for n in range(40):
        h.step(h.user(f'code word W{n} ' + words(25)))
    assert h.record().archived
    forget_messages(h.store, 'r1', 't1', None, now=h.clock.now(), writer=h.engine.rt.writer)
    assert h.record().archived == () and h.record().active_observations == ''


# ---------------------------------------------------------------------------------------------------------------------
# Well-formed groups under every operation that rewrites the log
# ---------------------------------------------------------------------------------------------------------------------
GARBAGE = st.sampled_from(
    ['', '</observation-group>', '<observation-group id="x" range="a:b">', '<observation-group>', '## Group `g1`']
)
LINE = st.builds(
    lambda n, junk: f'* 🔴 (09:00) fact {n} {junk}'.strip(), st.integers(0, 999), GARBAGE
) | st.sampled_from(['Date: Nov 28, 2026', 'Date: Nov 29, 2026', '  * sub detail', '```', 'plain prose line'])
BODY = st.lists(LINE, min_size=1, max_size=6).map('\n'.join)
OPS = st.lists(
    st.tuples(st.sampled_from(['observe', 'activate', 'reflect', 'buffered', 'archive', 'delete']), BODY, BODY),
    min_size=1,
    max_size=25,
)


class Log:
    """The text operations the engine runs on a retrieval-mode log, applied to a plain string."""

    def __init__(self) -> None:
        self.text = ''
        self.seq = 1

    def _range(self) -> tuple[str, str]:
        first, self.seq = self.seq, self.seq + 3
        return ctx.group_range(first, first + 2), ctx.group_id_for(first)

    def observe(self, body: str, _other: str) -> None:
        range_, group_id = self._range()
        block = ctx.wrap_in_observation_group(body, range_, group_id=group_id)
        self.text = block if not self.text.strip() else self.text + ctx.message_boundary(T0) + block

    def activate(self, body: str, other: str) -> None:
        chunks = []
        for text in (body, other):
            first = self.seq
            self.seq += 3
            chunks.append(
                BufferedChunk(
                    id=f'c{first}',
                    cycle_id='c',
                    thread_id='t1',
                    observations=text,
                    token_count=count(text),
                    message_ids=('m',),
                    message_tokens=10,
                    start_seq=first,
                    end_seq=first + 2,
                    last_observed_at=T0,
                    created_at=T0,
                )
            )
        from om_lib.observation.buffered import grouped

        act = buf.activate_chunks(self.text, chunks, 2, cursor=0, last_observed_at=None, render=grouped)
        self.text = act.active_observations

    def reflect(self, body: str, other: str) -> None:
        if not ctx.parse_observation_groups(self.text):
            self.text = ctx.strip_group_tags(body) if self.text.strip() else self.text  # as Reflection.draft does
            return
        ids = [g.id for g in ctx.parse_observation_groups(self.text)]
        answer = f'## Group `{ids[0]}`\n{body}\n## Group `invented`\n{other}' if len(body) % 2 else body
        self.text = ctx.reconcile_observation_groups_from_reflection(answer, self.text) or self.text

    def buffered(self, body: str, _other: str) -> None:
        if not self.text.strip():
            return
        part = buf.reflection_slice(self.text, count(self.text), max(1, count(self.text)), 0.5)
        reconciled = ctx.reconcile_observation_groups_from_reflection(body, part.text)
        staged = reconciled if reconciled is not None else ctx.strip_group_tags(body)  # as Reflection.draft does
        self.text = merge_buffered_reflection(staged, self.text, part.line_count)

    def archive(self, _body: str, _other: str) -> None:
        plan = plan_archive(self.text, count, ArchiveSettings(after_tokens=20, keep_tokens=8, max_catalog_tokens=0))
        if plan is not None:
            self.text = plan.retained

    def delete(self, _body: str, _other: str) -> None:
        self.text = ''  # deleting observed messages resets the log (om_lib/history/history.py)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_group_markup_stays_balanced_under_every_operation(ops: list[tuple[str, str, str]]) -> None:
    log = Log()
    for name, body, other in ops:
        getattr(log, name)(body, other)
        assert ctx.group_markup_problem(log.text) is None, (name, log.text)
        # and the Actor never sees a tag
        assert '<observation-group' not in ctx.render_observation_groups_for_actor(log.text)
