"""The Reflector: prompts, output parsing and the compression ladder (spec §12.5–12.6, §12.9, §15).

Pure logic, no I/O. The model call is injected into `run_compression_ladder` as `call(user_prompt, level) -> text`;
the caller builds the system prompt (`build_reflector_system_prompt`) and owns transport, retries and deadlines.

The Observer's instructions are passed in as a string rather than imported, so this module does not depend on
`om_lib.prompts.observer` and the two prompts can evolve separately. Every prompt sentence here is our own wording; only
the tags and headings the parsers and tests rely on are fixed strings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from om_lib.errors import ModelOutputError

# ----------------------------------------------------------------------------------------------------------------
# System prompt (§15.1)
# ----------------------------------------------------------------------------------------------------------------

_IDENTITY = (
    'You are the memory of an AI assistant. The reflections you write here replace everything the assistant '
    'remembers about earlier conversations: after this, they are the ONLY record it has of what happened.'
)

_SHARED_PSYCHE = (
    'Another part of the same mind, the observer, watches the conversation and writes observations. These are the '
    'instructions it works from, so you know how the notes you receive were made and what they should look like:'
)

_ROLE = """You are the observation reflector, another part of that same mind. Your job:
- Reorganise and streamline the observations: merge what belongs together and cut what is repeated.
- Draw connections and conclusions the individual notes only hint at.
- Notice if the assistant drifted away from what the user wanted, and record how to get back on course.
- Remember that your reflection becomes the ENTIRE memory. Anything you drop is forgotten for good, so leave \
nothing important out."""

_CONSOLIDATION = """How to consolidate:
- Keep the dates and times. Keep the timestamps that matter most, even when several notes collapse into one.
- Combine related items into a single line or a parent line with short sub-bullets.
- Keep every ✅ completion marker together with the concrete outcome it records (what was finished, decided or \
answered). A completed item may be shortened, never silently dropped.
- Compress older material harder than recent material: the newest observations keep the most detail.
- What the user stated outranks what the user asked. "User stated X" is a fact to keep; "User asked about X" is \
only a question, and must not be rewritten as a fact."""

_THREAD_ATTRIBUTION = """=== THREAD ATTRIBUTION (Resource Scope) ===
Observations may arrive grouped in <thread id="..."> sections, one per conversation thread.
- Keep a <thread id="..."> section for context that belongs to that conversation only (its tasks, its progress).
- Move facts that hold everywhere (preferences, identity, long-lived circumstances) out of the thread sections into \
plain, untagged lines, and state each of them once.

Example input:
<thread id="t1">
Date: Mar 3, 2025
* 🔴 (10:02) User prefers TypeScript
* 🟡 (10:05) Working on the login form validation
</thread>
<thread id="t2">
Date: Mar 4, 2025
* 🔴 (16:40) User prefers TypeScript
* 🟡 (16:45) Setting up the CI pipeline
</thread>

Example output:
Date: Mar 3, 2025
* 🔴 User prefers TypeScript
<thread id="t1">
* 🟡 (10:05) Working on the login form validation
</thread>
<thread id="t2">
Date: Mar 4, 2025
* 🟡 (16:45) Setting up the CI pipeline
</thread>"""

_OUTPUT_FORMAT = """=== OUTPUT FORMAT ===
Answer with these XML sections, each tag on a line of its own:

<observations>
The condensed memory: grouped under "Date:" headers, one observation per line, each starting with its priority \
emoji (🔴 / 🟡 / 🟢 / ✅), indented sub-bullets where detail belongs to a parent line.
</observations>

<current-task>
The primary task in progress and any secondary ones, marked "waiting for user" where the assistant needs input.
</current-task>

<suggested-response>
A short hint for how the assistant should continue its next message.
</suggested-response>

What the user says matters most. If the latest user message asks a question or sets a new task, make that the \
priority in <current-task>; if the assistant should wait for the user's reply, say so in <suggested-response>."""

_CUSTOM_HEADING = '=== CUSTOM INSTRUCTIONS ==='


def build_reflector_system_prompt(observer_instructions: str, *, instruction: str | None = None) -> str:
    """Build the Reflector's system prompt (spec §15.1).

    Args:
        observer_instructions: The Observer's extraction instructions, output format and guidelines, already joined;
            they are embedded inside `<observational-memory-instruction>` so both halves of the memory share them.
        instruction: Optional custom guidance, appended under `=== CUSTOM INSTRUCTIONS ===`. None and an empty
            string both give the plain prompt.

    Returns:
        The system prompt text.
    """
    sections = [
        _IDENTITY,
        _SHARED_PSYCHE,
        f'<observational-memory-instruction>\n{observer_instructions.strip()}\n</observational-memory-instruction>',
        _ROLE,
        _CONSOLIDATION,
        _THREAD_ATTRIBUTION,
        _OUTPUT_FORMAT,
    ]
    prompt = '\n\n'.join(sections)
    if instruction:
        prompt += f'\n\n{_CUSTOM_HEADING}\n\n{instruction}'
    return prompt


# ----------------------------------------------------------------------------------------------------------------
# User prompt (§15.2)
# ----------------------------------------------------------------------------------------------------------------

MAX_COMPRESSION_LEVEL = 3

_LEVEL_GUIDANCE: dict[int, str] = {
    1: """## COMPRESSION REQUIRED

Your last reflection came out no smaller than what it was given. Compress more this time:
- condense the older observations at the start more strongly and keep the detail near the end;
- fold related items together, repeated tool calls in particular, into single lines;
- keep names, places, events and people.
Think of the previous detail level as 10/10 and aim for about 8/10.""",
    2: """## AGGRESSIVE COMPRESSION REQUIRED

The reflection is still too large. Compress much harder:
- summarise the older observations heavily and keep only the essentials of the recent ones;
- remove redundancy and merge observations that overlap;
- keep names, places, events, people and decisions.
Aim for about 6/10 detail.""",
    3: """## CRITICAL COMPRESSION REQUIRED

The reflection is far too large. This is the last attempt:
- rewrite the oldest 50-70% of the observations as a few brief, high-level paragraphs;
- keep the most recent 30-50% as condensed bullet lines;
- merge ruthlessly; drop procedural detail (individual tool calls, retries, intermediate steps) and anything later \
superseded;
- keep names, dates, decisions, errors, user preferences and architectural choices.
Aim for about 4/10 detail.""",
}

_NO_HINTS = (
    'IMPORTANT: Do NOT include <current-task> or <suggested-response> sections in your output. '
    'Only output <observations>.'
)


def build_reflector_prompt(
    observations: str,
    *,
    manual_prompt: str | None = None,
    level: int | bool = 0,
    skip_continuation_hints: bool = False,
) -> str:
    """Build the Reflector's user prompt for one ladder attempt (spec §15.2).

    Args:
        observations: The observation log to reflect on.
        manual_prompt: Optional guidance from a manual reflect request, under `## SPECIFIC GUIDANCE`.
        level: Compression level 0-3 (0 adds no guidance). `True` means level 1, as the reference's legacy flag did.
        skip_continuation_hints: Ask for `<observations>` only (buffered reflection: the hints would be stale by
            the time the reflection is activated).

    Returns:
        The user prompt text.
    """
    if isinstance(level, bool):
        level = 1 if level else 0
    prompt = (
        f'## OBSERVATIONS TO REFLECT ON\n\n{observations}\n\n---\n\n'
        'Reflect on these observations and write a refined, condensed version of them. '
        "What you write becomes the assistant's whole memory from now on."
    )
    if manual_prompt:
        prompt += f'\n\n## SPECIFIC GUIDANCE\n\n{manual_prompt}'
    guidance = _LEVEL_GUIDANCE.get(min(max(level, 0), MAX_COMPRESSION_LEVEL))
    if guidance:
        prompt += f'\n\n{guidance}'
    if skip_continuation_hints:
        prompt += f'\n\n{_NO_HINTS}'
    return prompt


# ----------------------------------------------------------------------------------------------------------------
# Parsing (§15.3)
# ----------------------------------------------------------------------------------------------------------------

MAX_OBSERVATION_LINE_CHARS = 10_000
_TRUNCATION_SUFFIX = ' … [truncated]'

# Opening and closing tags must start a line: a note that mentions "<observations>" mid-sentence neither opens
# nor closes a block (spec §13.5).
_OBSERVATIONS_BLOCK_RE = re.compile(r'^[ \t]*<observations>(.*?)^[ \t]*</observations>', re.I | re.M | re.S)
_LIST_LINE_RE = re.compile(r'^\s*(?:[-*]|\d+\.)\s')
_SUGGESTED_RE = re.compile(r'<suggested-response>(.*?)</suggested-response>', re.I | re.S)
# The ephemeral anchor ids the reference's Reflector saw on observation lines (`[O1]`, nested `[O1-N2]`), at the start
# of a line or right after its bullet; a model may echo them, and they mean nothing once stored (spec §15.2-§15.3).
_ANCHOR_RE = re.compile(r'^([ \t]*(?:(?:[-*]|\d+\.)[ \t]+)?)\[O\d+(?:-N\d+)*\][ \t]*', re.M)
# Hint sections removed from the whole-output fallback so they never leak into the stored memory.
_HINT_BLOCK_RE = re.compile(
    r'<(current-task|suggested-response|thread-title)>.*?(?:</\1>|\Z)|</?observations>', re.I | re.S
)


def sanitize_lines(text: str) -> str:
    """Cap every line at 10 000 characters (spec §13.7); the default line sanitizer of the parser.

    Args:
        text: Observation text.

    Returns:
        The text with over-long lines cut and marked with ` … [truncated]`.
    """
    if not text:
        return text
    return '\n'.join(
        line[:MAX_OBSERVATION_LINE_CHARS] + _TRUNCATION_SUFFIX if len(line) > MAX_OBSERVATION_LINE_CHARS else line
        for line in text.split('\n')
    )


def strip_anchor_ids(text: str) -> str:
    """Remove the ephemeral anchor ids (`[O1]`, `[O1-N1]`) at the start of lines, keeping indentation and bullets.

    Args:
        text: Observation text.

    Returns:
        The text without anchors (other bracketed text is left alone).
    """
    return _ANCHOR_RE.sub(r'\1', text)


def looks_degenerate(text: str) -> bool:
    """Detect a model stuck in a repetition loop; the default degenerate check of the parser (spec §13.7).

    A compact version of the reference's detector: under 2000 characters is never degenerate; a single line over
    50 000 characters is; otherwise 200-character windows sampled over the ordinary lines (24 characters or more)
    must be more than 40% duplicates, or more than half of at least 20 such lines must repeat exactly. Short lines
    (dates, tags) are left out so that legitimately repetitive structure does not trip it.

    Args:
        text: Raw model output.

    Returns:
        True when the output should be discarded.
    """
    if len(text) < 2000:
        return False
    lines = text.split('\n')
    if any(len(line) > 50_000 for line in lines):
        return True
    counted = [line for line in lines if 24 <= len(line) <= MAX_OBSERVATION_LINE_CHARS]
    if len(counted) >= 20 and len(counted) - len(set(counted)) > len(counted) / 2:
        return True
    window_text = '\n'.join(counted)
    if len(window_text) < 2000:
        return False
    step = max(1, len(window_text) // 50)
    windows = [window_text[i : i + 200] for i in range(0, len(window_text) - 200 + 1, step)]
    if len(windows) <= 5:
        return False
    duplicates = len(windows) - len(set(windows))
    return duplicates / len(windows) > 0.4


@dataclass(frozen=True)
class ParsedReflection:
    """What one Reflector answer contained.

    Attributes:
        observations: The condensed observation text ('' when degenerate).
        suggested_response: The continuation hint, or None.
        degenerate: True when the output was a repetition loop and must not be used.
        raw: The model's text as received.
    """

    observations: str
    suggested_response: str | None
    degenerate: bool
    raw: str


def parse_reflector_output(
    text: str,
    *,
    sanitize: Callable[[str], str] = sanitize_lines,
    is_degenerate: Callable[[str], bool] = looks_degenerate,
) -> ParsedReflection:
    """Parse a Reflector answer (spec §15.3).

    Observations come from the line-anchored `<observations>` blocks; without one, from the list lines; without
    those, from the whole trimmed output (minus any hint sections). `<current-task>` is dropped: per-thread tasks
    live in thread metadata, not in a reflection. Anchor ids a model echoed (`[O1]`, `[O1-N1]`) are stripped, so
    they are never stored.

    Args:
        text: Raw model output.
        sanitize: Line sanitizer applied to the observations (injectable so the Observer's can be reused).
        is_degenerate: Degenerate-output check run on the sanitized raw text.

    Returns:
        The parsed reflection.
    """
    raw = text or ''
    if is_degenerate(sanitize(raw)):
        return ParsedReflection(observations='', suggested_response=None, degenerate=True, raw=raw)

    blocks = [m.group(1).strip() for m in _OBSERVATIONS_BLOCK_RE.finditer(raw)]
    if blocks:
        observations = '\n'.join(b for b in blocks if b)
    else:
        list_lines = [line for line in raw.split('\n') if _LIST_LINE_RE.match(line)]
        observations = '\n'.join(list_lines) if list_lines else _HINT_BLOCK_RE.sub('', raw).strip()

    match = _SUGGESTED_RE.search(raw)
    suggested = match.group(1).strip() if match else ''
    return ParsedReflection(
        observations=strip_anchor_ids(sanitize(observations)),
        suggested_response=suggested or None,
        degenerate=False,
        raw=raw,
    )


# ----------------------------------------------------------------------------------------------------------------
# Compression ladder (§15.4, §12.9)
# ----------------------------------------------------------------------------------------------------------------


def validate_compression(reflected: int, target: int) -> bool:
    """Whether a reflection met its target: strictly below it (10 000 vs 10 000 is a failure).

    Args:
        reflected: Token count of the reflection.
        target: The token target.

    Returns:
        True when `reflected < target`.
    """
    return reflected < target


class ReflectionNotSmallerError(ModelOutputError):
    """No attempt of the ladder produced a usable reflection strictly smaller than its input.

    Committing such a result would grow (or not shrink) the memory and re-trigger reflection forever, so the
    engine should keep the current log and back off until it changes (spec §12.9, suppression).
    """

    code = 'reflection_not_smaller'

    def __init__(self, message: str, *, original_tokens: int, smallest_tokens: int | None = None) -> None:
        super().__init__(message)
        self.original_tokens = original_tokens
        self.smallest_tokens = smallest_tokens


class InvalidReflectionError(ModelOutputError):
    """No attempt of the ladder was still an observation log that keeps the log's span (om_lib/prompts/log_check.py).

    Committing it would replace the user's memory with a refusal, prose, or a log that lost its newest or oldest
    days; the engine keeps the current generation instead.
    """

    code = 'invalid_reflection'


RetryReason = Literal['over_target', 'not_smaller', 'degenerate', 'empty', 'invalid']


@dataclass(frozen=True)
class RetryInfo:
    """One failed ladder attempt that is about to be retried at a higher level (for the UI's failed marker).

    Attributes:
        level: The level of the attempt that fell short.
        next_level: The level of the retry.
        reflected_tokens: Tokens of the attempt's observations (the input's count when degenerate or empty).
        original_tokens: Tokens of the input.
        target: The token target.
        reason: Why the attempt did not count as a success.
        error: Human-readable message, ending in "retrying at level N".
    """

    level: int
    next_level: int
    reflected_tokens: int
    original_tokens: int
    target: int
    reason: RetryReason
    error: str


@dataclass(frozen=True)
class LadderResult:
    """The result to commit.

    Attributes:
        observations: The smallest usable reflection that is strictly smaller than the input (the first one under
            target when there is one).
        suggested_response: That attempt's continuation hint, or None.
        attempts: Model calls made.
        final_tokens: Token count of `observations`.
        original_tokens: Token count of the input.
        under_target: Whether `final_tokens < target`.
        level: The compression level of the attempt that produced `observations`.
        last_level: The level of the last attempt made.
    """

    observations: str
    suggested_response: str | None
    attempts: int
    final_tokens: int
    original_tokens: int
    under_target: bool
    level: int
    last_level: int


def run_compression_ladder(
    observations: str,
    *,
    call: Callable[[str, int], str],
    count: Callable[[str], int],
    target: int,
    start_level: int = 0,
    max_level: int = MAX_COMPRESSION_LEVEL,
    on_retry: Callable[[RetryInfo], None] | None = None,
    manual_prompt: str | None = None,
    skip_continuation_hints: bool = False,
    parse: Callable[[str], ParsedReflection] = parse_reflector_output,
    check: Callable[[str], str | None] | None = None,
) -> LadderResult:
    """Reflect `observations`, escalating the compression level until the result is small enough (spec §15.4).

    Each attempt is a success when its output is usable (not degenerate, observations not empty) and smaller than
    both the target and the input. Otherwise the level goes up, until `max_level` has been tried. Model errors
    raised by `call` propagate unchanged.

    What is returned is the best attempt, not merely the last: the smallest usable reflection strictly smaller
    than the input. A later, larger answer therefore never replaces an earlier, better one, and an answer that
    would grow the memory is never committed.

    Args:
        observations: The text to reflect (non-empty).
        call: `call(user_prompt, level) -> raw model text`; the caller supplies the system prompt and transport.
        count: Token counter for observation text.
        target: Token target; success means strictly below it.
        start_level: First compression level (0 for sync and manual reflection, 1-2 for buffered reflection).
        max_level: Last level to try (at most 3).
        on_retry: Called before each retry, e.g. to emit a failed marker with `retrying: true`.
        manual_prompt: Extra guidance for a manual reflect request.
        skip_continuation_hints: Ask for observations only (buffered reflection).
        parse: Output parser (injectable to share the Observer's sanitizer and degenerate check).
        check: Says why an attempt's observations may not replace the log (None: they may); such an attempt counts
            as a failed compression and escalates the ladder.

    Returns:
        The result to commit.

    Raises:
        ValueError: `observations` is blank.
        ReflectionNotSmallerError: Some attempts were usable, but none was strictly smaller than the input.
        InvalidReflectionError: Every attempt with observations failed `check`.
        ModelOutputError: No attempt produced usable output (all degenerate or empty).
    """
    if not observations.strip():
        raise ValueError('there is nothing to reflect: the observations are empty')
    original = count(observations)
    max_level = min(max(max_level, 0), MAX_COMPRESSION_LEVEL)
    level = min(max(start_level, 0), max_level)

    attempts = 0
    invalid: str | None = None
    usable_seen = False
    smallest_usable: int | None = None
    best: tuple[int, ParsedReflection, int] | None = None  # (tokens, parsed, level)
    while True:
        prompt = build_reflector_prompt(
            observations, manual_prompt=manual_prompt, level=level, skip_continuation_hints=skip_continuation_hints
        )
        parsed = parse(call(prompt, level))
        attempts += 1

        reason: RetryReason | None
        if parsed.degenerate:
            reflected, reason = original, 'degenerate'
        elif not parsed.observations.strip():
            # An empty block for non-empty input is a failed compression, never "memory is now empty" (§12.9).
            reflected, reason = original, 'empty'
        elif check is not None and (problem := check(parsed.observations)) is not None:
            # Not an observation log any more (a refusal, prose, lost days): never a candidate to commit.
            reflected, reason, invalid = original, 'invalid', problem
        else:
            usable_seen = True
            reflected = count(parsed.observations)
            smallest_usable = reflected if smallest_usable is None else min(smallest_usable, reflected)
            if reflected < original and (best is None or reflected < best[0]):
                best = (reflected, parsed, level)
            if reflected >= original:
                reason = 'not_smaller'
            elif not validate_compression(reflected, target):
                reason = 'over_target'
            else:
                reason = None
        if reason is None or level >= max_level:
            break
        next_level = level + 1
        if on_retry is not None:
            on_retry(
                RetryInfo(
                    level=level,
                    next_level=next_level,
                    reflected_tokens=reflected,
                    original_tokens=original,
                    target=target,
                    reason=reason,
                    error=_retry_message(reason, original, reflected, target, next_level),
                )
            )
        level = next_level

    if best is None:
        if invalid is not None and not usable_seen:
            raise InvalidReflectionError(
                f'no reflection in {attempts} attempt(s) was a usable observation log: {invalid}'
            )
        if usable_seen:
            raise ReflectionNotSmallerError(
                f'reflection did not shrink the observations after {attempts} attempt(s) '
                f'({original} tokens in, smallest answer {smallest_usable} tokens)',
                original_tokens=original,
                smallest_tokens=smallest_usable,
            )
        raise ModelOutputError(f'reflector produced no usable observations after {attempts} attempt(s)')
    tokens, parsed, best_level = best
    return LadderResult(
        observations=parsed.observations,
        suggested_response=parsed.suggested_response,
        attempts=attempts,
        final_tokens=tokens,
        original_tokens=original,
        under_target=validate_compression(tokens, target),
        level=best_level,
        last_level=level,
    )


def _retry_message(reason: RetryReason, original: int, reflected: int, target: int, next_level: int) -> str:
    if reason == 'degenerate':
        return f'Reflector output was degenerate (repetition loop), retrying at level {next_level}'
    if reason == 'empty':
        return f'Reflector returned no observations, retrying at level {next_level}'
    if reason == 'invalid':
        return f'Reflector output is not a usable observation log, retrying at level {next_level}'
    return (
        f'Did not compress below threshold ({original} → {reflected}, target: {target}), retrying at level {next_level}'
    )


# ----------------------------------------------------------------------------------------------------------------
# Buffered reflection (§12.5, §12.6)
# ----------------------------------------------------------------------------------------------------------------


def _round_half_up(value: float) -> int:
    # JavaScript's Math.round; Python's round() rounds halves to even and would drift from the reference by one.
    return math.floor(value + 0.5)


def reflection_slice(
    observations: str, observation_tokens: int, threshold: int, buffer_activation: float
) -> tuple[str, int, int]:
    """Pick the head of the observation log a buffered reflection should condense (spec §12.5 steps 2-5).

    Lines are assumed to cost the average tokens per line, and as many leading lines are taken as fit in
    `threshold × buffer_activation` tokens.

    Args:
        observations: The active observation text.
        observation_tokens: Its token count.
        threshold: The reflection threshold (`observationTokens`).
        buffer_activation: The reflection's buffer activation ratio (default 0.5).

    Returns:
        `(slice_text, line_count, slice_token_estimate)`; the compression target is `round(0.75 × estimate)`.
    """
    lines = observations.split('\n')
    total = len(lines)
    avg = observation_tokens / total if total else 0.0
    activation_point = threshold * buffer_activation
    count = min(math.floor(activation_point / avg), total) if avg > 0 else total
    return '\n'.join(lines[:count]), count, _round_half_up(avg * count)


def merge_buffered_reflection(reflection: str, active_observations: str, reflected_line_count: int) -> str:
    """Replace the lines a buffered reflection covered, keeping what was appended after it (spec §12.6 step 3).

    Args:
        reflection: The buffered reflection text.
        active_observations: The current active observations (may have grown since the reflection started).
        reflected_line_count: How many leading lines the reflection covers.

    Returns:
        `reflection + "\\n\\n" + uncovered tail`, or just the reflection when every line was covered.
    """
    tail = '\n'.join(active_observations.split('\n')[reflected_line_count:]).strip()
    return f'{reflection}\n\n{tail}' if tail else reflection
