"""The reference's own answer-shape tests, ported: what its parsers, degenerate check and compression ladder accept
and refuse, run against ours (om_lib/prompts/observer.py, om_lib/prompts/reflector.py, om_lib/prompts/log_check.py,
the engine).

Each test is named after the reference test it follows (mastra-ai/mastra,
`packages/memory/src/processors/observational-memory/__tests__/`: `observational-memory.test.ts`,
`observer-degenerate-output.test.ts`, `reflector-compression-ladder.test.ts`, `reflector-empty-and-backoff.test.ts`).
Every accepted shape must also pass our answer check, so it really becomes memory.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from om_lib.errors import ModelOutputError
from om_lib.prompts import observer as obs
from om_lib.prompts.log_check import (
    NOTE_MOSTLY_PROSE,
    NOTE_NEWEST_DATE_MISSING,
    NOTE_REPEATED_ITEM,
    answer_notes,
    observation_log_problem,
    reflection_notes,
    reflection_problem,
)
from om_lib.prompts.reflector import (
    InvalidReflectionError,
    LadderResult,
    ParsedReflection,
    RetryInfo,
    run_compression_ladder,
)
from tests.unit.test_engine import Harness, config, words


def parse_observer(text: str) -> obs.ParsedObservations:
    return obs.parse_observer_output(text)


def parse_reflector(text: str) -> ParsedReflection:
    """The Reflector's parser as the engine runs it (the Observer's sanitizer and degenerate check)."""
    from om_lib.prompts.reflector import parse_reflector_output

    return parse_reflector_output(
        text, sanitize=obs.sanitize_observation_lines, is_degenerate=obs.detect_degenerate_repetition
    )


def accepted_observer(text: str) -> str:
    """Parse an Observer answer and assert that it would become memory; its observations."""
    parsed = parse_observer(text)
    assert obs.observer_output_problem(parsed) is None, obs.observer_output_problem(parsed)
    assert not obs.is_unusable_observer_output(parsed)
    return parsed.observations


# ---------------------------------------------------------------------------------------------------------------------
# observational-memory.test.ts: parseObserverOutput
# ---------------------------------------------------------------------------------------------------------------------
def test_should_extract_observations_from_output() -> None:
    out = accepted_observer(
        '\n- 🔴 User asked about React [topic_discussed]\n- 🟡 User prefers examples [user_preference]\n'
    )
    assert '🔴 User asked about React' in out and '🟡 User prefers examples' in out


def test_should_handle_output_without_continuation_hint() -> None:
    parsed = parse_observer('- 🔴 Simple observation')
    assert '- 🔴 Simple observation' in parsed.observations
    assert parsed.current_task is None and parsed.suggested_response is None
    assert observation_log_problem(parsed.observations) is None


def test_should_handle_malformed_xml_with_unclosed_tags_by_using_fallback() -> None:
    out = accepted_observer('<observations>\n- 🔴 User preference noted\n- 🟡 Some context\n')
    assert '🔴 User preference noted' in out and '🟡 Some context' in out


def test_should_handle_code_blocks_containing_lt_characters() -> None:
    parsed = parse_observer(
        '<observations>\n- 🔴 User is working on React component\n'
        '- 🟡 Code example discussed: `const x = a < b ? a : b;`\n'
        '- 🔴 User prefers arrow functions: `const fn = () => {}`\n</observations>\n\n'
        '<current-task>\nHelp user with conditional rendering\n</current-task>'
    )
    assert 'a < b' in parsed.observations and observation_log_problem(parsed.observations) is None
    assert parsed.current_task == 'Help user with conditional rendering'
    assert 'Help user with conditional rendering' not in parsed.observations


def test_should_not_capture_inline_observations_tags_that_appear_mid_line() -> None:
    parsed = parse_observer(
        '<observations>\n- 🔴 User asked about XML parsing\n'
        '- 🟡 Mentioned that <observations> tags are used for memory\n'
        '- 🔴 User wants to understand the format\n</observations>\n\n'
        '<current-task>\nExplain the <observations> tag format to user\n</current-task>'
    )
    assert '<observations> tags are used for memory' in parsed.observations
    assert parsed.current_task == 'Explain the <observations> tag format to user'
    assert observation_log_problem(parsed.observations) is None


def test_should_not_capture_inline_current_task_tags_that_appear_mid_line() -> None:
    parsed = parse_observer(
        '<observations>\n- 🔴 User discussed the <current-task> section format\n'
        '- 🟡 User wants to know how <current-task> is parsed\n</observations>\n\n'
        '<current-task>\nHelp user understand memory XML structure\n</current-task>'
    )
    assert '<current-task> section format' in parsed.observations
    assert parsed.current_task == 'Help user understand memory XML structure'


def test_should_not_capture_inline_suggested_response_tags_that_appear_mid_line() -> None:
    parsed = parse_observer(
        '<observations>\n- 🔴 User asked about <suggested-response> usage\n</observations>\n\n'
        '<current-task>\nExplain <suggested-response> tag purpose\n</current-task>\n\n'
        '<suggested-response>\nThe <suggested-response> tag helps maintain conversation flow\n</suggested-response>'
    )
    assert 'User asked about <suggested-response> usage' in parsed.observations
    assert '<suggested-response> tag helps maintain' in (parsed.suggested_response or '')


def test_should_handle_nested_code_blocks_with_xml_like_content() -> None:
    # An observation holding a fenced code block: the code lines are the item's detail, not prose to refuse.
    parsed = parse_observer(
        '<observations>\n- 🔴 User is building an XML parser\n- 🟡 Example code discussed:\n'
        "  ```javascript\n  const xml = '<observations>test</observations>';\n  const parsed = parseXml(xml);\n  ```\n"
        '</observations>\n\n<current-task>\nHelp user implement XML parsing\n</current-task>'
    )
    assert 'User is building an XML parser' in parsed.observations
    assert parsed.current_task == 'Help user implement XML parsing'
    assert 'Help user implement XML parsing' not in parsed.observations
    assert obs.observer_output_problem(parsed) is None and answer_notes(parsed.observations) == ()


def test_should_not_be_truncated_by_inline_closing_tags_like_observations() -> None:
    out = accepted_observer(
        '<observations>\n- 🔴 User mentioned that </observations> ends the section\n'
        '- 🟡 User also discussed </current-task> syntax\n- 🔴 Important: preserve all content\n</observations>\n\n'
        '<current-task>\nHelp user understand XML tag boundaries\n</current-task>'
    )
    assert 'User mentioned that </observations> ends the section' in out
    assert 'Important: preserve all content' in out


def test_should_not_be_truncated_by_inline_closing_current_task_tag() -> None:
    parsed = parse_observer(
        '<observations>\n- 🔴 User info here\n</observations>\n\n'
        '<current-task>\nUser asked about </current-task> parsing and how it works\n</current-task>'
    )
    assert 'User asked about </current-task> parsing' in (parsed.current_task or '')
    assert 'parsing and how it works' not in parsed.observations


def test_should_truncate_lines_exceeding_10k_characters() -> None:
    # Over-long lines are cut and marked, never a reason to refuse the answer (a giant line of varied text is parsed
    # whole below, in `test_truncates_a_giant_single_line_instead_of_flagging_it_as_degenerate`).
    out = obs.sanitize_observation_lines(f'- 🔴 Short line\n{"x" * 15_000}\n- 🟡 Another line')
    assert observation_log_problem(out) is None
    lines = out.split('\n')
    assert '- 🔴 Short line' in lines and '- 🟡 Another line' in lines
    assert ' … [truncated]' in out and max(len(line) for line in lines) < 11_100


def test_should_strip_ephemeral_anchors_before_canonical_storage() -> None:
    parsed = parse_reflector(
        '[O1] - 🔴 First observation\n  [O1-N1] - 🟡 Nested observation\n[O2] - 🔴 Second observation'
    )
    assert parsed.observations == '- 🔴 First observation\n  - 🟡 Nested observation\n- 🔴 Second observation'


def test_should_detect_repeated_content_patterns() -> None:
    block = (
        'getLanguageModel().doGenerate(options: LanguageModelV2CallOptions): '
        'PromiseLike<LanguageModelV2GenerateResult>, '
    )
    assert obs.detect_degenerate_repetition(block * 100)


def test_should_detect_extremely_long_single_lines() -> None:
    assert obs.detect_degenerate_repetition('a' * 60_000)


def test_should_return_false_for_normal_and_short_text() -> None:
    assert not obs.detect_degenerate_repetition('- 🔴 User asked about React\n- 🟡 Some context\n- 🔴 Another')
    assert not obs.detect_degenerate_repetition('hello')


def test_should_flag_degenerate_output_in_parse_observer_output() -> None:
    block = 'StreamTextResult.getLanguageModel().doGenerate(options): PromiseLike<Result>, '
    parsed = parse_observer(f'<observations>\n{block * 100}\n</observations>')
    assert parsed.degenerate and parsed.observations == ''
    assert obs.observer_output_problem(parsed) is not None


# ---------------------------------------------------------------------------------------------------------------------
# observational-memory.test.ts: parseReflectorOutput (and reflections in the shapes models write)
# ---------------------------------------------------------------------------------------------------------------------
def test_reflector_should_extract_observations_from_output() -> None:
    # List lines with bold section titles, tags, sub-items, no `Date:` header anywhere.
    parsed = parse_reflector(
        '\n- 🔴 **Project Context** [current_project]\n  - User is building a dashboard\n'
        '- 🟡 **Progress** [task]\n  - Completed auth implementation\n'
    )
    assert 'Project Context' in parsed.observations and 'Completed auth implementation' in parsed.observations
    assert (
        reflection_problem(parsed.observations, 'Date: Mar 3, 2025\n* 🔴 (09:00) User is building a dashboard') is None
    )


def test_should_strip_ephemeral_anchor_ids_from_reflector_output() -> None:
    parsed = parse_reflector(
        '\n<observations>\n[O1] - 🔴 Critical project context\n  [O1-N1] - 🟡 Nested detail\n</observations>\n'
    )
    assert 'Critical project context' in parsed.observations and 'Nested detail' in parsed.observations
    assert '[O1]' not in parsed.observations and '[O1-N1]' not in parsed.observations
    assert reflection_problem(parsed.observations, '* 🔴 source') is None


def test_reflector_should_handle_malformed_xml_with_unclosed_tags_by_using_fallback() -> None:
    parsed = parse_reflector('<observations>\n- 🔴 User preference noted\n- 🟡 Some context\n')
    assert '🔴 User preference noted' in parsed.observations
    assert reflection_problem(parsed.observations, '* source') is None


def test_reflector_should_not_be_truncated_by_inline_closing_tags_like_observations() -> None:
    parsed = parse_reflector(
        '<observations>\n- 🔴 User mentioned that </observations> ends the section\n'
        '- 🟡 User also discussed </current-task> syntax\n- 🔴 Important: preserve all content\n</observations>\n\n'
        '<current-task>\nHelp user understand XML tag boundaries\n</current-task>'
    )
    assert 'User mentioned that </observations> ends the section' in parsed.observations
    assert 'Important: preserve all content' in parsed.observations


def test_reflector_should_handle_code_blocks_with_xml_like_content() -> None:
    parsed = parse_reflector(
        '<observations>\n- 🔴 User is building an XML parser\n'
        "- 🟡 Example: `const xml = '<observations>test</observations>';`\n"
        '</observations>\n\n<current-task>\nHelp user implement XML parsing\n</current-task>'
    )
    assert 'User is building an XML parser' in parsed.observations
    assert 'Help user implement XML parsing' not in parsed.observations


SOURCE_LOG = '\n'.join(
    [
        'Date: Mar 3, 2025',
        *[f'* 🔴 (09:{i:02d}) User stated fact {i} about the launch plan and its owners' for i in range(8)],
        'Date: Mar 4, 2025',
        *[f'* 🟡 (10:{i:02d}) User asked question {i} about the budget and the dates' for i in range(8)],
    ]
)


@pytest.mark.parametrize(
    'reflection',
    [
        pytest.param('* 🔴 User stated the launch plan facts\n* 🟡 User asked about the budget', id='no-date-headers'),
        pytest.param(
            '- 🔴 **Launch plan** (Mar 3)\n  - facts 0-7 about owners\n- 🟡 **Budget** (Mar 4)\n  - questions 0-7',
            id='bold-titles-dates-inline',
        ),
        pytest.param('[O1] * 🔴 User stated the launch facts\n[O2] * 🟡 User asked budget questions', id='anchors'),
        pytest.param('* 🔴 (09:00) User stated the launch facts\n* 🟡 (10:00) Budget questions', id='times-no-header'),
        pytest.param(
            'The user has spent two days planning a launch with named owners and a budget.\n'
            '* 🟡 (10:07) User asked the last budget question',
            id='paragraph-above-bullets',
        ),
    ],
)
def test_a_reflection_in_any_valid_shape_is_one_call_and_commits(reflection: str) -> None:
    # The shapes the reference accepts: one model call, no retry, a result to commit.
    calls: list[int] = []

    def model(_prompt: str, level: int) -> str:
        calls.append(level)
        return f'<observations>\n{reflection}\n</observations>'

    result = run_compression_ladder(
        SOURCE_LOG,
        call=model,
        count=len,
        target=len(SOURCE_LOG),
        parse=parse_reflector,
        check=lambda text: reflection_problem(text, SOURCE_LOG),
    )
    assert calls == [0] and result.attempts == 1 and result.under_target


@pytest.mark.parametrize(
    'answer',
    [
        pytest.param("I'm sorry, but I can't help with rewriting these notes.", id='refusal'),
        pytest.param(
            '<observations>\nThe user has been talking about a launch for a few days. They seem organised.\n'
            'The assistant has helped them think through owners and dates.\n</observations>',
            id='essay',
        ),
        pytest.param('<observations>\n\n</observations>', id='empty'),
    ],
)
def test_what_is_certainly_not_an_observation_log_is_refused_at_every_level(answer: str) -> None:
    calls: list[int] = []

    def model(_prompt: str, level: int) -> str:
        calls.append(level)
        return answer

    with pytest.raises(ModelOutputError):
        run_compression_ladder(
            SOURCE_LOG,
            call=model,
            count=len,
            target=100,
            parse=parse_reflector,
            check=lambda text: reflection_problem(text, SOURCE_LOG),
        )
    assert calls == [0, 1, 2, 3]


def test_doubts_are_notes_never_refusals() -> None:
    prose = '\n'.join(['Some context paragraph about the week.'] * 5 + ['* 🔴 (09:00) User likes tea'])
    assert observation_log_problem(prose) is None and answer_notes(prose) == (NOTE_MOSTLY_PROSE,)
    repeated = '* 🔴 User asked to run the build\n' + '  * -> pnpm build → ok\n' * 12
    assert observation_log_problem(repeated) is None and answer_notes(repeated) == (NOTE_REPEATED_ITEM,)
    dated = 'Date: Mar 3, 2025\n* 🔴 fact\nDate: Mar 4, 2025\n* 🔴 newer fact'
    assert reflection_notes('* 🔴 both facts', dated) == (NOTE_NEWEST_DATE_MISSING,)
    assert reflection_notes('* 🔴 both facts (Mar 4, 2025)', dated) == ()


# ---------------------------------------------------------------------------------------------------------------------
# observer-degenerate-output.test.ts
# ---------------------------------------------------------------------------------------------------------------------
GIANT_LINE = '- 🟡 Build output: ' + ' '.join(f'step{i}' for i in range(12_000))
REPETITIVE_TOOL_LINES = '\n'.join(
    ['- 🔴 User asked to run the build and tests', *['  * -> pnpm build → ok'] * 200, '- 🟡 All build steps succeeded']
)


def alternating(n: int) -> str:
    return '\n'.join('  * -> pnpm build → ok' if i % 2 == 0 else '  * -> pnpm test → ok' for i in range(n))


def test_truncates_a_giant_single_line_instead_of_flagging_it_as_degenerate() -> None:
    assert len(GIANT_LINE) > 50_000
    out = accepted_observer(f'<observations>\n{GIANT_LINE}\n</observations>')
    assert 'Build output' in out and '[truncated]' in out and len(out) < 11_000


def test_truncates_a_giant_single_line_in_multi_thread_output_instead_of_flagging_it_as_degenerate() -> None:
    parsed = obs.parse_multi_thread_observer_output(
        f'<observations>\n<thread id="t1">\n{GIANT_LINE}\n</thread>\n</observations>', ['t1']
    )
    assert not parsed['t1'].degenerate and '[truncated]' in parsed['t1'].observations


def test_does_not_flag_faithfully_summarized_repetitive_short_tool_output_as_degenerate() -> None:
    out = accepted_observer(f'<observations>\n{REPETITIVE_TOOL_LINES}\n</observations>')
    assert 'pnpm build → ok' in out and 'All build steps succeeded' in out


def test_does_not_flag_alternating_short_tool_result_lines_as_degenerate() -> None:
    flagged = [
        n
        for n in range(100, 301)
        if parse_observer(
            f'<observations>\n- 🔴 User asked to build and test repeatedly\n{alternating(n)}\n'
            '- 🟡 Every run passed\n</observations>'
        ).degenerate
    ]
    assert flagged == []


def test_does_not_flag_short_repetitive_tool_lines_in_reflector_output_as_degenerate() -> None:
    flagged = [
        n
        for n in range(100, 301)
        if parse_reflector(f'<observations>\n- 🔴 Build and test log\n{alternating(n)}\n</observations>').degenerate
    ]
    assert flagged == []


def test_still_flags_a_non_consecutive_multi_line_repetition_loop() -> None:
    block = '\n'.join(f'- 🟡 Looping observation number {i} about the same repeated topic' for i in range(5))
    assert parse_observer('<observations>\n' + '\n'.join([block] * 20) + '\n</observations>').degenerate


def test_still_flags_one_long_line_repeated_back_to_back() -> None:
    line = '- 🟡 The agent called the same tool again with identical arguments and got the same result'
    assert len(line) > 80
    assert parse_observer('<observations>\n' + '\n'.join([line] * 300) + '\n</observations>').degenerate


DEGENERATE_LOOP = (
    '<observations>\n'
    + 'StreamTextResult.getLanguageModel().doGenerate(options): PromiseLike<Result>, ' * 100
    + '\n</observations>'
)
GOOD = '<observations>\n- 🔴 User sent eight padded test messages\n</observations>'


def observe_due(h: Harness) -> object:
    h.step(h.user(words(60)))
    return h.step(h.user('next'))


def test_skips_the_observation_cycle_instead_of_throwing_when_output_stays_degenerate_after_retry() -> None:
    h = Harness(config(message_tokens=50, observation_tokens=50_000))
    h.model.script('observer', DEGENERATE_LOOP, DEGENERATE_LOOP)
    result = observe_due(h)
    assert len(h.model.calls_for('observer')) == 2
    failed = [p['data'] for p in result.parts.to_json() if p['type'] == 'data-om-observation-failed']
    assert failed and failed[0]['reason'] == 'invalid_output'
    assert h.record().active_observations == '' and h.record().cursor('t1') == 0


def test_observes_the_same_messages_on_the_next_cycle_after_a_degenerate_skip() -> None:
    h = Harness(config(message_tokens=50, observation_tokens=50_000))
    h.model.script('observer', DEGENERATE_LOOP, DEGENERATE_LOOP, GOOD)
    observe_due(h)
    assert h.record().cursor('t1') == 0
    h.step(h.user('again'))
    assert len(h.model.calls_for('observer')) == 3
    assert 'eight padded test messages' in h.record().active_observations and h.record().cursor('t1') == 2


FACTS = '<observations>\n' + '\n'.join(f'- 🔴 Distinct fact number {i} about the project setup' for i in range(40))


def test_does_not_fail_the_run_when_every_reflection_attempt_is_degenerate() -> None:
    h = Harness(config(message_tokens=50, observation_tokens=100))
    h.model.script('observer', FACTS + '\n</observations>')
    h.model.script('reflector', *[DEGENERATE_LOOP] * 4)
    result = observe_due(h)
    assert len(h.model.calls_for('reflector')) > 0
    assert 'Distinct fact number 39' in h.record().active_observations
    assert any(p['type'] == 'data-om-observation-end' for p in result.parts.to_json())


# ---------------------------------------------------------------------------------------------------------------------
# reflector-compression-ladder.test.ts (tokens are characters, the threshold is 100, as there)
# ---------------------------------------------------------------------------------------------------------------------
LONG_BODY = 'this observation is deliberately too long to ever pass the compression threshold ' * 3
LONG_OBSERVATIONS = f'* {LONG_BODY.strip()}'
SOURCE_OBSERVATIONS = f'* original observation that must be compressed {"x" * 500}'


def payload(body: str) -> str:
    return f'<observations>\n* {body}\n</observations>'


class Scripted:
    """Per-attempt answers; the last repeats when the ladder asks for more."""

    def __init__(self, *outputs: str) -> None:
        self.outputs = outputs
        self.levels: list[int] = []

    def __call__(self, _prompt: str, level: int) -> str:
        self.levels.append(level)
        return self.outputs[min(len(self.levels), len(self.outputs)) - 1]


def reflect(model: Scripted, retries: list[RetryInfo] | None = None) -> LadderResult:
    return run_compression_ladder(
        SOURCE_OBSERVATIONS,
        call=model,
        count=len,
        target=100,
        parse=parse_reflector,
        check=lambda text: reflection_problem(text, SOURCE_OBSERVATIONS),
        on_retry=retries.append if retries is not None else None,
    )


def test_keeps_escalating_when_attempts_repeat_the_same_over_threshold_output() -> None:
    model = Scripted(payload(LONG_BODY))
    result = reflect(model)
    # Four calls, then the best-effort result: over the target, smaller than the input
    assert model.levels == [0, 1, 2, 3] and result.observations == LONG_OBSERVATIONS and not result.under_target


def test_recovers_when_a_stronger_retry_succeeds_after_identical_over_threshold_attempts() -> None:
    model = Scripted(payload(LONG_BODY), payload(LONG_BODY), payload('short'))
    result = reflect(model)
    assert len(model.levels) == 3 and result.observations == '* short'


def test_keeps_escalating_while_attempts_return_different_over_threshold_output() -> None:
    model = Scripted(*(payload(f'{n} {LONG_BODY}') for n in ('first', 'second', 'third', 'fourth')))
    reflect(model)
    assert len(model.levels) == 4


def test_marks_the_failed_marker_for_an_attempt_it_is_about_to_retry_as_retrying() -> None:
    retries: list[RetryInfo] = []
    reflect(Scripted(payload(LONG_BODY), payload('short')), retries)
    assert len(retries) == 1 and 'retrying at level' in retries[0].error


def test_exits_when_a_retry_successfully_compresses_below_the_threshold() -> None:
    model = Scripted(payload(LONG_BODY), payload('short'))
    result = reflect(model)
    assert len(model.levels) == 2 and result.observations == '* short'


# ---------------------------------------------------------------------------------------------------------------------
# reflector-empty-and-backoff.test.ts
# ---------------------------------------------------------------------------------------------------------------------
DEGENERATE_OUTPUT = 'getLanguageModel().doGenerate(options): PromiseLike<LanguageModelV2GenerateResult>, ' * 100


def test_throws_instead_of_returning_empty_output_when_every_attempt_is_degenerate() -> None:
    with pytest.raises(ModelOutputError, match='no usable observations'):
        reflect(Scripted(DEGENERATE_OUTPUT))


def test_throws_when_the_model_returns_an_empty_observations_block() -> None:
    with pytest.raises(ModelOutputError) as raised:
        reflect(Scripted('<observations>\n</observations>'))
    assert not isinstance(raised.value, InvalidReflectionError) or 'empty' in str(raised.value)


def test_escalates_the_ladder_on_a_non_degenerate_empty_block_and_succeeds_on_a_later_attempt() -> None:
    model = Scripted('<observations>\n</observations>', payload('recovered summary'))
    result = reflect(model)
    assert 'recovered summary' in result.observations and len(model.levels) == 2


# The sync path, through the engine: a log of 12 lines (~120 word tokens) over observationTokens 40.
LOG = (
    '<observations>\nDate: Jan 1, 2025\n'
    + '\n'.join(f'* 🟡 (09:{i:02d}) User mentioned detail number {i} about the trip' for i in range(12))
    + '\n</observations>'
)
OVER_THRESHOLD = '<observations>\n* ' + ' '.join(f'kept{i}' for i in range(60)) + '\n</observations>'
TINY = '<observations>\n* 🔴 User is planning a trip\n</observations>'


def reflecting_harness(*reflector: str) -> Harness:
    h = Harness(config(message_tokens=50, observation_tokens=40))
    h.model.script('observer', LOG)
    h.model.script('reflector', *reflector)
    return h


def grow(h: Harness, line: str = '* 🔴 (10:00) User added one more detail') -> None:
    """One more observation: the log changes (the reflector's input is not the same any more)."""
    h.model.script('observer', f'<observations>\nDate: Jan 1, 2025\n{line}\n</observations>')
    h.step(h.user(words(60)))
    h.step(h.user('next'))


def test_never_commits_an_empty_reflection_generation_from_the_sync_path() -> None:
    h = reflecting_harness(*[DEGENERATE_OUTPUT] * 4)
    observe_due(h)
    record = h.record()
    assert record.generation == 0 and 'detail number 11' in record.active_observations


def test_commits_a_best_effort_over_threshold_reflection_and_suppresses_a_retry_against_unchanged_observations() -> (
    None
):
    h = reflecting_harness(*[OVER_THRESHOLD] * 4)
    observe_due(h)
    calls = len(h.model.calls_for('reflector'))
    record = h.record()
    assert calls == 4 and record.generation == 1 and record.observation_tokens > 40
    # Unchanged input: the ladder already ran a full cycle on exactly this log
    h.step(h.user('short'))
    h.clock.advance(timedelta(hours=1))
    h.step(h.user('short again'))
    assert len(h.model.calls_for('reflector')) == calls and h.record().generation == 1


def test_any_change_in_the_observation_count_permits_another_attempt() -> None:
    h = reflecting_harness(*[OVER_THRESHOLD] * 8)
    observe_due(h)
    calls = len(h.model.calls_for('reflector'))
    grow(h)
    assert len(h.model.calls_for('reflector')) > calls


def test_suppresses_after_a_failed_degenerate_reflection_while_the_input_is_unchanged() -> None:
    h = reflecting_harness(*[DEGENERATE_OUTPUT] * 8)
    observe_due(h)
    calls = len(h.model.calls_for('reflector'))
    assert calls > 0 and h.record().generation == 0
    h.clock.advance(timedelta(hours=1))  # past any backoff: only the unchanged input holds it back
    h.step(h.user('short'))
    assert len(h.model.calls_for('reflector')) == calls


def test_retries_after_a_failure_as_soon_as_observations_change() -> None:
    # Ours waits for the failure backoff too (30 s doubling): an answer that failed once is not asked for again on
    # every turn. Once the log changed and the backoff passed, it retries.
    h = reflecting_harness(*[DEGENERATE_OUTPUT] * 8)
    observe_due(h)
    calls = len(h.model.calls_for('reflector'))
    h.clock.advance(timedelta(minutes=5))
    grow(h)
    assert len(h.model.calls_for('reflector')) > calls


def test_does_not_suppress_a_different_thread_resource_lock_key() -> None:
    h = reflecting_harness(*[DEGENERATE_OUTPUT] * 8)
    observe_due(h)
    calls = len(h.model.calls_for('reflector'))
    h.model.script('observer', LOG)
    h.step(h.user(words(60)), thread='t2')
    h.step(h.user('next'), thread='t2')
    assert len(h.model.calls_for('reflector')) > calls


def test_clears_the_suppression_after_a_successful_under_threshold_reflection() -> None:
    h = reflecting_harness(*[OVER_THRESHOLD] * 4, TINY)
    observe_due(h)
    assert h.record().generation == 1 and h.record().reflection_stalled_at_tokens is not None
    grow(h, '* 🔴 (10:00) ' + ' '.join(f'more{i}' for i in range(30)))
    record = h.record()
    assert record.generation == 2 and record.reflection_stalled_at_tokens is None
    assert 'planning a trip' in record.active_observations
