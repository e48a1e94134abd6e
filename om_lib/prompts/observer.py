"""The Observer's pure core: prompts, transcript formatting, request text, output parsing and context budgeting.

Nothing here does I/O or talks to a model. The engine builds a `ModelRequest` from these pieces, sends it through
the model port and hands the answer back to `parse_observer_output`. Token counting is always injected as a plain
`count(text) -> int` callable, so tests can count characters or words and production passes the o200k counter.

Format facts (XML tags, headings, marker strings) follow the reference exactly because parsers, the Reflector and
tests rely on them; all instruction prose is this project's own wording.
"""

from __future__ import annotations

import json
import math
import mimetypes
import posixpath
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import unquote, urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from om_lib.context import temporal
from om_lib.context.tokens import strip_encrypted_content
from om_lib.messages import (
    FilePart,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    time_of,
)
from om_lib.prompts.log_check import observation_log_problem

__all__ = [
    'DEFAULT_MAX_TOOL_RESULT_TOKENS',
    'TRUNCATION_NOTICE',
    'OBSERVER_EXTRACTION_INSTRUCTIONS',
    'OBSERVER_GUIDELINES',
    'OBSERVER_OUTPUT_FORMAT',
    'AttachmentRef',
    'ObserverTranscript',
    'ParsedObservations',
    'ThreadInput',
    'build_multi_thread_observer_request',
    'build_observer_request',
    'build_observer_system_prompt',
    'detect_degenerate_repetition',
    'format_messages_for_observer',
    'format_tool_result',
    'is_unusable_observer_output',
    'parse_multi_thread_observer_output',
    'parse_observer_output',
    'prepare_observer_context',
    'sanitize_observation_lines',
    'sort_observations_by_time',
    'strip_thread_tags',
    'truncate_observations_to_token_budget',
]

Count = Callable[[str], int]

DEFAULT_MAX_TOOL_RESULT_TOKENS = 10_000
MAX_OBSERVATION_LINE_CHARS = 10_000
LINE_TRUNCATION_SUFFIX = ' … [truncated]'
TRUNCATION_NOTICE = (
    'Previous observations were truncated for context budget reasons.\n'
    'Only this view was shortened; the assistant itself still has its complete memory.\n\n'
)
_SYSTEM_REMINDER_OPEN = '<system-reminder>'
_SYSTEM_REMINDER_CLOSE = '</system-reminder>'


def _approx_tokens(text: str) -> int:
    """A rough default counter (4 characters a token) for callers that do not inject the real one."""
    return math.ceil(len(text) / 4)


# ---------------------------------------------------------------------------------------------------------------------
# System prompt
# ---------------------------------------------------------------------------------------------------------------------

_IDENTITY = (
    'You are the memory of an AI assistant. You read its conversations and write down what happened as dated, '
    'prioritised observations. Later the assistant will see ONLY your observations, never the conversation itself, '
    'so anything you leave out is forgotten for good.'
)

OBSERVER_EXTRACTION_INSTRUCTIONS = """\
=== WHAT TO RECORD ===

STATEMENTS VERSUS QUESTIONS
- Keep what the user states apart from what the user asks. A claim becomes "User stated ...", a request for \
information becomes "User asked ...", and a plan becomes "User intends to ..." / "User will ...".
- Something the user says about themselves, their work or their world is a fact. Record it as fact, even when a \
later assistant message doubts it: the user is the authority on their own situation.

STATE CHANGES
- When something replaces an earlier fact, say so plainly and name what it replaces, e.g. "User will use Postgres \
for the new service (switching from MySQL)". The newest observation must make the old one obsolete.

TIME
- Begin every observation with the time of the message it comes from, as (HH:MM) in 24-hour form.
- When a message talks about some other moment ("last Tuesday", "next month", "in two days"), work out the \
calendar date from the message date and put it at the END of the line: "(meaning Mar 14, 2025)" when it can be \
computed exactly, "(estimated Mar 2025)" when it can only be approximated. Only add it when a concrete date can be \
derived; never guess wildly.
- If one message mentions several events at different times, write one observation per event so each carries \
its own date.

WORDING
- Use exact, specific verbs: "subscribed to", "bought", "was given", "cancelled", "deployed" — not "got" or \
"did something with".
- Keep unusual or telling phrasing in quotes, exactly as written.
- Keep what tells things apart: names, handles, titles, numbers, amounts, quantities, versions, prices, places, \
and the role a person played at an event.
- When the assistant produced a list, recommendations, a plan or creative work, record the distinguishing items \
(names, key attributes, the order given) so the assistant can refer back to them precisely.

WHAT IS WORTH KEEPING
- Who did what, where and when; attributes of people, projects, products and places.
- Code, commands, file paths, identifiers, error messages and line numbers that matter later.
- Text the user wrote with deliberate formatting (templates, lists, snippets): keep it verbatim.
- Decisions, constraints, preferences, deadlines, and anything left open.
- Short and medium user messages: capture them nearly word for word. Summarise long ones, but keep their key \
sentences intact.

AVOID NOISE
- Do not write the same thing twice, in this batch or across batches.
- When the assistant runs the same kind of tool action several times, write one parent observation and put each \
call under it as an indented sub-bullet starting with "-> ", e.g.
  * 🟡 (10:05) Assistant read the auth module files
    * -> src/auth/login.ts: session created in createSession(), line 42
    * -> src/auth/token.ts: tokens expire after 15 minutes

NEXT STEPS
- When the user has asked for something specific, any other follow-up work the assistant has in mind is \
"waiting for user": note it that way instead of presenting it as agreed.

COMPLETION (✅)
- Mark something ✅ only when it is really finished: the user confirmed it works, the user accepted a definitive \
answer and moved on, a stated goal was reached, or a clearly defined subtask was completed.
- Do NOT mark ✅ for a mere reply, a topic that was paused, or a reaction you cannot interpret.
- A ✅ line may stand on its own or sit as a sub-bullet under the work it completes."""

OBSERVER_OUTPUT_FORMAT = """\
=== OUTPUT FORMAT ===

Your answer MUST be written inside the XML tags described below.

Start every observation line with one priority marker:
- 🔴 high: facts the user stated, their preferences, goals not yet met, context that must not be lost
- 🟡 medium: project details, things learned, results of tools
- 🟢 low: minor details, or things you are unsure about
- ✅ completed: a task, question or subtask that is definitely finished

Related details go underneath as indented sub-bullets:
* 🔴 (09:40) User is migrating the billing service to Go
  * -> chose pgx as the Postgres driver
  * ✅ (10:15) the invoice endpoint now passes its tests

Group observations under a "Date:" line per day. Inside a day, list them in the order things happened, each with \
its 24-hour time.

<observations>
Date: Dec 4, 2025
* 🔴 (14:30) User prefers short, direct answers without preamble
* 🟡 (14:32) Assistant explained how the retry queue backs off (doubling from 1s up to 60s)
* ✅ (14:40) User confirmed the flaky upload test now passes

Date: Dec 5, 2025
* 🔴 (09:15) User asked how to rotate the API keys without downtime
</observations>

<current-task>
What the assistant is working on right now:
- Primary: the main thing under way, or the question to answer next
- Secondary: other pending items (write "waiting for user" when they need the user's go-ahead)
If the assistant started work the user did not ask for, say that it is off-task.
</current-task>

<suggested-response>
A short hint for the assistant's next message, so it can pick up smoothly. For example:
"Answer the key-rotation question, then ask whether staging should be done first."
"The user has not replied yet; wait for their answer before continuing."
</suggested-response>"""

_THREAD_TITLE_FORMAT = """\
<thread-title>
A short noun-phrase title for this conversation, 2-5 words.
Good: "Billing service Go migration", "Kyoto trip planning". Bad: "Help with code", "User question", \
"Conversation about many things".
Only change it when the topic of the conversation has meaningfully changed.
</thread-title>"""

OBSERVER_GUIDELINES = """\
=== GUIDELINES ===

- Be specific: a useful observation names the thing, the number, the file, the person.
- Usually 1 to 5 observations per exchange; more only when a lot really happened.
- Be terse. Drop filler words; keep the facts.
- Never repeat an observation that already exists.
- Observe tool use: which tool ran, why, and what it revealed.
- Include file paths and line numbers when code is involved.
- When the assistant gave a detailed answer, record enough of it that it could be given again.
- Every observation line starts with 🔴, 🟡, 🟢 or ✅.
- Stay close to the user's own words."""

_THREAD_ATTRIBUTION = """\
=== IMPORTANT: THREAD ATTRIBUTION ===

Never write thread ids or <thread> tags inside your observations. The system attributes your observations to \
their threads on its own."""

_MULTI_THREAD_ATTRIBUTION = """\
=== IMPORTANT: THREAD ATTRIBUTION ===

Use each thread id exactly as it appears in the input, once per thread, and only in the <thread id="..."> wrapper. \
Never mention thread ids inside the observation lines themselves."""

_CLOSING = """\
Remember: these observations are the assistant's ONLY memory of what happened. Make them precise enough to act on.

Messages from the user matter most. When the user asks a question or gives a new task, make it the priority in \
<current-task>. When the assistant should hand the turn back to the user, say in <suggested-response> that it \
should pause and wait for the user's reply."""


_MULTI_THREAD_INPUT = """\
=== MULTI-THREAD INPUT ===

The messages you receive come from several separate conversation threads, each wrapped in <thread id="...">. \
Treat every thread on its own: its observations, its current task and its suggested response belong to that \
thread alone."""


def _multi_thread_output_format(thread_title: bool) -> str:
    title_line = '<thread-title>Feature X implementation</thread-title>\n' if thread_title else ''
    title_line_b = '<thread-title>Weekend trip to Porto</thread-title>\n' if thread_title else ''
    sections = (
        'current-task, suggested-response, and thread-title' if thread_title else 'current-task and suggested-response'
    )
    return f"""\
=== OUTPUT FORMAT ===

Your answer MUST be written inside the XML tags described below.

Start every observation line with one priority marker:
- 🔴 high: facts the user stated, their preferences, goals not yet met, context that must not be lost
- 🟡 medium: project details, things learned, results of tools
- 🟢 low: minor details, or things you are unsure about
- ✅ completed: a task, question or subtask that is definitely finished

Related details go underneath as indented sub-bullets (start them with "-> " for repeated tool actions).

Inside one <observations> block, write one <thread id="..."> block per thread you were given. Each thread block \
holds that thread's observations, grouped under a "Date:" line per day in the order things happened (24-hour \
times), followed by that thread's own {sections}.

<observations>
<thread id="thread-a">
Date: Dec 4, 2025
* 🔴 (14:30) User prefers short, direct answers without preamble
* 🟡 (14:32) Assistant outlined the plan for feature X
<current-task>
- Primary: implement feature X
</current-task>
<suggested-response>
Share the first draft of feature X and ask for feedback.
</suggested-response>
{title_line}</thread>
<thread id="thread-b">
Date: Dec 4, 2025
* 🔴 (16:05) User is planning a weekend trip to Porto in March
<current-task>
- Primary: suggest places to stay near the river
</current-task>
<suggested-response>
List three places to stay, then ask about the budget.
</suggested-response>
{title_line_b}</thread>
</observations>"""


def build_observer_system_prompt(
    *, instruction: str | None = None, thread_title: bool = False, multi_thread: bool = False
) -> str:
    """Build the Observer's system prompt.

    Args:
        instruction: Custom instructions appended at the very end under `=== CUSTOM INSTRUCTIONS ===`. None and an
            empty string give the same prompt as no instruction.
        thread_title: Ask for a `<thread-title>` too. Without it the prompt never mentions that tag.
        multi_thread: Resource scope: the input holds several `<thread id>` sections and the output repeats them.

    Returns:
        The full system prompt.
    """
    if multi_thread:
        output_format = _multi_thread_output_format(thread_title)
        sections = [_IDENTITY, OBSERVER_EXTRACTION_INSTRUCTIONS, _MULTI_THREAD_INPUT, output_format]
        attribution = _MULTI_THREAD_ATTRIBUTION
    else:
        output_format = OBSERVER_OUTPUT_FORMAT + ('\n\n' + _THREAD_TITLE_FORMAT if thread_title else '')
        sections = [_IDENTITY, OBSERVER_EXTRACTION_INSTRUCTIONS, output_format]
        attribution = _THREAD_ATTRIBUTION
    sections += [OBSERVER_GUIDELINES, attribution, _CLOSING]
    prompt = '\n\n'.join(sections)
    if instruction:
        prompt += f'\n\n=== CUSTOM INSTRUCTIONS ===\n\n{instruction}'
    return prompt


# ---------------------------------------------------------------------------------------------------------------------
# Transcript formatting (reference format B, line oriented)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachmentRef:
    """An attachment the Observer should see, in the order of its placeholder in the transcript.

    Attributes:
        kind: 'image' (including image-like files) or 'file'.
        index: The k of `[Image #k: …]` / `[File #k: …]`; images and files are numbered separately.
        label: The label shown in the placeholder.
        media_type: The MIME type when known or guessable from the name.
        url: The part's URL (https://, s3://, data:…), if any.
        data: Inline base64 payload without any `data:` prefix, if any.
    """

    kind: Literal['image', 'file']
    index: int
    label: str
    media_type: str | None
    url: str | None
    data: str | None


@dataclass(frozen=True)
class ObserverTranscript:
    """The formatted message history: the text the Observer reads plus the attachments to send after it."""

    text: str
    attachments: tuple[AttachmentRef, ...] = ()


_IMAGE_EXTENSIONS = frozenset(
    {'png', 'jpg', 'jpeg', 'gif', 'webp', 'bmp', 'svg', 'heic', 'heif', 'tif', 'tiff', 'avif', 'ico'}
)
_ROLE_LABELS = {'user': 'User', 'assistant': 'Assistant', 'system': 'System', 'tool': 'Tool'}


def _extension(name: str | None) -> str:
    if not name:
        return ''
    _, ext = posixpath.splitext(name)
    return ext.lstrip('.').lower()


def _url_path(url: str | None) -> str:
    if not url or url.startswith('data:'):
        return ''
    return urlparse(url).path


def _split_data_uri(value: str | None) -> tuple[str | None, str | None]:
    """Split `data:<mime>;base64,<payload>` into (mime, payload); plain base64 comes back as (None, value)."""
    if not value:
        return None, None
    if value.startswith('data:'):
        header, _, payload = value.partition(',')
        mime = header[5:].split(';', 1)[0] or None
        return mime, payload
    return None, value


def _is_image_like(part: ImagePart | FilePart) -> bool:
    if isinstance(part, ImagePart):
        return True
    if part.media_type and part.media_type.lower().startswith('image/'):
        return True
    for source in (part.data, part.url):
        if source and source.startswith('data:image/'):
            return True
    return _extension(part.filename) in _IMAGE_EXTENSIONS or _extension(_url_path(part.url)) in _IMAGE_EXTENSIONS


def _attachment_ref(part: ImagePart | FilePart, index: int, kind: Literal['image', 'file']) -> AttachmentRef:
    data_mime, data = _split_data_uri(part.data)
    url_mime = _split_data_uri(part.url)[0] if part.url and part.url.startswith('data:') else None
    media_type = part.media_type or data_mime or url_mime
    url_name = unquote(posixpath.basename(_url_path(part.url)))
    if media_type is None:
        # Guess from the name so the model adapter can still declare a MIME type.
        media_type = mimetypes.guess_type(part.filename or url_name or '')[0]
    label = part.filename or url_name or media_type or kind
    return AttachmentRef(kind=kind, index=index, label=label, media_type=media_type, url=part.url, data=data)


def _stringify(value: Any, *, indent: int | None) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(strip_encrypted_content(value), indent=indent, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _truncate_to_tokens(text: str, max_tokens: int, count: Count) -> str:
    """Cut `text` to at most `max_tokens`, finding the longest character prefix that fits by binary search."""
    total = count(text)
    if total <= max_tokens:
        return text
    # No real tokenizer packs more than a few dozen characters into a token, so the cut lies well within this
    # bound; searching only up to it keeps huge results from being re-counted in full at every step.
    lo, hi = 0, min(len(text), max_tokens * 32)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(text[:mid]) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    kept = text[:lo]
    return f'{kept}\n... [truncated ~{total - count(kept)} tokens]'


def format_tool_result(
    value: Any, *, max_tokens: int = DEFAULT_MAX_TOOL_RESULT_TOKENS, count: Count = _approx_tokens
) -> str:
    """Render a tool result for the Observer.

    Strings pass through; anything else becomes 2-space JSON with long `encryptedContent` strings replaced by
    `[stripped encryptedContent: N characters]`. The result is then cut to `max_tokens`.

    Args:
        value: The raw tool result.
        max_tokens: Token ceiling for the rendered text.
        count: Token counter.

    Returns:
        The rendered, possibly truncated, text.
    """
    return _truncate_to_tokens(_stringify(value, indent=2), max_tokens, count)


def _truncate_chars(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return f'{text[:max_chars]}\n... [truncated {len(text) - max_chars} characters]'


def _split_system_reminder(text: str) -> str | None:
    """The reminder's inner text when `text` is a `<system-reminder>` block, else None."""
    stripped = text.strip()
    if not stripped.startswith(_SYSTEM_REMINDER_OPEN):
        return None
    inner = stripped[len(_SYSTEM_REMINDER_OPEN) :]
    if inner.endswith(_SYSTEM_REMINDER_CLOSE):
        inner = inner[: -len(_SYSTEM_REMINDER_CLOSE)]
    return inner.strip()


def _date_header(moment: datetime) -> str:
    return f'{moment.strftime("%b")} {moment.day} {moment.year}:'


def format_messages_for_observer(
    messages: Iterable[Message],
    *,
    timezone: str = 'UTC',
    max_part_length: int | None = None,
    max_tool_result_tokens: int = DEFAULT_MAX_TOOL_RESULT_TOKENS,
    count: Count = _approx_tokens,
    first_image_index: int = 1,
    first_file_index: int = 1,
    temporal_gap_s: float | None = None,
) -> ObserverTranscript:
    """Format messages as the line-oriented transcript the Observer reads.

    A `Mon D YYYY:` header starts each new local date. Every visible part becomes one entry
    `<Title> (HH:MM): <body>`; the time is repeated only when it changes, except on tool lines which always carry
    it. Titles are the role label (User, Assistant, System, Tool), `system-reminder` for reminder text (so the
    Observer never records it as user speech), `Tool Call <name>`, `Tool Result <name>`, `Tool Error <name>` and
    `Reasoning`. Attachments become `[Image #k: label]` / `[File #k: label]` placeholders and are returned as
    `attachments` in the same order. Messages with nothing visible are left out.

    Times are 24-hour because the Observer must write `(HH:MM)` in 24-hour form; giving it the same form avoids
    12/24-hour conversion slips.

    Args:
        messages: The messages to observe, in order.
        timezone: IANA zone used for dates and times; empty or unknown falls back to UTC.
        max_part_length: When set, each text/reasoning body is cut to this many characters.
        max_tool_result_tokens: Token ceiling for each tool result (and tool-call arguments).
        count: Token counter used for tool-result truncation.
        first_image_index: Number of the first image placeholder (lets multi-thread callers keep numbering unique).
        first_file_index: Number of the first file placeholder.
        temporal_gap_s: With temporal markers on, the smallest gap between two messages that gets a
            `system-reminder` line saying how much time passed (om_lib/context/temporal.py).

    Returns:
        The transcript text and its attachments.
    """
    try:
        zone = ZoneInfo(timezone or 'UTC')
    except (ZoneInfoNotFoundError, ValueError):
        # A bad stored zone must not make observation impossible; UTC is still correct, just less local.
        zone = ZoneInfo('UTC')
    lines: list[str] = []
    attachments: list[AttachmentRef] = []
    next_image, next_file = first_image_index, first_file_index
    last_date: str | None = None
    last_time: str | None = None
    messages = list(messages)
    gap_before = temporal.gaps(messages, temporal_gap_s) if temporal_gap_s is not None else {}

    for message in messages:
        local = time_of(message).astimezone(zone)
        clock = local.strftime('%H:%M')
        role_label = _ROLE_LABELS.get(message.role, message.role.capitalize())
        entries: list[tuple[str, str, bool]] = []  # (title, body, always show the time)
        if message.id in gap_before:
            gap = temporal.marker_text(gap_before[message.id], time_of(message), zone.key)
            entries.append(('system-reminder', gap, True))

        for part in message.parts:
            if isinstance(part, TextPart):
                if not part.text.strip():
                    continue
                reminder = _split_system_reminder(part.text)
                if reminder is not None:
                    entries.append(('system-reminder', _truncate_chars(reminder, max_part_length), False))
                else:
                    entries.append((role_label, _truncate_chars(part.text, max_part_length), False))
            elif isinstance(part, ReasoningPart):
                # Encrypted or redacted reasoning arrives empty: nothing to observe.
                if part.text.strip():
                    entries.append(('Reasoning', _truncate_chars(part.text, max_part_length), False))
            elif isinstance(part, ToolCallPart):
                args = _truncate_to_tokens(_stringify(part.args, indent=None), max_tool_result_tokens, count)
                entries.append((f'Tool Call {part.tool_name}', args, True))
            elif isinstance(part, ToolResultPart):
                title = f'Tool Error {part.tool_name}' if part.is_error else f'Tool Result {part.tool_name}'
                body = format_tool_result(part.result, max_tokens=max_tool_result_tokens, count=count)
                entries.append((title, body, True))
            elif isinstance(part, ImagePart | FilePart):
                if _is_image_like(part):
                    ref = _attachment_ref(part, next_image, 'image')
                    next_image += 1
                    placeholder = f'[Image #{ref.index}: {ref.label}]'
                else:
                    ref = _attachment_ref(part, next_file, 'file')
                    next_file += 1
                    placeholder = f'[File #{ref.index}: {ref.label}]'
                attachments.append(ref)
                entries.append((role_label, placeholder, False))

        if len(entries) <= (1 if message.id in gap_before else 0):
            continue  # nothing visible (the gap, if any, shows before the next message that has something)
        date_header = _date_header(local)
        if date_header != last_date:
            if lines:
                lines.append('')
            lines.append(date_header)
            last_date = date_header
            last_time = None
        for title, body, always_time in entries:
            if always_time or clock != last_time:
                lines.append(f'{title} ({clock}): {body}')
                last_time = clock
            else:
                lines.append(f'{title}: {body}')

    return ObserverTranscript(text='\n'.join(lines), attachments=tuple(attachments))


# ---------------------------------------------------------------------------------------------------------------------
# Request text
# ---------------------------------------------------------------------------------------------------------------------

_DO_NOT_REPEAT = 'Do not repeat these existing observations: whatever you write is appended after them.'
_SKIP_HINTS = (
    '\n\nIMPORTANT: This time output only the <observations> block, and always output it. '
    'Leave out <current-task> and <suggested-response>.'
)

ThreadInput = tuple[str, ObserverTranscript, str | None, str | None, str | None]
"""One thread of a multi-thread request: (thread id, transcript, prior task, prior suggestion, prior title)."""


def _previous_observations_block(previous_observations: str, was_truncated: bool) -> str:
    out = ''
    if previous_observations.strip():
        out += f'## Previous Observations\n\n{previous_observations.strip()}\n\n---\n\n{_DO_NOT_REPEAT}\n\n'
    if was_truncated:
        # Shown even when the budget cut the context to nothing, so the Observer knows the gap is deliberate.
        out += TRUNCATION_NOTICE
    return out


def _prior_lines(task: str | None, suggestion: str | None, title: str | None, thread_title: bool) -> list[str]:
    lines = []
    if task and task.strip():
        lines.append(f'prior current-task: {task.strip()}')
    if suggestion and suggestion.strip():
        lines.append(f'prior suggested-response: {suggestion.strip()}')
    if thread_title and title and title.strip():
        lines.append(f'prior thread-title: {title.strip()}')
    return lines


def _continuity_sentence(thread_title: bool) -> str:
    names = (
        'current-task, suggested-response and thread-title' if thread_title else 'current-task and suggested-response'
    )
    return f'Treat the prior {names} as continuity hints, and revise them to reflect the new messages.\n\n---\n\n'


def build_observer_request(
    *,
    transcript: ObserverTranscript,
    previous_observations: str,
    was_truncated: bool,
    prior_current_task: str | None,
    prior_suggested_response: str | None,
    prior_thread_title: str | None,
    thread_title: bool,
    skip_continuation_hints: bool = False,
) -> str:
    """Build the text of the Observer's single user message.

    The task comes after the history on purpose: with the instructions last, the Observer does not mistake them for
    something the user asked (reference issue #22195).

    Args:
        transcript: The formatted history (its attachments are sent by the caller after this text).
        previous_observations: The (possibly budget-truncated) observations the Observer may see.
        was_truncated: The previous observations were cut for budget; adds the truncation notice once.
        prior_current_task: The thread's current task from the last observation, if any.
        prior_suggested_response: The thread's suggested response from the last observation, if any.
        prior_thread_title: The thread's title, shown only when `thread_title` is on.
        thread_title: Titles are enabled.
        skip_continuation_hints: Ask for `<observations>` only (no task or suggestion).

    Returns:
        The user message text.
    """
    text = _previous_observations_block(previous_observations, was_truncated)
    prior = _prior_lines(prior_current_task, prior_suggested_response, prior_thread_title, thread_title)
    if prior:
        text += '## Prior Thread Metadata\n\n' + ''.join(f'- {line}\n' for line in prior) + '\n'
        text += _continuity_sentence(thread_title)
    text += f'## New Message History to Observe\n\n{transcript.text}'
    text += (
        '\n\n---\n\n## Your Task\n\n'
        'Write new observations for the message history above, in the format your instructions describe. '
        'Record only what the previous observations do not already cover.'
    )
    if thread_title and not skip_continuation_hints:
        text += ' Also give the conversation a <thread-title>.'
    if skip_continuation_hints:
        text += _SKIP_HINTS
    return text


def build_multi_thread_observer_request(
    threads: Sequence[ThreadInput],
    previous_observations: str,
    was_truncated: bool,
    thread_title: bool,
    *,
    skip_continuation_hints: bool = False,
) -> str:
    """Build the single user message for a resource-scope (multi-thread) observation.

    Args:
        threads: Per thread: (id, transcript, prior current-task, prior suggested-response, prior thread-title).
        previous_observations: The (possibly budget-truncated) resource observations.
        was_truncated: Adds the truncation notice once.
        thread_title: Titles are enabled.
        skip_continuation_hints: Ask for `<observations>` only.

    Returns:
        The user message text; attachments of every transcript are sent by the caller, in thread order.
    """
    text = _previous_observations_block(previous_observations, was_truncated)
    prior_blocks = []
    for thread_id, _, task, suggestion, title in threads:
        lines = _prior_lines(task, suggestion, title, thread_title)
        if lines:
            prior_blocks.append(f'- thread {thread_id}\n' + ''.join(f'  - {line}\n' for line in lines))
    if prior_blocks:
        text += '## Prior Thread Metadata\n\n' + ''.join(prior_blocks) + '\n' + _continuity_sentence(thread_title)
    text += (
        '## New Message History to Observe\n\n'
        f'Below are messages from {len(threads)} separate conversation threads; each thread sits inside its own '
        '<thread id="..."> tag.\n\n'
    )
    text += '\n\n'.join(
        f'<thread id="{thread_id}">\n{transcript.text}\n</thread>' for thread_id, transcript, *_ in threads
    )
    hints = (
        'current-task, suggested-response and thread-title' if thread_title else 'current-task and suggested-response'
    )
    text += (
        '\n\n---\n\n## Your Task\n\n'
        'Write new observations for the message history above, in the format your instructions describe, grouped '
        'by thread: one <thread id="..."> block per thread inside <observations>, using the ids given above. '
        f"Put each thread's {hints} inside that thread's block. "
        'Record only what the previous observations do not already cover.'
    )
    if skip_continuation_hints:
        text += _SKIP_HINTS
    return text


# ---------------------------------------------------------------------------------------------------------------------
# Output parsing
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedObservations:
    """What the Observer produced.

    Attributes:
        observations: Sanitized, time-sorted observation lines ('' when none or degenerate).
        current_task: The `<current-task>` text, or None.
        suggested_response: The `<suggested-response>` text, or None.
        thread_title: The `<thread-title>` text, or None.
        degenerate: The output looked like a repetition loop; callers retry once and never store it.
        raw: The model's raw text.
        covered: A multi-thread answer had a section for this thread. An uncovered thread was not observed: its
            cursor must not move (the caller asks about it again, alone).
    """

    observations: str
    current_task: str | None = None
    suggested_response: str | None = None
    thread_title: str | None = None
    degenerate: bool = False
    raw: str = ''
    covered: bool = True


_FLAGS = re.IGNORECASE | re.MULTILINE | re.DOTALL
_OBSERVATIONS_BLOCK = re.compile(r'^[ \t]*<observations>(.*?)^[ \t]*</observations>', _FLAGS)
_CURRENT_TASK_BLOCK = re.compile(r'^[ \t]*<current-task>(.*?)^[ \t]*</current-task>', _FLAGS)
_SUGGESTED_BLOCK = re.compile(r'^[ \t]*<suggested-response>(.*?)^[ \t]*</suggested-response>', _FLAGS)
# A one-line `<current-task>…</current-task>` is a common model habit; accept it only when the tags open and close
# the line, so an inline closing tag in the middle of a line still never ends a block.
_CURRENT_TASK_LINE = re.compile(r'^[ \t]*<current-task>([^\n]*?)</current-task>[ \t]*$', re.IGNORECASE | re.MULTILINE)
_SUGGESTED_LINE = re.compile(
    r'^[ \t]*<suggested-response>([^\n]*?)</suggested-response>[ \t]*$', re.IGNORECASE | re.MULTILINE
)
_THREAD_TITLE_BLOCK = re.compile(r'^[ \t]*<thread-title>(.*?)</thread-title>', _FLAGS)
_HINT_TAGS = 'current-task|suggested-response|thread-title'
# A complete hint block, or an unclosed one (which swallows the rest of the text, as everything after it is hint).
_HINT_BLOCKS = re.compile(rf'^[ \t]*<({_HINT_TAGS})>.*?</\1>|^[ \t]*<(?:{_HINT_TAGS})>.*', _FLAGS)
_LIST_LINE = re.compile(r'^\s*(?:[-*]|\d+\.)\s')
_THREAD_OPEN_OR_CLOSE = re.compile(r'<thread(?:\s[^>]*)?>|</thread\s*>', re.IGNORECASE)
# A tag alone on its line goes with its line break, so no blank line splits a date group.
_THREAD_TAG_LINE = re.compile(
    r'^[ \t]*(?:<thread(?:\s[^>]*)?>|</thread\s*>)[ \t]*(?:\n|\Z)', re.IGNORECASE | re.MULTILINE
)
_THREAD_SECTION = re.compile(r'<thread\s+id="([^"]*)"\s*>(.*?)</thread\s*>', re.IGNORECASE | re.DOTALL)
_ANY_OBSERVATIONS_BLOCK = re.compile(r'<observations>(.*?)(?:</observations>|\Z)', re.IGNORECASE | re.DOTALL)


def _first_group(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    if match is None:
        return None
    return match.group(1).strip() or None


def _remove_hint_blocks(text: str) -> str:
    """Drop task/suggestion/title blocks: continuation hints must never leak into stored observations."""
    return _HINT_BLOCKS.sub('', text)


def _list_lines_only(text: str) -> str:
    return '\n'.join(line for line in text.split('\n') if _LIST_LINE.match(line)).strip()


def strip_thread_tags(text: str) -> str:
    """Remove any `<thread …>` / `</thread>` tags (case-insensitive) and trim.

    Args:
        text: Observation text.

    Returns:
        The text without thread tags.
    """
    return _THREAD_OPEN_OR_CLOSE.sub('', _THREAD_TAG_LINE.sub('', text)).strip()


def _clean_observations(text: str) -> str:
    cleaned = strip_thread_tags(_remove_hint_blocks(text))
    # Removing blocks can leave runs of blank lines behind.
    cleaned = re.sub(r'\n{3,}', '\n\n', cleaned).strip()
    return sort_observations_by_time(sanitize_observation_lines(cleaned))


def parse_observer_output(text: str) -> ParsedObservations:
    """Parse a single-thread Observer answer.

    `<observations>` blocks must open and close at the start of a line, so tags mentioned inside an observation do
    not end the block; several blocks are joined. Without a complete block only list lines are kept. The closing tags
    of `<current-task>` and `<suggested-response>` must also start a line (a one-line block is accepted too); the
    `<thread-title>` closing tag may share its line. Empty tags give None. Hints and thread tags never stay in the
    observations, which are then sanitized and sorted by time.

    Args:
        text: The model's raw answer.

    Returns:
        The parsed result; `degenerate=True` with empty observations when the answer is a repetition loop.
    """
    if detect_degenerate_repetition(sanitize_observation_lines(text)):
        return ParsedObservations(observations='', degenerate=True, raw=text)

    blocks = [m.group(1).strip() for m in _OBSERVATIONS_BLOCK.finditer(text)]
    if blocks:
        observations = '\n'.join(blocks)
    else:
        observations = _list_lines_only(_remove_hint_blocks(text))

    current_task = _first_group(_CURRENT_TASK_BLOCK, text) or _first_group(_CURRENT_TASK_LINE, text)
    suggested = _first_group(_SUGGESTED_BLOCK, text) or _first_group(_SUGGESTED_LINE, text)
    return ParsedObservations(
        observations=_clean_observations(observations),
        current_task=current_task,
        suggested_response=suggested,
        thread_title=_first_group(_THREAD_TITLE_BLOCK, text),
        raw=text,
    )


def _inline_tag(tag: str, text: str) -> tuple[str | None, str]:
    pattern = re.compile(rf'<{tag}>(.*?)</{tag}>', re.IGNORECASE | re.DOTALL)
    match = pattern.search(text)
    value = (match.group(1).strip() or None) if match else None
    return value, pattern.sub('', text)


def parse_multi_thread_observer_output(text: str, thread_ids: Sequence[str]) -> dict[str, ParsedObservations]:
    """Parse a resource-scope answer into one result per requested thread.

    Every requested thread gets an entry; a thread the model left out (no section) has `covered=False` and empty
    observations: it was not observed. Sections for ids that were not requested are ignored; repeated sections for
    one id are joined.

    Args:
        text: The model's raw answer.
        thread_ids: The thread ids used in the request.

    Returns:
        Parsed observations keyed by thread id. When the answer is degenerate every entry has `degenerate=True`.
    """
    if detect_degenerate_repetition(sanitize_observation_lines(text)):
        return {tid: ParsedObservations(observations='', degenerate=True, raw=text) for tid in thread_ids}

    block = _OBSERVATIONS_BLOCK.search(text) or _ANY_OBSERVATIONS_BLOCK.search(text)
    body = block.group(1) if block else text

    found: dict[str, list[tuple[str, str | None, str | None, str | None]]] = {}
    for match in _THREAD_SECTION.finditer(body):
        section = match.group(2)
        task, section = _inline_tag('current-task', section)
        suggestion, section = _inline_tag('suggested-response', section)
        title, section = _inline_tag('thread-title', section)
        found.setdefault(match.group(1).strip(), []).append((section, task, suggestion, title))

    result: dict[str, ParsedObservations] = {}
    for tid in thread_ids:
        parts = found.get(tid, [])
        observations = '\n'.join(p[0].strip() for p in parts if p[0].strip())
        result[tid] = ParsedObservations(
            observations=_clean_observations(observations),
            current_task=next((p[1] for p in parts if p[1]), None),
            suggested_response=next((p[2] for p in parts if p[2]), None),
            thread_title=next((p[3] for p in parts if p[3]), None),
            raw=text,
            covered=tid in found,
        )
    return result


def observer_output_problem(parsed: ParsedObservations) -> str | None:
    """Why an Observer answer may not become memory (None when it may): degenerate, empty, or not an observation log
    (a refusal, prose, one line repeated; om_lib/prompts/log_check.py)."""
    if parsed.degenerate:
        return 'the answer is a repetition loop'
    return observation_log_problem(parsed.observations)


def is_unusable_observer_output(parsed: ParsedObservations) -> bool:
    """Whether an Observer answer must be treated as a failed call (never stored).

    Args:
        parsed: The parse result.

    Returns:
        True when the answer is degenerate, has no observations, or has neither tags nor list lines at all.
    """
    if observer_output_problem(parsed) is not None:
        return True
    raw = parsed.raw
    has_tags = re.search(r'<observations>', raw, re.IGNORECASE) is not None
    has_list = any(_LIST_LINE.match(line) for line in raw.split('\n'))
    return not (has_tags or has_list)


# ---------------------------------------------------------------------------------------------------------------------
# Sanitizing, degenerate detection, time sorting
# ---------------------------------------------------------------------------------------------------------------------


def sanitize_observation_lines(text: str) -> str:
    """Cap every line at 10 000 characters, marking cut lines with ` … [truncated]`.

    Args:
        text: Observation text.

    Returns:
        The text with over-long lines cut; everything else unchanged.
    """
    if not text:
        return text
    lines = text.split('\n')
    if all(len(line) <= MAX_OBSERVATION_LINE_CHARS for line in lines):
        return text
    return '\n'.join(
        line[:MAX_OBSERVATION_LINE_CHARS] + LINE_TRUNCATION_SUFFIX if len(line) > MAX_OBSERVATION_LINE_CHARS else line
        for line in lines
    )


_DEGENERATE_MIN_CHARS = 2000
_WINDOW = 200
_MIN_COUNTED_LINE = 24
_COLLAPSE_MAX_RUN_CHARS = 10_000
_OVERLONG_LINE = 50_000
_SHORT_LOOP_MAX_CHARS = 10_000
_TAG_ONLY_LINE = re.compile(r'^\s*</?[A-Za-z][\w-]*(?:\s[^>]*)?>\s*$')
_DATE_LINE = re.compile(r'^\s*Date:', re.IGNORECASE)


def _collapse_single_runs(lines: list[str]) -> list[str]:
    """Collapse back-to-back copies of a line when that is the line's only run and the run is modest.

    A model that writes the same line two or three times in a row is sloppy, not looping; treating that as a
    loop caused false positives upstream. A long run, or a line recurring in several places, is left alone.
    """
    runs: list[tuple[str, int]] = []
    for line in lines:
        if runs and runs[-1][0] == line:
            runs[-1] = (line, runs[-1][1] + 1)
        else:
            runs.append((line, 1))
    run_count: dict[str, int] = {}
    for line, _ in runs:
        run_count[line] = run_count.get(line, 0) + 1
    out: list[str] = []
    for line, repeat in runs:
        if repeat > 1 and run_count[line] == 1 and len(line) * repeat <= _COLLAPSE_MAX_RUN_CHARS:
            out.append(line)
        else:
            out.extend([line] * repeat)
    return out


def _window_duplicates(text: str) -> bool:
    step = max(1, len(text) // 50)
    seen: set[str] = set()
    total = duplicates = 0
    for start in range(0, len(text) - _WINDOW + 1, step):
        window = text[start : start + _WINDOW]
        total += 1
        if window in seen:
            duplicates += 1
        else:
            seen.add(window)
    return total > 5 and duplicates / total > 0.4


def detect_degenerate_repetition(text: str) -> bool:
    """Detect a repetition loop in model output (the newer, lower-false-positive variant).

    Never fires under 2000 characters. Modest back-to-back duplicate lines are collapsed first, then the text is
    degenerate when any of these holds:

    1. sampled 200-character windows over the lines of at least 24 characters repeat more than 40% of the time
       (needs at least 2000 characters of such lines and more than 5 windows);
    2. at least 20 lines of 24+ characters, more than half of them exact duplicates;
    3. inside a run of short lines, repeated short lines (tag-only and `Date:` lines excluded) exceed
       10 000 characters;
    4. a single line is longer than 50 000 characters.

    Args:
        text: Model output, normally already line-sanitized.

    Returns:
        True when the output should be rejected.
    """
    if len(text) < _DEGENERATE_MIN_CHARS:
        return False
    raw_lines = text.split('\n')
    if any(len(line) > _OVERLONG_LINE for line in raw_lines):
        return True
    lines = _collapse_single_runs(raw_lines)

    counted = [line for line in lines if len(line) >= _MIN_COUNTED_LINE]
    window_text = '\n'.join(counted)
    if len(window_text) >= _DEGENERATE_MIN_CHARS and _window_duplicates(window_text):
        return True

    if len(counted) >= 20 and (len(counted) - len(set(counted))) / len(counted) > 0.5:
        return True

    seen_short: set[str] = set()
    repeated_chars = 0
    for line in lines:
        if len(line) >= _MIN_COUNTED_LINE:
            # A long line ends the current run of short lines.
            seen_short.clear()
            repeated_chars = 0
            continue
        if not line.strip() or _TAG_ONLY_LINE.match(line) or _DATE_LINE.match(line):
            continue
        if line in seen_short:
            repeated_chars += len(line)
            if repeated_chars > _SHORT_LOOP_MAX_CHARS:
                return True
        else:
            seen_short.add(line)
    return False


_ITEM_TIME = re.compile(r'^[*-][ \t]+(?:[^\s(]+[ \t]+)?\((\d{1,2}):(\d{2})(?:[ \t]*([AaPp])\.?[Mm]\.?)?\)')


def _sort_group(lines: list[str]) -> list[str]:
    """Sort one date group's top-level items by time, or return it unchanged when the order is not clear-cut."""
    trailing: list[str] = []
    while lines and not lines[-1].strip():
        trailing.insert(0, lines.pop())
    items: list[list[str]] = []
    for line in lines:
        if line.startswith(('* ', '- ')):
            items.append([line])
        elif line[:1] in (' ', '\t') and items and line.strip():
            items[-1].append(line)
        else:
            return lines + trailing
    if len(items) < 2:
        return lines + trailing

    keyed: list[tuple[int, int, str | None, bool]] = []  # (hour, minute, am/pm letter, zero-padded hour)
    for item in items:
        match = _ITEM_TIME.match(item[0])
        if match is None:
            return lines + trailing
        hour = match.group(1)
        keyed.append((int(hour), int(match.group(2)), match.group(3), hour.startswith('0')))
    markers = {k[2] is not None for k in keyed}
    if len(markers) > 1:
        return lines + trailing
    if markers == {True}:
        minutes = [(h % 12 + (12 if m and m.lower() == 'p' else 0)) * 60 + mm for h, mm, m, _ in keyed]
    else:
        # Without AM/PM, times are 24-hour only when something proves it (an hour of 0 or 13+, or a zero-padded
        # hour); otherwise "2:30" could be afternoon and sorting could scramble the real order.
        if not any(padded or h == 0 or h >= 13 for h, _, _, padded in keyed):
            return lines + trailing
        minutes = [h * 60 + mm for h, mm, _, _ in keyed]
    order = sorted(range(len(items)), key=lambda i: minutes[i])
    return [line for i in order for line in items[i]] + trailing


def sort_observations_by_time(text: str) -> str:
    """Within each `Date:` group, order top-level items by their leading `(HH:MM)` time.

    Sub-lines move with their item; the sort is stable. A group is left as written when any item has no time,
    AM/PM marking is mixed, 12- and 24-hour readings would be ambiguous, or a non-list, non-indented line sits
    inside the group. Text before the first `Date:` line is never reordered.

    Args:
        text: Observation text.

    Returns:
        The text with groups sorted where that is safe.
    """
    if not text:
        return text
    lines = text.split('\n')
    out: list[str] = []
    group: list[str] | None = None
    for line in lines:
        if _DATE_LINE.match(line) and not line[:1].isspace():
            if group is not None:
                out.extend(_sort_group(group))
            out.append(line)
            group = []
        elif group is None:
            out.append(line)
        else:
            group.append(line)
    if group is not None:
        out.extend(_sort_group(group))
    return '\n'.join(out)


# ---------------------------------------------------------------------------------------------------------------------
# Observer context budget (previousObserverTokens)
# ---------------------------------------------------------------------------------------------------------------------


def _marker(hidden: int) -> str:
    return f'[{hidden} observations truncated here]'


def _is_important(line: str) -> bool:
    return '🔴' in line or '✅' in line


def _assemble(lines: list[str], kept: list[int]) -> str:
    """Join the kept lines in order, turning each hidden gap into a marker (a 1-line gap keeps its line)."""
    out: list[str] = []
    previous = -1
    for index in kept:
        gap = index - previous - 1
        if gap == 1:
            out.append(lines[previous + 1])
        elif gap > 1:
            out.append(_marker(gap))
        out.append(lines[index])
        previous = index
    gap = len(lines) - previous - 1
    if gap == 1:
        out.append(lines[-1])
    elif gap > 1:
        out.append(_marker(gap))
    return '\n'.join(out)


def truncate_observations_to_token_budget(text: str, budget: int, count: Count) -> str:
    """Shrink observations to `budget` tokens, keeping the newest lines and as many 🔴/✅ lines as fit.

    Every split point is a candidate: keep the tail after it, plus the newest important lines before it (never
    more than the tail has lines, so at least half of what is kept is the raw tail), dropping the oldest important
    lines until a cheap lower bound (line costs, markers excluded) fits. Hidden stretches become
    `[K observations truncated here]`; a 1-line gap keeps its line instead. The winner keeps the most important
    lines, then the longest tail. Candidates are assembled and counted in that preference order, so usually only a
    few full counts are needed. Unlike the reference, a split point whose candidate overshoots once markers are
    added also offers versions with fewer important lines, so a fitting answer is never missed for that reason.

    Args:
        text: The observations.
        budget: Token budget.
        count: Token counter.

    Returns:
        Text within the budget; `[<n> observations truncated here]` when nothing fits, '' for a zero budget.
    """
    if budget <= 0:
        return ''
    if count(text) <= budget:
        return text
    lines = text.split('\n')
    n = len(lines)
    cost = [count(line) for line in lines]
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + cost[i]
    important = [i for i, line in enumerate(lines) if _is_important(line)]

    # Each variant is (important kept, tail length, tail start, oldest important lines dropped). Besides the
    # reference's one candidate per split point, the variants with more important lines dropped are kept as
    # fallbacks: when markers push the reference's pick over budget, a leaner version at the same split point may
    # still fit, where the reference would skip the split point entirely.
    variants: list[tuple[int, int, int, int]] = []
    chosen_by_start: dict[int, list[int]] = {}
    for tail_start in range(n - 1, 0, -1):
        tail_len = n - tail_start
        tail_cost = suffix[tail_start]
        if tail_cost > budget:
            break  # longer tails only cost more
        before = important[: bisect_left(important, tail_start)]
        chosen = before[-tail_len:] if tail_len < len(before) else before
        chosen_by_start[tail_start] = chosen
        chosen_cost = sum(cost[i] for i in chosen)
        for drop in range(len(chosen) + 1):
            if tail_cost + chosen_cost <= budget:
                variants.append((len(chosen) - drop, tail_len, tail_start, drop))
            if drop < len(chosen):
                chosen_cost -= cost[chosen[drop]]

    variants.sort(key=lambda v: (v[0], v[1]), reverse=True)
    for _, _, tail_start, drop in variants:
        candidate = _assemble(lines, chosen_by_start[tail_start][drop:] + list(range(tail_start, n)))
        if count(candidate) <= budget:
            return candidate
    return _marker(n)


def prepare_observer_context(
    existing: str,
    budget: int | None | Literal[False],
    count: Count,
    *,
    buffered_reflection: str | None = None,
    reflected_line_count: int | None = None,
) -> tuple[str, bool]:
    """Shape the previous observations the Observer sees (`previousObserverTokens`).

    Only the Observer's input is affected; stored observations keep every line.

    Args:
        existing: The stored active observations.
        budget: Token budget; None or False disables shaping, 0 hides everything.
        count: Token counter.
        buffered_reflection: A reflection computed in the background but not yet activated.
        reflected_line_count: How many leading lines of `existing` the buffered reflection covers; without it the
            buffered reflection is ignored.

    Returns:
        (context, was_truncated).
    """
    # `0 is False` is false but `0 == False` is true: test identity so a 0 budget is not read as "disabled".
    if budget is None or budget is False:
        return existing, False
    reflection = buffered_reflection if reflected_line_count else None
    if not existing:
        return reflection or '', False
    observations = existing
    if reflection:
        rest = '\n'.join(existing.split('\n')[reflected_line_count:]).strip()
        observations = f'{reflection}\n\n{rest}' if rest else reflection
    if budget == 0:
        return '', True
    if count(observations) > budget:
        return truncate_observations_to_token_budget(observations, budget, count), True
    return observations, False
