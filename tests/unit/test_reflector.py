"""Reflector prompts, parsing and the compression ladder (spec §15, §12.5-12.6, §12.9; scenarios G40-G44)."""

from __future__ import annotations

import pytest

from om_lib.errors import ModelOutputError
from om_lib.prompts.reflector import (
    LadderResult,
    ReflectionNotSmallerError,
    RetryInfo,
    build_reflector_prompt,
    build_reflector_system_prompt,
    merge_buffered_reflection,
    parse_reflector_output,
    reflection_slice,
    run_compression_ladder,
    validate_compression,
)

OBSERVER_TEXT = 'OBSERVER-INSTRUCTIONS-MARKER\n=== OUTPUT FORMAT ===\n<observations>'
INPUT = '\n'.join(f'* 🔴 (10:{i:02d}) observation number {i}' for i in range(20))


def count_words(text: str) -> int:
    """A deterministic stand-in token counter: one token per word."""
    return len(text.split())


def answer(words: int, *, suggested: str | None = None) -> str:
    """A well-formed reflector answer whose observations are `words` tokens long."""
    body = ' '.join(['w'] * (words - 1))
    out = f'<observations>\n* {body}\n</observations>'
    if suggested:
        out += f'\n<suggested-response>\n{suggested}\n</suggested-response>'
    return out


DEGENERATE = 'getLanguageModel().doGenerate(options: ...): PromiseLike<...>, ' * 100


class ScriptedModel:
    """Returns scripted answers in order and records the prompts and levels it was called with."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    def __call__(self, prompt: str, level: int) -> str:
        self.calls.append((prompt, level))
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


def ladder(model: ScriptedModel, *, target: int, retries: list[RetryInfo] | None = None, **kw: object) -> LadderResult:
    return run_compression_ladder(
        INPUT,
        call=model,
        count=count_words,
        target=target,
        on_retry=retries.append if retries is not None else None,
        **kw,  # type: ignore[arg-type]
    )


ORIGINAL = count_words(INPUT)  # 120 words


# ---------------------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------------------


def test_system_prompt_embeds_observer_instructions_and_markers() -> None:
    prompt = build_reflector_system_prompt(OBSERVER_TEXT)
    assert 'observational-memory-instruction' in prompt
    assert 'observation reflector' in prompt
    assert f'<observational-memory-instruction>\n{OBSERVER_TEXT}\n</observational-memory-instruction>' in prompt
    assert '✅' in prompt
    assert 'THREAD ATTRIBUTION' in prompt
    assert '<current-task>' in prompt and '<suggested-response>' in prompt
    assert '=== CUSTOM INSTRUCTIONS ===' not in prompt


def test_system_prompt_instruction_none_equals_absent_and_custom_goes_last() -> None:
    assert build_reflector_system_prompt(OBSERVER_TEXT, instruction=None) == build_reflector_system_prompt(
        OBSERVER_TEXT
    )
    custom = build_reflector_system_prompt(OBSERVER_TEXT, instruction='Keep all recipe names.')
    assert custom.endswith('\n\n=== CUSTOM INSTRUCTIONS ===\n\nKeep all recipe names.')


def test_user_prompt_levels_and_sections() -> None:
    base = build_reflector_prompt('OBS')
    assert base.startswith('## OBSERVATIONS TO REFLECT ON\n\nOBS\n\n---\n\n')
    assert 'COMPRESSION REQUIRED' not in base
    assert 'SPECIFIC GUIDANCE' not in base

    level1 = build_reflector_prompt('OBS', level=1)
    level2 = build_reflector_prompt('OBS', level=2)
    level3 = build_reflector_prompt('OBS', level=3)
    assert '## COMPRESSION REQUIRED' in level1 and '8/10' in level1
    assert '## AGGRESSIVE COMPRESSION REQUIRED' in level2 and '6/10' in level2
    assert '## CRITICAL COMPRESSION REQUIRED' in level3 and '4/10' in level3
    assert build_reflector_prompt('OBS', level=True) == level1

    guided = build_reflector_prompt('OBS', manual_prompt='focus on travel')
    assert '\n\n## SPECIFIC GUIDANCE\n\nfocus on travel' in guided

    no_hints = build_reflector_prompt('OBS', skip_continuation_hints=True)
    assert 'Do NOT include <current-task> or <suggested-response>' in no_hints


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------


def test_parse_blocks_suggested_response_and_discarded_task() -> None:
    raw = (
        '<observations>\nDate: Jan 1, 2025\n* 🔴 User mentioned <observations> inline\n</observations>\n'
        '<current-task>\nPrimary: ship it\n</current-task>\n'
        'Hint: <suggested-response>Ask about the deadline</suggested-response>'
    )
    parsed = parse_reflector_output(raw)
    assert parsed.observations == 'Date: Jan 1, 2025\n* 🔴 User mentioned <observations> inline'
    assert parsed.suggested_response == 'Ask about the deadline'  # not line-anchored
    assert 'ship it' not in parsed.observations
    assert not parsed.degenerate and parsed.raw == raw


def test_parse_falls_back_to_list_lines_then_whole_output() -> None:
    unclosed = parse_reflector_output('<observations>\n- 🔴 first\n  - nested\n1. numbered\nchatter')
    assert unclosed.observations == '- 🔴 first\n  - nested\n1. numbered'
    whole = parse_reflector_output('  The user likes tea.\nThey live in Lyon.  ')
    assert whole.observations == 'The user likes tea.\nThey live in Lyon.'
    no_hints = parse_reflector_output('User likes tea.\n<current-task>\nsomething\n</current-task>')
    assert no_hints.observations == 'User likes tea.'


def test_parse_strips_ephemeral_anchor_ids_before_storing() -> None:
    # Given a Reflector that echoed the reference's anchor ids at the start of lines (spec §15.2-§15.3)
    raw = (
        '<observations>\nDate: Jan 1, 2025\n[O1] * 🔴 (10:00) User likes tea\n'
        '* [O2] 🟡 (10:05) Asked about [O3] in text\n  - [O2-N1] sub-detail\n  - [O12-N3-N4] deeper\n</observations>'
    )
    # When it is parsed
    observations = parse_reflector_output(raw).observations
    # Then no anchor is left where a line starts, bullets and indentation stay, and text in the middle is untouched
    assert observations.split('\n') == [
        'Date: Jan 1, 2025',
        '* 🔴 (10:00) User likes tea',
        '* 🟡 (10:05) Asked about [O3] in text',
        '  - sub-detail',
        '  - deeper',
    ]
    # and the whole-output fallback strips them too
    assert parse_reflector_output('[O1] The user likes tea.').observations == 'The user likes tea.'


def test_parse_caps_long_lines_and_flags_degenerate() -> None:
    parsed = parse_reflector_output('<observations>\n* ' + 'x' * 15_000 + '\n* short\n</observations>')
    first, second = parsed.observations.split('\n')
    assert first == ('* ' + 'x' * 15_000)[:10_000] + ' … [truncated]'
    assert second == '* short'
    degenerate = parse_reflector_output(DEGENERATE)
    assert degenerate.degenerate and degenerate.observations == ''


def test_validate_compression_is_strict() -> None:
    assert validate_compression(5000, 10000)
    assert not validate_compression(10000, 10000)
    assert not validate_compression(12000, 10000)
    assert validate_compression(9500, 10000)
    assert not validate_compression(8500, 8000)


# ---------------------------------------------------------------------------------------------------------------
# Ladder (G40, G41 and the best-result rule)
# ---------------------------------------------------------------------------------------------------------------


def test_always_over_target_but_smaller_makes_four_calls_and_commits() -> None:
    model = ScriptedModel(answer(100))
    retries: list[RetryInfo] = []
    result = ladder(model, target=50, retries=retries)
    assert [level for _, level in model.calls] == [0, 1, 2, 3]
    assert result.attempts == 4
    assert result.final_tokens == 100 and not result.under_target
    assert result.original_tokens == ORIGINAL
    assert len(retries) == 3


def test_always_not_smaller_than_input_raises_not_smaller() -> None:
    model = ScriptedModel(answer(ORIGINAL + 10))
    with pytest.raises(ReflectionNotSmallerError) as info:
        ladder(model, target=50)
    assert len(model.calls) == 4
    assert info.value.original_tokens == ORIGINAL
    assert isinstance(info.value, ModelOutputError)


def test_equal_to_input_is_not_smaller() -> None:
    model = ScriptedModel(answer(ORIGINAL))
    with pytest.raises(ReflectionNotSmallerError):
        ladder(model, target=10_000)


def test_over_over_under_stops_after_three_calls() -> None:
    model = ScriptedModel(answer(100), answer(90), answer(30, suggested='Ask how the trip went'))
    result = ladder(model, target=50)
    assert len(model.calls) == 3
    assert result.under_target and result.final_tokens == 30 and result.level == 2
    assert result.suggested_response == 'Ask how the trip went'


def test_over_then_under_makes_two_calls_and_one_retry_marker() -> None:
    model = ScriptedModel(answer(100), answer(30))
    retries: list[RetryInfo] = []
    result = ladder(model, target=50, retries=retries)
    assert len(model.calls) == 2 and result.attempts == 2
    assert len(retries) == 1
    info = retries[0]
    assert (info.level, info.next_level, info.reflected_tokens, info.target) == (0, 1, 100, 50)
    assert info.error == f'Did not compress below threshold ({ORIGINAL} → 100, target: 50), retrying at level 1'


def test_ladder_prompts_carry_level_headings() -> None:
    model = ScriptedModel(answer(100))
    ladder(model, target=50)
    prompts = [prompt for prompt, _ in model.calls]
    assert 'COMPRESSION REQUIRED' not in prompts[0]
    assert '## COMPRESSION REQUIRED' in prompts[1]
    assert '## AGGRESSIVE COMPRESSION REQUIRED' in prompts[2]
    assert '## CRITICAL COMPRESSION REQUIRED' in prompts[3]


def test_empty_block_escalates_then_valid_succeeds() -> None:
    model = ScriptedModel('<observations>\n</observations>', answer(30))
    retries: list[RetryInfo] = []
    result = ladder(model, target=50, retries=retries)
    assert len(model.calls) == 2
    assert result.observations.strip() and result.final_tokens == 30
    assert retries[0].reason == 'empty' and 'retrying at level 1' in retries[0].error


def test_all_degenerate_raises_model_output_error() -> None:
    model = ScriptedModel(DEGENERATE)
    with pytest.raises(ModelOutputError) as info:
        ladder(model, target=50)
    assert not isinstance(info.value, ReflectionNotSmallerError)
    assert len(model.calls) == 4


def test_degenerate_then_valid_recovers() -> None:
    model = ScriptedModel(DEGENERATE, answer(30))
    retries: list[RetryInfo] = []
    assert ladder(model, target=50, retries=retries).final_tokens == 30
    assert retries[0].reason == 'degenerate'


def test_best_result_is_kept_when_later_attempts_grow() -> None:
    model = ScriptedModel(answer(100), answer(ORIGINAL + 5), answer(ORIGINAL + 20), answer(ORIGINAL + 1))
    result = ladder(model, target=50)
    assert len(model.calls) == 4
    assert result.final_tokens == 100 and result.level == 0 and result.last_level == 3
    assert not result.under_target


def test_smallest_of_several_over_target_attempts_wins() -> None:
    model = ScriptedModel(answer(100), answer(80), answer(110), answer(90))
    result = ladder(model, target=50)
    assert result.final_tokens == 80 and result.level == 1


def test_start_level_and_max_level() -> None:
    model = ScriptedModel(answer(100))
    result = ladder(model, target=50, start_level=1, skip_continuation_hints=True)
    assert [level for _, level in model.calls] == [1, 2, 3]
    assert all('Do NOT include <current-task>' in prompt for prompt, _ in model.calls)
    assert result.attempts == 3

    capped = ScriptedModel(answer(100))
    ladder(capped, target=50, start_level=0, max_level=1)
    assert [level for _, level in capped.calls] == [0, 1]


def test_under_target_but_larger_than_input_escalates() -> None:
    # A target above the input (tiny buffered slices) must not let a bigger answer through.
    model = ScriptedModel(answer(ORIGINAL + 5), answer(60))
    result = ladder(model, target=10_000)
    assert len(model.calls) == 2 and result.final_tokens == 60


def test_blank_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        run_compression_ladder('  \n', call=ScriptedModel(answer(3)), count=count_words, target=10)


def test_model_errors_from_call_propagate() -> None:
    def failing(prompt: str, level: int) -> str:
        raise ModelOutputError('blocked')

    with pytest.raises(ModelOutputError, match='blocked'):
        run_compression_ladder(INPUT, call=failing, count=count_words, target=10)


# ---------------------------------------------------------------------------------------------------------------
# Buffered reflection (G43, G44)
# ---------------------------------------------------------------------------------------------------------------


def test_reflection_slice_takes_lines_fitting_the_activation_point() -> None:
    observations = '\n'.join(f'line {i}' for i in range(1, 301))
    text, lines, estimate = reflection_slice(observations, 30_000, 40_000, 0.5)
    assert lines == 200
    assert estimate == 20_000
    assert text.split('\n') == [f'line {i}' for i in range(1, 201)]
    assert round(0.75 * estimate) == 15_000


def test_reflection_slice_small_log_takes_everything() -> None:
    text, lines, estimate = reflection_slice('a\nb\nc', 300, 40_000, 0.5)
    assert (text, lines, estimate) == ('a\nb\nc', 3, 300)
    assert reflection_slice('a\nb', 0, 40_000, 0.5) == ('a\nb', 2, 0)


def test_merge_buffered_reflection_keeps_uncovered_lines() -> None:
    active = '\n'.join(f'line {i}' for i in range(1, 7))
    merged = merge_buffered_reflection('REFLECTION', active, 4)
    assert merged == 'REFLECTION\n\nline 5\nline 6'
    assert all(f'line {i}' not in merged for i in range(1, 5))

    grown = active + '\nline 7 appended after buffering'
    assert merge_buffered_reflection('REFLECTION', grown, 4).endswith('line 6\nline 7 appended after buffering')
    assert merge_buffered_reflection('REFLECTION', active, 6) == 'REFLECTION'
