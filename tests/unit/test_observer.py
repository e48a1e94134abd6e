"""Behaviour tests for the Observer's pure core (spec §13, §14, §17.2; scenarios E26, H46–H49, I50–I52)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from om_lib.messages import Message
from om_lib.prompts.observer import (
    ObserverTranscript,
    ParsedObservations,
    build_multi_thread_observer_request,
    build_observer_request,
    build_observer_system_prompt,
    detect_degenerate_repetition,
    format_messages_for_observer,
    is_unusable_observer_output,
    parse_multi_thread_observer_output,
    parse_observer_output,
    prepare_observer_context,
    sanitize_observation_lines,
    sort_observations_by_time,
    strip_thread_tags,
    truncate_observations_to_token_budget,
)

TRUNCATION_NOTICE = 'Previous observations were truncated for context budget reasons.'


def words(text: str) -> int:
    return len(text.split())


def msg(role: str, parts: list[dict], *, at: datetime | None = None, mid: str = 'm') -> Message:
    return Message.model_validate(
        {'id': mid, 'role': role, 'createdAt': at or datetime(2025, 12, 4, 14, 30, tzinfo=UTC), 'parts': parts}
    )


def request(**overrides) -> str:
    args = {
        'transcript': ObserverTranscript(text='Dec 4 2025:\nUser (14:30): hello'),
        'previous_observations': '',
        'was_truncated': False,
        'prior_current_task': None,
        'prior_suggested_response': None,
        'prior_thread_title': None,
        'thread_title': False,
    }
    args.update(overrides)
    return build_observer_request(**args)


# --- system prompt (§13.1, E26) -------------------------------------------------------------------------------------


def test_system_prompt_has_sections_and_tags():
    # Given the default options / When the prompt is built
    prompt = build_observer_system_prompt()

    # Then every required section and format fact is present, and no title section
    for fact in (
        '=== OUTPUT FORMAT ===',
        '=== GUIDELINES ===',
        '=== IMPORTANT: THREAD ATTRIBUTION ===',
        '<observations>',
        'Date: Dec 4, 2025',
        '* 🔴 (14:30)',
        '<current-task>',
        '<suggested-response>',
        '✅',
        '🟡',
        '🟢',
    ):
        assert fact in prompt
    assert '<thread-title>' not in prompt
    assert 'CUSTOM INSTRUCTIONS' not in prompt


def test_system_prompt_instruction_goes_last_and_none_equals_absent():
    prompt = build_observer_system_prompt(instruction='Track every dietary restriction.')

    assert prompt.endswith('\n\n=== CUSTOM INSTRUCTIONS ===\n\nTrack every dietary restriction.')
    assert '<current-task>' in prompt
    assert build_observer_system_prompt(instruction=None) == build_observer_system_prompt()


def test_system_prompt_thread_title_only_when_enabled():
    assert '<thread-title>' in build_observer_system_prompt(thread_title=True)
    assert '<thread-title>' not in build_observer_system_prompt(thread_title=False)


def test_multi_thread_system_prompt():
    prompt = build_observer_system_prompt(multi_thread=True, thread_title=True, instruction='X')

    assert '=== MULTI-THREAD INPUT ===' in prompt
    assert '<thread-title>Feature X implementation</thread-title>' in prompt
    assert 'current-task, suggested-response, and thread-title' in prompt
    assert prompt.endswith('=== CUSTOM INSTRUCTIONS ===\n\nX')
    assert '<thread-title>' not in build_observer_system_prompt(multi_thread=True)


# --- request message (§13.4, E26, H46) -------------------------------------------------------------------------------


def test_request_prior_metadata_present():
    text = request(prior_current_task='Fix the login bug', prior_suggested_response='Ask for the stack trace')

    assert '## Prior Thread Metadata' in text
    assert '- prior current-task: Fix the login bug' in text
    assert '- prior suggested-response: Ask for the stack trace' in text
    assert 'prior thread-title' not in text


def test_request_prior_metadata_absent_without_hints():
    assert '## Prior Thread Metadata' not in request()
    # A title alone does not count when titles are disabled.
    assert '## Prior Thread Metadata' not in request(prior_thread_title='Old title')


def test_request_prior_thread_title_when_enabled():
    text = request(prior_thread_title='Auth bug fix', thread_title=True)

    assert '- prior thread-title: Auth bug fix' in text


def test_request_task_comes_after_history():
    text = request(previous_observations='* 🔴 (10:00) User likes tea', prior_current_task='Brew tea')

    history = text.index('## New Message History to Observe\n\n')
    assert text.index('## Previous Observations') < text.index('## Prior Thread Metadata') < history
    assert history < text.index('\n\n---\n\n## Your Task\n\n')
    assert 'User (14:30): hello' in text[history : text.index('## Your Task')]
    assert 'Do not repeat' in text


def test_request_truncation_notice_exactly_once_even_with_empty_context():
    assert request(previous_observations='* 🔴 a', was_truncated=True).count(TRUNCATION_NOTICE) == 1
    text = request(previous_observations='', was_truncated=True)
    assert text.count(TRUNCATION_NOTICE) == 1
    assert '## Previous Observations' not in text
    assert TRUNCATION_NOTICE not in request(previous_observations='* 🔴 a')


def test_request_skip_continuation_hints():
    text = request(skip_continuation_hints=True)

    tail = text[text.index('## Your Task') :]
    assert '<observations>' in tail
    assert '<current-task>' in tail


def test_multi_thread_request():
    threads = [
        ('t1', ObserverTranscript(text='User (09:00): one'), 'Task one', None, None),
        ('t2', ObserverTranscript(text='User (09:05): two'), None, None, None),
    ]

    text = build_multi_thread_observer_request(threads, '* 🔴 old', True, False)

    assert '<thread id="t1">\nUser (09:00): one\n</thread>' in text
    assert '<thread id="t2">\nUser (09:05): two\n</thread>' in text
    assert '2 separate conversation threads' in text
    assert '- thread t1\n  - prior current-task: Task one' in text
    assert '- thread t2' not in text
    assert text.count(TRUNCATION_NOTICE) == 1
    assert text.index('</thread>') < text.index('## Your Task')


# --- formatter (§13.3, I52) ------------------------------------------------------------------------------------------


def test_formatter_roles_dates_and_attachments():
    messages = [
        msg(
            'user',
            [
                {'type': 'text', 'text': 'Here is the board'},
                {'type': 'image', 'url': 'https://cdn.example.com/img/reference-board.png'},
                {'type': 'file', 'url': 's3://bucket/docs/floorplan.pdf', 'mediaType': 'application/pdf'},
            ],
            mid='u1',
        ),
        msg('assistant', [{'type': 'text', 'text': 'Got it'}], at=datetime(2025, 12, 5, 9, 15, tzinfo=UTC), mid='a1'),
    ]

    transcript = format_messages_for_observer(messages)

    assert 'Dec 4 2025:' in transcript.text
    assert 'Dec 5 2025:' in transcript.text
    assert 'User (14:30): Here is the board' in transcript.text
    assert '[Image #1: reference-board.png]' in transcript.text
    assert '[File #1: floorplan.pdf]' in transcript.text
    assert 'Assistant (09:15): Got it' in transcript.text
    assert [(a.kind, a.index, a.label) for a in transcript.attachments] == [
        ('image', 1, 'reference-board.png'),
        ('file', 1, 'floorplan.pdf'),
    ]
    assert transcript.attachments[1].media_type == 'application/pdf'


def test_formatter_attachment_labels_and_image_like_files():
    parts = [
        {'type': 'file', 'url': 'https://x.test/a/My%20Photo.JPG'},
        {'type': 'file', 'data': 'data:image/png;base64,AAAA'},
        {'type': 'file', 'data': 'QUJD', 'mediaType': 'text/csv'},
        {'type': 'image', 'data': 'AAAA', 'filename': 'shot.webp'},
    ]

    transcript = format_messages_for_observer([msg('user', parts)])

    assert '[Image #1: My Photo.JPG]' in transcript.text
    assert '[Image #2: image/png]' in transcript.text
    assert '[File #1: text/csv]' in transcript.text
    assert '[Image #3: shot.webp]' in transcript.text
    assert transcript.attachments[1].data == 'AAAA'
    assert transcript.attachments[1].media_type == 'image/png'


def test_formatter_omits_messages_with_nothing_visible():
    messages = [
        msg('assistant', [{'type': 'reasoning', 'text': ''}], mid='r'),
        msg('user', [{'type': 'text', 'text': '   '}], mid='e'),
        msg('assistant', [{'type': 'reasoning', 'text': 'think'}, {'type': 'text', 'text': 'hi'}], mid='ok'),
    ]

    text = format_messages_for_observer(messages).text

    assert text.count('Assistant') == 1
    assert 'Reasoning (14:30): think' in text
    assert 'User' not in text


def test_formatter_tool_lines_and_time_only_when_changed():
    messages = [
        msg(
            'assistant',
            [
                {'type': 'text', 'text': 'Searching'},
                {'type': 'tool-call', 'toolCallId': 'c1', 'toolName': 'search', 'args': {'q': 'pgx'}},
            ],
        ),
        msg('tool', [{'type': 'tool-result', 'toolCallId': 'c1', 'toolName': 'search', 'result': 'found'}]),
        msg(
            'tool', [{'type': 'tool-result', 'toolCallId': 'c2', 'toolName': 'fetch', 'result': 'no', 'isError': True}]
        ),
        msg('user', [{'type': 'text', 'text': 'thanks'}]),
    ]

    lines = format_messages_for_observer(messages).text.split('\n')

    assert lines == [
        'Dec 4 2025:',
        'Assistant (14:30): Searching',
        'Tool Call search (14:30): {"q": "pgx"}',
        'Tool Result search (14:30): found',
        'Tool Error fetch (14:30): no',
        'User: thanks',
    ]


def test_formatter_timezone():
    text = format_messages_for_observer([msg('user', [{'type': 'text', 'text': 'late'}])], timezone='Asia/Tokyo').text

    assert text.startswith('Dec 4 2025:\nUser (23:30): late')
    fallback = format_messages_for_observer([msg('user', [{'type': 'text', 'text': 'x'}])], timezone='Not/AZone').text
    assert fallback == 'Dec 4 2025:\nUser (14:30): x'


def test_formatter_system_reminder_not_labelled_user():
    reminder = '<system-reminder>This message is not from the user.</system-reminder>'

    text = format_messages_for_observer([msg('user', [{'type': 'text', 'text': reminder}])]).text

    assert 'system-reminder (14:30): This message is not from the user.' in text
    assert 'User' not in text


def test_formatter_encrypted_content_and_truncation():
    result = {'encryptedContent': 'x' * 6000, 'snippet': 'useful snippet ' * 3000}
    part = {'type': 'tool-result', 'toolCallId': 't', 'toolName': 'web_search', 'result': result}

    full = format_messages_for_observer([msg('assistant', [part])], count=words).text
    small = format_messages_for_observer([msg('assistant', [part])], max_tool_result_tokens=200, count=words).text

    assert 'Tool Result web_search' in full
    assert '[stripped encryptedContent: 6000 characters]' in full
    assert 'x' * 300 not in full
    assert '[stripped encryptedContent: 6000 characters]' in small
    assert '[truncated ~' in small
    body = small.split(': ', 1)[1].split('\n... [truncated ~')[0]
    assert words(body) <= 200


def test_formatter_short_encrypted_content_kept_and_max_part_length():
    part = {'type': 'tool-result', 'toolCallId': 't', 'toolName': 'x', 'result': {'encryptedContent': 'short'}}
    text = format_messages_for_observer([msg('assistant', [part, {'type': 'text', 'text': 'abcdefghij'}])]).text
    assert '"encryptedContent": "short"' in text

    cut = format_messages_for_observer([msg('user', [{'type': 'text', 'text': 'abcdefghij'}])], max_part_length=4).text
    assert 'abcd\n... [truncated 6 characters]' in cut


# --- parsing (§13.5, I50) --------------------------------------------------------------------------------------------


def test_parse_full_output():
    out = (
        '<observations>\nDate: Dec 4, 2025\n* 🔴 (14:30) User likes tea\n</observations>\n\n'
        '<current-task>\n- Primary: brew tea\n</current-task>\n\n'
        '<suggested-response>\nOffer green tea\n</suggested-response>\n'
        '<thread-title>Tea time</thread-title>'
    )

    parsed = parse_observer_output(out)

    assert parsed.observations == 'Date: Dec 4, 2025\n* 🔴 (14:30) User likes tea'
    assert parsed.current_task == '- Primary: brew tea'
    assert parsed.suggested_response == 'Offer green tea'
    assert parsed.thread_title == 'Tea time'
    assert not parsed.degenerate
    assert parsed.raw == out
    assert not is_unusable_observer_output(parsed)


def test_parse_inline_observation_tag_mentions_do_not_end_block():
    out = (
        '<observations>\n'
        '* 🟡 (10:00) User discussed <observations> tags\n'
        '* 🟡 (10:01) Assistant said </observations> ends the section\n'
        '* 🟡 (10:02) Code: if a < b: return\n'
        '</observations>'
    )

    parsed = parse_observer_output(out)

    assert parsed.observations.count('\n') == 2
    assert '</observations> ends the section' in parsed.observations
    assert 'a < b' in parsed.observations


def test_parse_inline_closing_task_tag_is_kept():
    out = (
        '<observations>\n* 🔴 obs\n</observations>\n'
        '<current-task>\nPrimary: handle a stray </current-task> in text\n</current-task>'
    )

    assert parse_observer_output(out).current_task == 'Primary: handle a stray </current-task> in text'


def test_parse_unclosed_observations_falls_back_to_list_lines():
    out = '<observations>\nSome preamble\n* 🔴 First\n  - nested detail\n1. numbered\n'

    parsed = parse_observer_output(out)

    assert parsed.observations == '* 🔴 First\n  - nested detail\n1. numbered'


def test_parse_no_tags_list_lines_only():
    parsed = parse_observer_output('- 🔴 Simple observation')

    assert parsed.observations == '- 🔴 Simple observation'
    assert parsed.current_task is None
    assert parsed.suggested_response is None


def test_parse_empty_tags_give_none_and_hints_never_in_observations():
    out = (
        '<observations>\n* 🔴 a\n<current-task>\n- Primary: sneaky\n</current-task>\n</observations>\n'
        '<suggested-response>\n</suggested-response>\n<thread-title></thread-title>'
    )

    parsed = parse_observer_output(out)

    assert parsed.observations == '* 🔴 a'
    assert parsed.current_task == '- Primary: sneaky'
    assert parsed.suggested_response is None
    assert parsed.thread_title is None


def test_parse_fallback_ignores_hint_list_lines():
    parsed = parse_observer_output('* 🔴 fact\n<current-task>\n- Primary: do it\n</current-task>')

    assert parsed.observations == '* 🔴 fact'
    assert parsed.current_task == '- Primary: do it'


def test_parse_one_line_current_task_accepted():
    parsed = parse_observer_output('<observations>\n* 🔴 a\n</observations>\n<current-task>Primary: x</current-task>')

    assert parsed.current_task == 'Primary: x'


def test_parse_joins_blocks_strips_thread_tags_and_sorts():
    out = (
        '<observations>\n<thread id="t1">\nDate: Dec 4, 2025\n* 🟡 (15:00) later\n* 🔴 (09:00) earlier\n'
        '* 🟢 (12:00) extra\n</thread>\n</observations>\n<observations>\n* 🟢 (16:00) more\n</observations>'
    )

    parsed = parse_observer_output(out)

    assert parsed.observations == (
        'Date: Dec 4, 2025\n* 🔴 (09:00) earlier\n* 🟢 (12:00) extra\n* 🟡 (15:00) later\n* 🟢 (16:00) more'
    )


def test_strip_thread_tags_keeps_thread_title():
    assert strip_thread_tags('<THREAD id="a">\nx <thread-title>t</thread-title>\n</thread >') == (
        'x <thread-title>t</thread-title>'
    )


def test_parse_degenerate_output():
    parsed = parse_observer_output('<observations>\n' + 'getLanguageModel().doGenerate(options), ' * 200)

    assert parsed.degenerate
    assert parsed.observations == ''
    assert is_unusable_observer_output(parsed)


# --- unusable output ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'raw',
    [
        'I could not find anything worth noting in this conversation.',
        '',
        '<observations>\n</observations>',
        '<current-task>\n- Primary: x\n</current-task>',
    ],
)
def test_unusable_output(raw):
    assert is_unusable_observer_output(parse_observer_output(raw))


def test_unusable_when_raw_has_neither_tags_nor_list_lines():
    assert is_unusable_observer_output(ParsedObservations(observations='something', raw='plain prose'))


# --- multi-thread parsing (§13.5, K58) ------------------------------------------------------------------------------


def test_multi_thread_parse_with_missing_thread():
    out = (
        '<observations>\n'
        '<thread id="t1">\nDate: Dec 4, 2025\n* 🔴 (10:00) one\n'
        '<current-task>Primary: t1 task</current-task>\n<suggested-response>Reply</suggested-response>\n'
        '<thread-title>First</thread-title>\n</thread>\n'
        '<thread id="ghost">\n* 🔴 invented\n</thread>\n'
        '</observations>'
    )

    result = parse_multi_thread_observer_output(out, ['t1', 't2'])

    assert set(result) == {'t1', 't2'}
    assert result['t1'].observations == 'Date: Dec 4, 2025\n* 🔴 (10:00) one'
    assert result['t1'].current_task == 'Primary: t1 task'
    assert result['t1'].suggested_response == 'Reply'
    assert result['t1'].thread_title == 'First'
    assert result['t1'].covered
    assert result['t2'].observations == ''
    assert result['t2'].current_task is None
    assert not result['t2'].degenerate
    # t2 has no section: it was not observed, and its cursor must not move
    assert not result['t2'].covered


def test_multi_thread_parse_degenerate():
    result = parse_multi_thread_observer_output('loop forever and ever, ' * 200, ['a', 'b'])

    assert all(r.degenerate and r.observations == '' for r in result.values())


# --- sanitizing and degenerate detection (§13.7, I51) ----------------------------------------------------------------


def test_sanitize_caps_long_lines_only():
    text = 'short\n' + 'y' * 15_000 + '\nalso short'

    lines = sanitize_observation_lines(text).split('\n')

    assert lines[0] == 'short'
    assert lines[1] == 'y' * 10_000 + ' … [truncated]'
    assert lines[2] == 'also short'
    assert sanitize_observation_lines('') == ''


def test_degenerate_repeated_blocks():
    block = ('The quick brown fox jumps over the lazy dog while the observer loops again and again. ' * 2)[:100]
    assert detect_degenerate_repetition(block * 25)
    assert detect_degenerate_repetition('getLanguageModel().doGenerate(options: ...): PromiseLike<...>, ' * 100)
    assert detect_degenerate_repetition('a' * 60_000)


def test_degenerate_cycle_of_lines():
    cycle = [f'* 🟡 (10:0{i}) Assistant called the same tool again with arguments {i}' for i in range(3)]
    assert detect_degenerate_repetition('\n'.join(cycle * 20))


def test_degenerate_short_line_loop():
    assert detect_degenerate_repetition('\n'.join(['- ok', '- no'] * 3000))


def test_not_degenerate_normal_bullets():
    bullets = '\n'.join(
        f'* 🟡 ({10 + i // 60:02d}:{i % 60:02d}) User mentioned item number {i} with detail {i * 37 % 101}'
        for i in range(120)
    )
    assert len(bullets) > 2000
    assert not detect_degenerate_repetition(bullets)


def test_not_degenerate_under_2000_chars():
    assert not detect_degenerate_repetition('x' * 1999)
    assert not detect_degenerate_repetition('same line repeated here\n' * 80)


def test_not_degenerate_small_consecutive_duplicate():
    bullets = [f'* 🟡 (11:{i:02d}) distinct observation about topic {i} with its own details' for i in range(40)]
    bullets.insert(10, bullets[9])  # one accidental duplicate
    assert not detect_degenerate_repetition('\n'.join(bullets))


# --- sort by time (§13.8) -------------------------------------------------------------------------------------------


def test_sort_by_time_moves_sub_items_and_keeps_groups():
    text = (
        'Date: Dec 4, 2025\n* 🟡 (15:00) b\n  * -> detail of b\n* 🔴 (09:30) a\n\n'
        'Date: Dec 5, 2025\n* 🔴 (08:00) c\n* 🟡 (07:00) d'
    )

    assert sort_observations_by_time(text) == (
        'Date: Dec 4, 2025\n* 🔴 (09:30) a\n* 🟡 (15:00) b\n  * -> detail of b\n\n'
        'Date: Dec 5, 2025\n* 🟡 (07:00) d\n* 🔴 (08:00) c'
    )


@pytest.mark.parametrize(
    'group',
    [
        '* 🟡 (15:00) b\n* 🔴 no time',  # an item without a time
        '* 🟡 (3:00 PM) b\n* 🔴 (09:00) a',  # mixed AM/PM marking
        '* 🟡 (3:00) b\n* 🔴 (2:00) a',  # 12h or 24h? unknowable
        '* 🟡 (15:00) b\nfree text\n* 🔴 (09:00) a',  # non-list line inside the group
    ],
)
def test_sort_by_time_leaves_ambiguous_groups(group):
    text = f'Date: Dec 4, 2025\n{group}'
    assert sort_observations_by_time(text) == text


def test_sort_by_time_am_pm():
    text = 'Date: Dec 4, 2025\n* 🟡 (1:00 PM) b\n* 🔴 (11:00 AM) a\n* 🔴 (12:05 AM) z'

    assert sort_observations_by_time(text).split('\n')[1:] == [
        '* 🔴 (12:05 AM) z',
        '* 🔴 (11:00 AM) a',
        '* 🟡 (1:00 PM) b',
    ]


# --- observer context budget (§14, H46–H49) --------------------------------------------------------------------------


def numbered_lines(n: int) -> str:
    return '\n'.join(f'* 🟡 (10:00) observation line {i:03d} about something' for i in range(1, n + 1))


def test_h46_budget_truncates_observer_view_only():
    stored = numbered_lines(400)

    context, truncated = prepare_observer_context(stored, 200, words)

    assert truncated
    assert words(context) <= 200
    assert 'observations truncated here]' in context
    assert 'line 400' in context
    assert 'line 001' not in context
    assert 'line 001' in stored
    prompt = request(previous_observations=context, was_truncated=truncated)
    assert prompt.count(TRUNCATION_NOTICE) == 1


def test_h47_budget_false_zero_and_tiny():
    stored = numbered_lines(5)

    assert prepare_observer_context(stored, False, words) == (stored, False)
    assert prepare_observer_context(stored, None, words) == (stored, False)
    assert prepare_observer_context(stored, 0, words) == ('', True)
    assert prepare_observer_context(stored, 0, words, buffered_reflection='R', reflected_line_count=2) == ('', True)
    assert truncate_observations_to_token_budget('Line one\nLine two\nLine three', 1, words) == (
        '[3 observations truncated here]'
    )
    assert truncate_observations_to_token_budget(stored, 0, words) == ''
    assert prepare_observer_context(stored, 10_000, words) == (stored, False)


def test_h48_important_lines_kept_when_room():
    lines = ['* 🔴 (09:00) old critical fact'] + [f'* 🟡 (10:00) filler {i}' for i in range(30)]
    text = '\n'.join(lines)

    result = truncate_observations_to_token_budget(text, 40, words)

    kept = result.split('\n')
    assert kept[0] == '* 🔴 (09:00) old critical fact'
    assert kept[1].endswith('observations truncated here]')
    assert kept[-1] == '* 🟡 (10:00) filler 29'
    assert words(result) <= 40


def test_h48_oldest_important_dropped_first_and_half_tail():
    lines = (
        ['* 🔴 oldest red fact here']
        + [f'* 🟡 filler {i}' for i in range(10)]
        + ['* ✅ newer done item']
        + [f'* 🟡 filler b{i}' for i in range(10)]
    )
    text = '\n'.join(lines)

    # Room for the ✅ line, two markers and a short tail, but not for the older 🔴 line as well.
    result = truncate_observations_to_token_budget(text, 22, words)

    assert 'oldest red fact' not in result
    assert '* ✅ newer done item' in result
    kept = [line for line in result.split('\n') if 'truncated here' not in line]
    tail = [line for line in kept if 'filler b' in line]
    assert len(tail) * 2 >= len(kept)
    assert words(result) <= 22


def test_truncation_one_line_gap_keeps_line():
    text = 'old a b c d\nold e f g h\n* 🔴 r\ng\ntail a\ntail b'

    result = truncate_observations_to_token_budget(text, 12, words)

    assert result == '[2 observations truncated here]\n* 🔴 r\ng\ntail a\ntail b'


def test_truncation_falls_back_to_leaner_candidate():
    # Keeping the 🔴 line costs a second marker that does not fit; the plain tail still does.
    text = '* 🔴 a1\n* 🟡 b1\n* 🟡 c1\n* 🟡 d1 d1 d1 d1 d1 d1'

    result = truncate_observations_to_token_budget(text, 12, words)

    assert result == '[3 observations truncated here]\n* 🟡 d1 d1 d1 d1 d1 d1'


def test_h49_buffered_reflection_replaces_covered_lines():
    stored = 'line one\nline two\nline three'

    context, truncated = prepare_observer_context(
        stored, 5000, words, buffered_reflection='REFLECTION', reflected_line_count=2
    )
    assert context == 'REFLECTION\n\nline three'
    assert not truncated
    assert 'line one' not in context

    ignored, _ = prepare_observer_context(stored, 5000, words, buffered_reflection='REFLECTION')
    assert ignored == stored

    all_covered, _ = prepare_observer_context(stored, 5000, words, buffered_reflection='R', reflected_line_count=3)
    assert all_covered == 'R'


def test_truncation_is_fast_for_hundreds_of_lines():
    text = '\n'.join(
        f'* {"🔴" if i % 7 == 0 else "🟡"} (10:00) observation {i} with a handful of extra words' for i in range(600)
    )
    started = time.perf_counter()

    result = truncate_observations_to_token_budget(text, 2000, words)

    assert time.perf_counter() - started < 2
    assert words(result) <= 2000
    assert 'observation 599' in result
