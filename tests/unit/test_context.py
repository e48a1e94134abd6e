"""What the Actor sees: boundaries, optimisation, relative time, groups and system messages (spec §16, §18.1)."""

from __future__ import annotations

from datetime import UTC, date, datetime

from om_lib.context.context import (
    BOUNDARY_RE,
    CONTINUATION_REMINDER_ID,
    add_relative_time_to_observations,
    build_observation_system_messages,
    combine_observation_group_ranges,
    continuation_reminder_text,
    expand_inline_estimated_dates,
    format_gap_between_dates,
    format_relative_time,
    get_observations_as_of,
    group_id_for,
    group_markup_problem,
    group_range,
    is_future_intent_observation,
    join_system_messages,
    message_boundary,
    optimize_observations_for_context,
    parse_date_from_content,
    parse_observation_groups,
    reconcile_observation_groups_from_reflection,
    render_observation_groups_for_actor,
    render_observation_groups_for_reflection,
    split_observation_chunks,
    strip_observation_groups,
    wrap_in_observation_group,
)
from om_lib.prompts.reflector import looks_degenerate

NOW = datetime(2025, 1, 20, tzinfo=UTC)
T1 = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
T2 = datetime(2025, 1, 5, 12, 30, 15, 250_000, tzinfo=UTC)


def d(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------------------------
# Boundaries and getObservationsAsOf (E25)
# ---------------------------------------------------------------------------------------------------------------


def test_message_boundary_format_and_regex() -> None:
    boundary = message_boundary(T1)
    assert boundary == '\n\n--- message boundary (2025-01-01T10:00:00.000Z) ---\n\n'
    assert BOUNDARY_RE.fullmatch(boundary).group(1) == '2025-01-01T10:00:00.000Z'  # type: ignore[union-attr]
    assert message_boundary(T2) == '\n\n--- message boundary (2025-01-05T12:30:15.250Z) ---\n\n'
    assert message_boundary(datetime(2025, 1, 1, 10)) == boundary  # naive means UTC


def test_split_observation_chunks() -> None:
    text = '  A  ' + message_boundary(T1) + 'B\n' + message_boundary(T2) + '\n\n'
    assert split_observation_chunks(text) == ['A', 'B']
    assert split_observation_chunks('no boundaries') == ['no boundaries']
    assert split_observation_chunks('') == []


def test_get_observations_as_of() -> None:
    text = 'first' + message_boundary(T1) + 'second' + message_boundary(T2) + 'third'
    assert get_observations_as_of(text, datetime(2024, 12, 1, tzinfo=UTC)) == 'first'
    assert get_observations_as_of(text, datetime(2025, 1, 3, tzinfo=UTC)) == 'first\n\nsecond'
    assert get_observations_as_of(text, T1) == 'first\n\nsecond'  # inclusive at the exact boundary time
    assert get_observations_as_of(text, T2) == 'first\n\nsecond\n\nthird'
    assert get_observations_as_of('   ', NOW) == ''
    assert get_observations_as_of('plain text', NOW) == 'plain text'


# ---------------------------------------------------------------------------------------------------------------
# optimizeObservationsForContext (I52)
# ---------------------------------------------------------------------------------------------------------------


def test_optimize_observations_for_context() -> None:
    text = (
        'Date: Jan 1, 2025\n'
        '* 🔴 (10:00) User prefers tea [O1]\n'
        '* 🟡 (10:05) Ran the build\n'
        '  -> it failed   twice\n'
        '* 🟢 (10:06) minor note\n\n\n\n'
        '* ✅ (10:10) Fixed, see [the PR](https://example.com/pr/1) [3 items collapsed]'
    )
    out = optimize_observations_for_context(text)
    assert '🟡' not in out and '🟢' not in out
    assert '🔴 (10:00) User prefers tea' in out and '✅' in out
    assert '->' not in out and '[O1]' not in out
    assert '\n\n\n' not in out and '  ' not in out
    assert '[the PR](https://example.com/pr/1)' in out
    assert '[3 items collapsed]' in out
    assert '* (10:05) Ran the build it failed twice' in out


# ---------------------------------------------------------------------------------------------------------------
# Relative time (§16.3, I53)
# ---------------------------------------------------------------------------------------------------------------


def test_format_relative_time_past_and_future() -> None:
    cases = {
        0: 'today',
        1: 'yesterday',
        3: '3 days ago',
        7: '1 week ago',
        13: '1 week ago',
        14: '2 weeks ago',
        29: '4 weeks ago',
        30: '1 month ago',
        59: '1 month ago',
        60: '2 months ago',
        364: '12 months ago',
        365: '1 year ago',
        800: '2 years ago',
        -1: 'tomorrow',
        -3: 'in 3 days',
        -8: 'in 1 week',
        -20: 'in 2 weeks',
        -45: 'in 1 month',
        -100: 'in 3 months',
        -365: 'in 1 year',
        -731: 'in 2 years',
    }
    for days, expected in cases.items():
        when = datetime.fromordinal(NOW.toordinal() - days).replace(tzinfo=UTC)
        assert format_relative_time(when, NOW) == expected, days
    assert format_relative_time(date(2025, 1, 19), NOW) == 'yesterday'


def test_format_gap_between_dates() -> None:
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 1, 2)) is None
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 1, 4)) == '[3 days later]'
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 1, 10)) == '[1 week later]'
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 1, 15)) == '[2 weeks later]'
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 2, 10)) == '[1 month later]'
    assert format_gap_between_dates(d(2025, 1, 1), d(2025, 4, 1)) == '[3 months later]'


def test_parse_date_from_content() -> None:
    assert parse_date_from_content('on Jan 4, 2025 at noon') == d(2025, 1, 4)
    assert parse_date_from_content('September 12 2024') == d(2024, 9, 12)
    assert parse_date_from_content('Jan 4-5, 2025') == d(2025, 1, 4)
    assert parse_date_from_content('mid March 2025') == d(2025, 3, 15)
    assert parse_date_from_content('early-to-mid June 2025') == d(2025, 6, 7)
    assert parse_date_from_content('late Feb 2025') == d(2025, 2, 23)
    assert parse_date_from_content('June to July 2025') == d(2025, 7, 1)
    assert parse_date_from_content('next weekend') is None
    assert parse_date_from_content('Feb 30, 2025') is None


def test_is_future_intent_observation() -> None:
    for line in ('User will visit parents', 'plans to move', 'is going to buy', 'wants to learn', 'about to leave'):
        assert is_future_intent_observation(line), line
    assert not is_future_intent_observation('User visited parents')


def test_expand_inline_estimated_dates() -> None:
    past_plan = 'User will visit parents this weekend. (meaning Jan 4-5, 2025)'
    assert expand_inline_estimated_dates(past_plan, NOW) == (
        'User will visit parents this weekend. (meaning Jan 4-5, 2025 - 2 weeks ago, likely already happened)'
    )
    past_fact = 'User bought a bike (estimated Jan 10, 2025)'
    assert expand_inline_estimated_dates(past_fact, NOW) == 'User bought a bike (estimated Jan 10, 2025 - 1 week ago)'
    future_plan = 'User will fly out (meaning Feb 1, 2025)'
    assert expand_inline_estimated_dates(future_plan, NOW) == 'User will fly out (meaning Feb 1, 2025 - in 1 week)'
    unparseable = 'User will travel (meaning the summer of 2025)'
    assert expand_inline_estimated_dates(unparseable, NOW) == unparseable
    # Only the text of the note's own line decides whether it is a plan.
    two_lines = 'User will cook\nUser cooked (meaning Jan 2, 2025)'
    assert 'likely already happened' not in expand_inline_estimated_dates(two_lines, NOW)


def test_add_relative_time_to_observations() -> None:
    text = (
        'Date: Jan 1, 2025\n'
        '* 🔴 (10:00) User will visit parents this weekend. (meaning Jan 4-5, 2025)\n'
        '\n'
        'Date: Jan 15, 2025\n'
        '* 🔴 (09:00) later\n'
        '\n'
        'Date: Jan 16, 2025\n'
        '* 🔴 (09:00) next day'
    )
    out = add_relative_time_to_observations(text, NOW)
    assert 'Date: Jan 1, 2025 (2 weeks ago)' in out
    assert '[2 weeks later]\n\nDate: Jan 15, 2025 (5 days ago)' in out
    assert 'Date: Jan 16, 2025 (4 days ago)' in out
    assert out.count('later]') == 1  # Jan 15 -> Jan 16 is only one day apart
    assert 'likely already happened' in out
    assert '\n\n\n' not in out
    no_headers = '* User will go (meaning Jan 4, 2025)'
    assert add_relative_time_to_observations(no_headers, NOW) == expand_inline_estimated_dates(no_headers, NOW)


# ---------------------------------------------------------------------------------------------------------------
# Observation groups (§18.1)
# ---------------------------------------------------------------------------------------------------------------


def test_wrap_and_parse_groups() -> None:
    wrapped = wrap_in_observation_group('\n* one\n* two\n', group_range(12, 19), group_id=group_id_for(12), kind='x')
    assert wrapped == '<observation-group id="g12" range="#12:#19" kind="x">\n* one\n* two\n</observation-group>'
    (group,) = parse_observation_groups(wrapped)
    assert (group.id, group.range, group.content, group.kind) == ('g12', '#12:#19', '* one\n* two', 'x')


def test_a_group_costs_a_few_tokens_where_message_ids_cost_dozens() -> None:
    from om_lib.adapters.tiktoken_counter import get_tokenizer

    count = get_tokenizer().count
    content = '* 🔴 (09:00) User stated they live in Lisbon'
    legacy = (
        f'<observation-group id="{"a1" * 8}" range="{"0f" * 16}:{"e3" * 16}" source-group-ids="{"b2" * 8}">\n'
        f'{content}\n</observation-group>'
    )
    ours = wrap_in_observation_group(content, group_range(1024, 1031), group_id=group_id_for(1024))
    shown = render_observation_groups_for_actor(ours)
    assert shown == f'## Messages #1024–#1031\n{content}'
    assert count(shown) - count(content) <= 10 and count(legacy) - count(content) > 50


def test_group_attributes_are_escaped_and_round_trip() -> None:
    wrapped = wrap_in_observation_group('x', 'id"with>odd:b', group_id='g"1')
    (group,) = parse_observation_groups(wrapped)
    assert group.range == 'id"with>odd:b' and group.id == 'g"1'
    assert group_markup_problem(wrapped) is None


def test_scanner_ignores_groups_without_id_and_lookalike_tags() -> None:
    text = (
        '<observation-group range="a:b">\nno id\n</observation-group>\n'
        '<observation-groupie id="x" range="a:b">\nnot a group\n</observation-group>\n'
        '<observation-group id="only-id">\nno range\n</observation-group>\n'
        '<observation-group id="ok" range="m1:m2">\nkept\n</observation-group>'
    )
    groups = parse_observation_groups(text)
    assert [(g.id, g.range, g.content) for g in groups] == [('only-id', '', 'no range'), ('ok', 'm1:m2', 'kept')]


def test_model_written_group_tags_never_reach_the_log() -> None:
    echoed = '* one\n</observation-group>\n<observation-group id="x" range="a:b">\n* two'
    wrapped = wrap_in_observation_group(echoed, group_range(1, 2), group_id='g1')
    assert group_markup_problem(wrapped) is None and wrapped.count('<observation-group') == 1
    assert group_markup_problem('* a\n</observation-group>') is not None
    assert group_markup_problem('<observation-group id="a">\n<observation-group id="b">') is not None


def test_strip_and_render_groups() -> None:
    text = (
        'intro line\n\n'
        + wrap_in_observation_group('* one', group_range(1, 2), group_id='g1')
        + '\n\n\n\n'
        + wrap_in_observation_group('* two', 'msg-3:msg-4', group_id='legacy')
    )
    assert strip_observation_groups(text) == 'intro line\n\n* one\n\n* two'
    assert render_observation_groups_for_reflection(text) == (
        'intro line\n\n## Group `g1`\n\n* one\n\n## Group `legacy`\n\n* two'
    )
    assert render_observation_groups_for_actor(text) == (
        'intro line\n\n## Messages #1–#2\n* one\n\n## Messages msg-3–msg-4\n* two'
    )
    assert render_observation_groups_for_reflection('no groups') is None


def test_combine_observation_group_ranges() -> None:
    assert combine_observation_group_ranges(['m1:m2', 'm3:m4']) == 'm1:m2,m3:m4'
    assert combine_observation_group_ranges(['m1:m2', 'm1:m2,m3:m4']) == 'm1:m2,m3:m4'
    assert combine_observation_group_ranges(['3:5', '1:2', '8:9']) == '1:9'
    assert combine_observation_group_ranges(['#3:#5', '#8:#9']) == '#3:#9'
    assert combine_observation_group_ranges([]) == ''


def test_reconcile_groups_from_reflection() -> None:
    g1 = wrap_in_observation_group('* 🔴 User likes tea\n* 🟡 visited Lyon', group_range(1, 2), group_id='g1')
    g2 = wrap_in_observation_group('* 🔴 User has a cat', group_range(3, 4), group_id='g3')
    source = g1 + '\n\n' + g2

    assert reconcile_observation_groups_from_reflection('anything', 'no groups here') is None
    assert reconcile_observation_groups_from_reflection('  ', source) == ''

    reflection = (
        '## Group `g1`\n_range: `m1:m2`_\n\n* 🔴 User likes tea\n\n'
        '## Group `new-a`\n\n* 🔴 User has a cat\n\n'
        '## Group `new-b`\n\n* totally rewritten\n</observation-group>'
    )
    reconciled = reconcile_observation_groups_from_reflection(reflection, source) or ''
    assert group_markup_problem(reconciled) is None
    groups = parse_observation_groups(reconciled)
    assert [(g.id, g.range) for g in groups] == [('g1', '#1:#2'), ('g3', '#3:#4'), ('g1-2', '#1:#4')]
    assert groups[0].content == '* 🔴 User likes tea'  # the _range: line is not kept in the body

    whole = parse_observation_groups(reconcile_observation_groups_from_reflection('* condensed', source) or '')
    assert len(whole) == 1
    assert (whole[0].kind, whole[0].range, whole[0].content) == ('reflection', '#1:#4', '* condensed')


# ---------------------------------------------------------------------------------------------------------------
# System messages and the continuation reminder (J54, J55)
# ---------------------------------------------------------------------------------------------------------------


def test_system_messages_order_and_content() -> None:
    observations = 'A' + message_boundary(T1) + 'B'
    messages = build_observation_system_messages(
        observations, now=NOW, current_task='Plan the trip', suggested_response='Ask about dates'
    )
    preamble = messages[0]
    for heading in ('KNOWLEDGE UPDATES', 'PLANNED ACTIONS', 'MOST RECENT USER INPUT'):
        assert heading in preamble
    assert 'recall' not in preamble
    assert messages[1:] == [
        '<observations>',
        'A',
        'B',
        '<current-task>\nPlan the trip\n</current-task>',
        '<suggested-response>\nAsk about dates\n</suggested-response>',
    ]


def test_system_messages_without_hints_and_without_observations() -> None:
    messages = build_observation_system_messages('* 🔴 fact', now=NOW, current_task=None, suggested_response=None)
    assert messages[1:] == ['<observations>', '* 🔴 fact']
    assert build_observation_system_messages('  \n', now=NOW, current_task='x', suggested_response='y') == []
    assert join_system_messages([]) == ''


def test_system_messages_apply_optimisation_and_relative_time() -> None:
    observations = 'Date: Jan 1, 2025\n* 🟡 (10:00) detail -> more'
    messages = build_observation_system_messages(observations, now=NOW, current_task=None, suggested_response=None)
    assert messages[-1] == 'Date: Jan 1, 2025 (2 weeks ago)\n* (10:00) detail more'


def test_other_conversations_block() -> None:
    block = '<other-conversation id="thread-A">\nUser: hello from A\n</other-conversation>'
    messages = build_observation_system_messages(
        '* fact', now=NOW, current_task=None, suggested_response=None, other_conversations=block
    )
    other = messages[1]
    assert 'OTHER conversations' in other
    assert f'\nSTART_OTHER_CONVERSATIONS_BLOCK\n{block}\nEND_OTHER_CONVERSATIONS_BLOCK' in other
    assert messages[2] == '<observations>'


def test_retrieval_mode_renders_groups_and_mentions_recall() -> None:
    observations = wrap_in_observation_group('* 🟡 discussed -> the plan', group_range(1, 2), group_id='g1')
    messages = build_observation_system_messages(
        observations, now=NOW, current_task=None, suggested_response=None, retrieval=True, retrieval_scope='thread'
    )
    system = join_system_messages(messages)
    assert '## Messages #1–#2\n* 🟡 discussed' in system and '<observation-group' not in system
    assert 'recall' in messages[0]
    assert '🟡 discussed -> the plan' in system  # retrieval mode renders groups instead of optimising
    assert 'mode: "threads"' not in messages[0]
    resource = build_observation_system_messages(
        observations, now=NOW, current_task=None, suggested_response=None, retrieval=True
    )
    assert 'mode: "threads"' in resource[0]


def test_join_system_messages_closes_observations() -> None:
    messages = build_observation_system_messages(
        'A' + message_boundary(T1) + 'B', now=NOW, current_task='task', suggested_response=None
    )
    joined = join_system_messages(messages)
    assert joined.endswith('<observations>\n\nA\n\nB\n\n</observations>\n\n<current-task>\ntask\n</current-task>')
    assert joined.count('<observations>') == 1 and joined.count('</observations>') == 1
    only_obs = join_system_messages(
        build_observation_system_messages('A', now=NOW, current_task=None, suggested_response=None)
    )
    assert only_obs.endswith('<observations>\n\nA\n\n</observations>')


def test_continuation_reminder() -> None:
    assert CONTINUATION_REMINDER_ID == 'om-continuation'
    text = continuation_reminder_text()
    assert text.startswith('<system-reminder>') and text.endswith('</system-reminder>')
    assert 'NOT from the user' in text
    assert 'newer than your memories' in text


def test_default_degenerate_check_ignores_normal_bullets() -> None:
    bullets = '\n'.join(
        f'* 🔴 (10:{i % 60:02d}) User mentioned distinct fact number {i} about topic {i * 7}' for i in range(80)
    )
    assert len(bullets) > 2000
    assert not looks_degenerate(bullets)
    assert looks_degenerate('a' * 60_000)
    assert not looks_degenerate('short text ' * 100)
