"""Resource scope's pure parts (spec §25 K): selection, batching, thread sections and shown ids."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from om_lib.observation.resource_scope import (
    ThreadIdCodec,
    ThreadLoad,
    batch_threads,
    join_other_conversations,
    other_conversation_block,
    replace_or_append_thread_section,
    select_threads,
    shown_thread_id,
    wrap_with_thread_tag,
)

T0 = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)


def test_selection_takes_the_largest_threads_until_the_threshold_then_orders_them_oldest_first():
    # Given three threads with 6k, 5k and 3k unobserved tokens; the 5k one has the oldest message
    loads = [
        ThreadLoad('a', 6000, T0 + timedelta(minutes=5)),
        ThreadLoad('b', 5000, T0),
        ThreadLoad('c', 3000, T0 - timedelta(hours=1)),
    ]
    # When a 10k-threshold cycle selects
    chosen = select_threads(loads, 10_000, now=T0)
    # Then 6k and 5k are taken (the 3k one is not reached), in oldest-message order
    assert [x.thread_id for x in chosen] == ['b', 'a']


def test_selection_always_takes_one_thread_and_skips_empty_ones():
    chosen = select_threads([ThreadLoad('big', 50_000, None), ThreadLoad('empty', 0, T0)], 10_000, now=T0)
    assert [x.thread_id for x in chosen] == ['big']
    assert select_threads([], 10_000, now=T0) == []


def test_batching_starts_a_new_batch_when_the_next_thread_would_overflow():
    ordered = [ThreadLoad('b', 5000, T0), ThreadLoad('a', 6000, T0)]
    assert [[x.thread_id for x in batch] for batch in batch_threads(ordered, 10_000)] == [['b'], ['a']]
    small = [ThreadLoad(f't{i}', 1000, T0) for i in range(5)]
    assert [len(batch) for batch in batch_threads(small, 2500)] == [2, 2, 1]
    # A thread larger than the batch limit still gets a batch of its own
    assert [len(batch) for batch in batch_threads([ThreadLoad('huge', 99_000, T0)], 10_000)] == [1]


def section(thread: str, date: str, *lines: str) -> str:
    return wrap_with_thread_tag(thread, '\n'.join([f'Date: {date}', *lines]))


def test_a_section_into_an_empty_log_is_the_section_itself():
    new = section('t1', 'Mar 3, 2025', '* 🔴 (09:00) User likes tea')
    assert replace_or_append_thread_section('', new, T0) == new


def test_same_thread_and_date_at_the_tail_merges_into_that_section():
    log = section('t1', 'Mar 3, 2025', '* 🔴 (09:00) User likes tea')
    merged = replace_or_append_thread_section(log, section('t1', 'Mar 3, 2025', '* 🟡 (09:30) User moved'), T0)
    assert merged == section('t1', 'Mar 3, 2025', '* 🔴 (09:00) User likes tea', '* 🟡 (09:30) User moved')
    assert merged.startswith(log[: -len('</thread>')])  # the old text is a prefix: nothing earlier was rewritten


def test_another_date_or_another_thread_is_appended_after_a_boundary():
    log = section('t1', 'Mar 3, 2025', '* 🔴 (09:00) User likes tea')
    other_day = replace_or_append_thread_section(log, section('t1', 'Mar 4, 2025', '* (10:00) later'), T0)
    other_thread = replace_or_append_thread_section(log, section('t2', 'Mar 3, 2025', '* (10:00) elsewhere'), T0)
    for result in (other_day, other_thread):
        assert result.startswith(log)
        assert '--- message boundary (2025-03-03T09:00:00.000Z) ---' in result
        assert result.count('<thread id=') == 2


def test_an_older_section_of_the_same_thread_is_never_rewritten():
    # Given t1's section followed by t2's: a new t1 section for the same date goes at the end, not into the first
    log = replace_or_append_thread_section(
        section('t1', 'Mar 3, 2025', '* (09:00) first'), section('t2', 'Mar 3, 2025', '* (09:10) second'), T0
    )
    result = replace_or_append_thread_section(log, section('t1', 'Mar 3, 2025', '* (09:20) third'), T0)
    assert result.startswith(log)
    assert result.count('<thread id="t1">') == 2


def test_thread_tags_the_observer_wrote_are_stripped_before_wrapping():
    wrapped = wrap_with_thread_tag('t1', '<thread id="evil">\nDate: Mar 3, 2025\n* (09:00) x\n</thread>')
    assert wrapped == '<thread id="t1">\nDate: Mar 3, 2025\n* (09:00) x\n</thread>'


def test_shown_ids_are_stable_per_resource_and_resolve_back():
    codec = ThreadIdCodec('alice', obscure=True)
    shown = codec.shown('project-x')
    assert shown == shown_thread_id('alice', 'project-x') and len(shown) == 12 and 'project' not in shown
    assert shown != ThreadIdCodec('bob', obscure=True).shown('project-x')  # keyed by resource
    assert codec.resolve(shown, ['other', 'project-x']) == 'project-x'
    assert codec.resolve('project-x', ['project-x']) == 'project-x'
    assert codec.resolve('000000000000', ['project-x']) is None
    assert ThreadIdCodec('alice', obscure=False).shown('project-x') == 'project-x'


@pytest.mark.parametrize('count', [10, 1000])
def test_shown_ids_of_a_resource_do_not_collide(count):
    ids = {shown_thread_id('alice', f'thread-{i}') for i in range(count)}
    assert len(ids) == count


def test_other_conversations_render_as_tagged_blocks():
    block = other_conversation_block('abc', 'User (9:00 AM): I moved to Berlin')
    assert block == '<other-conversation id="abc">\nUser (9:00 AM): I moved to Berlin\n</other-conversation>'
    assert join_other_conversations([block, block]) == f'{block}\n\n{block}'
    assert join_other_conversations([]) is None


def test_removing_a_threads_sections_keeps_the_rest_and_no_dangling_boundary():
    from om_lib.observation.resource_scope import remove_thread_sections

    t1 = section('t1', 'Mar 3, 2025', '* (09:00) keep me')
    t2 = section('t2', 'Mar 3, 2025', '* (09:10) erase me')
    log = replace_or_append_thread_section(t1, t2, T0)
    log = replace_or_append_thread_section(log, section('t1', 'Mar 4, 2025', '* (10:00) keep too'), T0)
    cleaned = remove_thread_sections(log, {'t2'})
    assert 'erase me' not in cleaned and 'keep me' in cleaned and 'keep too' in cleaned
    assert cleaned.count('message boundary') == 1
    assert remove_thread_sections(t2, {'t2'}) == ''
    assert remove_thread_sections(log, {'nobody'}) == log
