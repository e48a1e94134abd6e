"""The built-in offline language model: deterministic, no network, used when no model credentials are set.

It reads the structured input a `ModelRequest` carries (`source_messages`, `source_observations`) instead of
following prompts, and plays each role well enough for local commands and demos (CONTRACT §3):

* **Observer**: writes dated, prioritised observations in the reference's format (spec §13.1 item 3) from what was
  said: user statements 🔴, user questions and tool activity 🟡, assistant replies 🟢, plus `<current-task>`,
  `<suggested-response>` and (when titles are on) `<thread-title>`.
* **Reflector**: really condenses a log (spec §15): merges repeated dates, drops duplicates and low-priority lines,
  more aggressively at higher compression levels, and never drops a 🔴 or ✅ line.
* **Actor**: answers from memory, citing the observation lines that share the most words with the question, and
  says it is offline.
* **Title**: a 2–5 word Title Case title from the first user message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import unquote, urlparse

from om_lib.llm import Content, ModelRequest, ModelResponse, Usage
from om_lib.messages import (
    FilePart,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

__all__ = [
    'STARTUP_NOTICE',
    'OfflineLanguageModel',
    'answer',
    'condense',
    'format_observation_date',
    'make_title',
    'observe',
    'reflect',
]

STARTUP_NOTICE = (
    'No model credentials found: using the built-in offline model (deterministic, no network). '
    'Set GEMINI_API_KEY to use Gemini.'
)

RED, YELLOW, GREEN, DONE = '🔴', '🟡', '🟢', '✅'
_EMOJIS = (RED, YELLOW, GREEN, DONE)

_MONTHS = ('Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec')
_QUESTION_WORDS = frozenset('who what when where why how can could should is are do does which would will did'.split())
_STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been before being below
    between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each
    few for from further had hadn't has hasn't have haven't having he her here hers herself him himself his how i
    i'm if in into is isn't it it's its itself just let's me more most mustn't my myself no nor not now of off on
    once only or other ought our ours ourselves out over own please same shan't she should shouldn't so some such
    than that that's the their theirs them themselves then there there's these they they're this those through to
    too under until up very was wasn't we we're were weren't what what's when where which while who whom why will
    with won't would wouldn't you you're your yours yourself yourselves tell know remember said say told user
    assistant stated asked replied thing things something anything yes okay
    """.split()
)

_USER_LINE_MAX = 200
_ASSISTANT_LINE_MAX = 120
_SNIPPET_MAX = 80
_LONG_MESSAGE_CHARS = 200
_MAX_SENTENCES = 5
_LEVEL3_LINE_MAX = 80
_ACTOR_MAX_CITATIONS = 3
_RECENT_TAIL = 3

_SKIP_HINTS_RE = re.compile(r'do not include\s*<current-task>', re.IGNORECASE)
_TIME_PREFIX_RE = re.compile(r'^\(\d{1,2}:\d{2}(?:\s*[AP]M)?\)\s*', re.IGNORECASE)
_BOUNDARY_RE = re.compile(r'^---\s*message boundary\s*\(.*\)\s*---$')
_THREAD_OPEN_RE = re.compile(r'^<thread\s+id="([^"]*)"\s*>(.*)$')
_HINT_BLOCK_RE = re.compile(r'^<(current-task|suggested-response|thread-title)>(.*)$')
_XML_TAG_LINE_RE = re.compile(r'^</?[A-Za-z][\w-]*(?:\s[^>]*)?>$')
_SENTENCE_SPLIT_RE = re.compile(r'(?<=[.!?])\s+(?=\S)')
_WORD_RE = re.compile(r"[a-z0-9][a-z0-9'_-]*")


def format_observation_date(dt: datetime) -> str:
    """The reference's `Date:` header value, e.g. `Jan 1, 2025` (UTC, no leading zero on the day)."""
    d = dt.astimezone(UTC)
    return f'{_MONTHS[d.month - 1]} {d.day}, {d.year}'


def make_title(text: str) -> str:
    """A 2–5 word Title Case title drawn from `text` (stopwords dropped when enough other words remain)."""
    words = [w.strip("'_-") for w in re.findall(r"[A-Za-z0-9][A-Za-z0-9'_-]*", _strip_reminders(text))]
    words = [w for w in words if w]
    content = [w for w in words if w.lower() not in _STOPWORDS and len(w) > 1]
    chosen = content if len(content) >= 2 else words
    chosen = chosen[:5]
    if not chosen:
        return 'New Conversation'
    if len(chosen) == 1:
        chosen = [chosen[0], 'Conversation']
    return ' '.join(w[:1].upper() + w[1:] for w in chosen)


class OfflineLanguageModel:
    """A deterministic stand-in for a real model (provider key `offline`). Never touches the network.

    Implements `om_lib.ports.LanguageModel`. Every call succeeds; `timeout_s` is accepted and ignored because the
    work is local and quick.
    """

    def generate(self, model_id: str, request: ModelRequest, *, timeout_s: float) -> ModelResponse:
        """Answer `request` according to its `purpose`.

        Args:
            model_id: The id after `offline/` ('' for the bare `offline` provider); only echoed back in `model`.
            request: The request; the offline model reads `source_messages` / `source_observations` for the
                Observer and Reflector, and `system` / `contents` for the Actor.
            timeout_s: Ignored.

        Returns:
            A ModelResponse with text only (no function calls) and rough token counts (characters / 4).
        """
        del timeout_s
        if request.purpose == 'observer':
            text = observe(request)
        elif request.purpose == 'reflector':
            text = reflect(request)
        elif request.purpose == 'title':
            text = _title_for(request)
        else:
            text = answer(request)
        input_chars = len(request.system) + sum(len(p) for c in request.contents for p in c.parts if isinstance(p, str))
        return ModelResponse(
            text=text,
            model=f'offline/{model_id}' if model_id else 'offline',
            usage=Usage(input_tokens=input_chars // 4, output_tokens=len(text) // 4),
            finish_reason='STOP',
        )


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------
def _collapse(text: str) -> str:
    return ' '.join(text.split())


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + '…'


def _strip_reminders(text: str) -> str:
    return re.sub(r'<system-reminder>.*?(</system-reminder>|$)', ' ', text, flags=re.DOTALL)


def _user_prompt_text(contents: Iterable[Content]) -> str:
    return '\n'.join(p for c in contents if c.role == 'user' for p in c.parts if isinstance(p, str))


def _skip_hints(request: ModelRequest) -> bool:
    return bool(_SKIP_HINTS_RE.search(_user_prompt_text(request.contents)))


def _normalize(text: str) -> str:
    """An observation's text for duplicate detection: no bullet, emoji or time; lower case; single spaces."""
    t = text.strip()
    if t[:2] in ('* ', '- '):
        t = t[2:].lstrip()
    for emoji in _EMOJIS:
        if t.startswith(emoji):
            t = t[len(emoji) :].lstrip()
    t = _TIME_PREFIX_RE.sub('', t)
    return _collapse(t).lower().rstrip('.!;,: ')


def _is_question(text: str) -> bool:
    t = text.strip()
    if t.endswith('?'):
        return True
    first = re.match(r"[A-Za-z']+", t)
    return first is not None and first.group(0).lower() in _QUESTION_WORDS


def _words(text: str) -> set[str]:
    out: set[str] = set()
    for w in _WORD_RE.findall(text.lower()):
        w = w.strip("'_-")
        if w.endswith("'s"):
            w = w[:-2]
        if len(w) < 3 or w in _STOPWORDS:
            continue
        if len(w) > 4 and w.endswith('s') and not w.endswith('ss'):
            w = w[:-1]
        out.add(w)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Observer
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Obs:
    at: datetime
    emoji: str
    text: str

    @property
    def date(self) -> str:
        return format_observation_date(self.at)

    @property
    def hhmm(self) -> str:
        return self.at.astimezone(UTC).strftime('%H:%M')

    def line(self) -> str:
        return f'* {self.emoji} ({self.hhmm}) {self.text}'


def _attachment_label(part: ImagePart | FilePart) -> str:
    if part.filename:
        return part.filename
    if part.url and not part.url.startswith('data:'):
        base = unquote(urlparse(part.url).path.rsplit('/', 1)[-1])
        if base:
            return base
    return part.media_type or ('an image' if isinstance(part, ImagePart) else 'a file')


def _result_snippet(result: object) -> str:
    if result is None:
        return ''
    if isinstance(result, str):
        text = result
    else:
        import json

        try:
            text = json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = str(result)
    return _truncate(_collapse(text), _SNIPPET_MAX)


def _user_text_observations(at: datetime, text: str) -> list[_Obs]:
    flat = _collapse(text)
    if not flat:
        return []
    if len(flat) > _LONG_MESSAGE_CHARS:
        # Repeated sentences count once; only the first few distinct ones become observations.
        sentences = list(dict.fromkeys(s.strip() for s in _SENTENCE_SPLIT_RE.split(flat) if s.strip()))
    else:
        sentences = [flat]
    out: list[_Obs] = []
    for sentence in sentences[:_MAX_SENTENCES]:
        s = _truncate(sentence.strip(), _USER_LINE_MAX)
        if _is_question(s):
            out.append(_Obs(at, YELLOW, f'User asked: {s}'))
        else:
            out.append(_Obs(at, RED, f'User stated: {s}'))
    return out


def _message_observations(message: Message) -> list[_Obs]:
    at = message.created_at if message.created_at.tzinfo else message.created_at.replace(tzinfo=UTC)
    role = message.role
    label = 'User' if role == 'user' else 'Assistant'
    out: list[_Obs] = []
    pending_text: list[str] = []

    def flush() -> None:
        text = '\n'.join(pending_text)
        pending_text.clear()
        if not text.strip():
            return
        if role == 'user':
            out.extend(_user_text_observations(at, text))
        else:
            out.append(_Obs(at, GREEN, f'Assistant replied: {_truncate(_collapse(text), _ASSISTANT_LINE_MAX)}'))

    for part in message.parts:
        if isinstance(part, TextPart):
            if part.text.lstrip().startswith('<system-reminder>'):
                continue
            pending_text.append(part.text)
            continue
        flush()
        if isinstance(part, ReasoningPart):
            continue
        if isinstance(part, ToolCallPart):
            out.append(_Obs(at, YELLOW, f'Assistant called tool {part.tool_name}'))
        elif isinstance(part, ToolResultPart):
            snippet = _result_snippet(part.result)
            verb = 'failed' if part.is_error else 'returned'
            out.append(_Obs(at, YELLOW, f'Tool {part.tool_name} {verb}' + (f': {snippet}' if snippet else '')))
        elif isinstance(part, ImagePart | FilePart):
            kind = 'image' if isinstance(part, ImagePart) else 'file'
            out.append(_Obs(at, YELLOW, f'{label} shared {kind} {_attachment_label(part)}'))
    flush()
    return out


def _last_user_text(messages: Sequence[Message]) -> str:
    for m in reversed(messages):
        if m.role != 'user':
            continue
        texts = [p.text for p in m.parts if isinstance(p, TextPart) and not p.text.lstrip().startswith('<system-')]
        text = _collapse(' '.join(texts))
        if text:
            return text
    return ''


def _previous_keys(previous: str) -> set[tuple[str, str, str]]:
    keys: set[tuple[str, str, str]] = set()
    date = ''
    for raw in previous.splitlines():
        line = raw.strip()
        if line.startswith('Date:'):
            date = line[5:].strip()
            continue
        body = line[2:].lstrip() if line[:2] in ('* ', '- ') else ''
        for emoji in _EMOJIS:
            if body.startswith(emoji):
                body = body[len(emoji) :].lstrip()
        m = re.match(r'^\((\d{1,2}:\d{2})\)', body)
        if m:
            keys.add((date, m.group(1), _normalize(line)))
    return keys


def _observation_block(observations: Sequence[_Obs]) -> list[str]:
    lines: list[str] = []
    current = None
    for o in observations:
        if o.date != current:
            current = o.date
            lines.append(f'Date: {current}')
        lines.append(o.line())
    return lines


def _observe_messages(messages: Sequence[Message], previous: set[tuple[str, str, str]]) -> tuple[list[_Obs], str, str]:
    observations: list[_Obs] = []
    seen: set[tuple[str, str, str]] = set(previous)
    ordered = sorted(messages, key=lambda m: (m.created_at, m.seq or 0))
    for message in ordered:
        if message.role == 'system':
            continue
        for o in _message_observations(message):
            key = (o.date, o.hhmm, _normalize(o.text))
            if key in seen:
                continue
            seen.add(key)
            observations.append(o)
    if not observations:
        if ordered:
            at = ordered[-1].created_at
        else:
            at = datetime.now(UTC)
        observations.append(_Obs(at, GREEN, 'Nothing notable happened in this exchange.'))
    last_user = _last_user_text(ordered)
    if last_user:
        task = f'Primary: {_truncate(last_user, _ASSISTANT_LINE_MAX)}'
    else:
        task = 'Primary: none yet (waiting for the user)'
    if ordered and ordered[-1].role == 'user' and last_user:
        hint = f'Respond to the user\'s latest message: "{_truncate(last_user, _SNIPPET_MAX)}"'
    else:
        hint = "Wait for the user's next message and continue from the last reply."
    return observations, task, hint


_NEW_HISTORY = '## New Message History to Observe'
_PROMPT_THREAD_RE = re.compile(r'^<thread id="([^"]*)">$', re.MULTILINE)


def _shown_thread_ids(request: ModelRequest) -> list[str]:
    """The thread ids of the prompt's new message history, in order (what a multi-thread answer must use)."""
    prompt = next((p for c in request.contents for p in c.parts if isinstance(p, str)), '')
    history = prompt.split(_NEW_HISTORY, 1)[1] if _NEW_HISTORY in prompt else ''
    return list(dict.fromkeys(_PROMPT_THREAD_RE.findall(history)))


def observe(request: ModelRequest) -> str:
    """The offline Observer's output for an observer request (see the module docstring)."""
    messages = list(request.source_messages)
    skip = _skip_hints(request)
    titles = '<thread-title>' in request.system
    previous = _previous_keys(request.source_observations)
    thread_ids = list(dict.fromkeys(m.thread_id for m in messages))
    multi = 'MULTI-THREAD INPUT' in request.system.upper() or len([t for t in thread_ids if t]) > 1

    def sections(msgs: Sequence[Message]) -> tuple[list[str], list[str]]:
        obs, task, hint = _observe_messages(msgs, previous)
        extra: list[str] = []
        if not skip:
            extra += ['<current-task>', task, '</current-task>', '<suggested-response>', hint, '</suggested-response>']
        first_user = next((m for m in sorted(msgs, key=lambda m: m.created_at) if m.role == 'user'), None)
        if titles and first_user is not None and first_user.text().strip():
            extra.append(f'<thread-title>{make_title(first_user.text())}</thread-title>')
        return _observation_block(obs), extra

    if multi and messages:
        # Answer with the ids the prompt shows (obscured by default), in the order it lists the threads.
        shown = _shown_thread_ids(request)
        lines = ['<observations>']
        for index, tid in enumerate(thread_ids):
            label = shown[index] if len(shown) == len(thread_ids) else (tid or '')
            block, extra = sections([m for m in messages if m.thread_id == tid])
            lines += [f'<thread id="{label}">', *block, *extra, '</thread>']
        lines.append('</observations>')
        return '\n'.join(lines)

    block, extra = sections(messages)
    return '\n'.join(['<observations>', *block, '</observations>', *extra])


# ----------------------------------------------------------------------------------------------------------------
# Reflector
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class _Item:
    """One top-level observation line with its indented sub-lines."""

    line: str
    subs: list[str] = field(default_factory=list)

    @property
    def priority(self) -> str:
        body = self.line.strip()
        bulleted = body[:2] in ('* ', '- ') or bool(re.match(r'\d+\.\s', body))
        if bulleted:
            body = body.split(None, 1)[1] if len(body.split(None, 1)) > 1 else ''
        for emoji in _EMOJIS:
            if body.startswith(emoji):
                return emoji
        return YELLOW if bulleted else 'other'

    def render(self) -> list[str]:
        return [self.line, *self.subs]


@dataclass
class _Group:
    date: str | None
    items: list[_Item] = field(default_factory=list)


@dataclass
class _Segment:
    thread_id: str | None
    groups: list[_Group] = field(default_factory=list)

    def group(self, date: str | None) -> _Group:
        for g in self.groups:
            if g.date == date:
                return g
        g = _Group(date)
        self.groups.append(g)
        return g


def _parse_log(text: str) -> list[_Segment]:
    """Split an observation log into thread segments → date groups → items, merging repeated dates and threads."""
    segments: dict[str | None, _Segment] = {}

    def segment(tid: str | None) -> _Segment:
        if tid not in segments:
            segments[tid] = _Segment(tid)
        return segments[tid]

    current_thread: str | None = None
    current_date: dict[str | None, str | None] = {}
    last_item: _Item | None = None
    skipping: str | None = None
    pending = text.splitlines()
    i = 0
    while i < len(pending):
        raw = pending[i].rstrip()
        i += 1
        stripped = raw.strip()
        if skipping is not None:
            if f'</{skipping}>' in stripped:
                skipping = None
            continue
        if not stripped:
            continue
        m = _THREAD_OPEN_RE.match(stripped)
        if m:
            current_thread = m.group(1)
            last_item = None
            rest = m.group(2).strip()
            if rest:
                pending.insert(i, rest)
            continue
        if stripped.startswith('</thread>'):
            current_thread = None
            last_item = None
            continue
        m = _HINT_BLOCK_RE.match(stripped)
        if m:
            if f'</{m.group(1)}>' not in m.group(2):
                skipping = m.group(1)
            continue
        if _BOUNDARY_RE.match(stripped) or _XML_TAG_LINE_RE.match(stripped):
            last_item = None
            continue
        seg = segment(current_thread)
        if stripped.startswith('Date:'):
            current_date[current_thread] = _collapse(stripped[5:])
            seg.group(current_date[current_thread])
            last_item = None
            continue
        group = seg.group(current_date.get(current_thread))
        indented = raw[:1] in (' ', '\t')
        if indented and last_item is not None:
            last_item.subs.append(raw)
            continue
        last_item = _Item(stripped if not indented else raw)
        group.items.append(last_item)
    return [s for s in segments.values() if any(g.items for g in s.groups)]


_RANK = {DONE: 4, RED: 4, 'other': 3, YELLOW: 2, GREEN: 1}


def _dedupe(segment: _Segment) -> None:
    seen: dict[str, _Item] = {}
    for group in segment.groups:
        kept: list[_Item] = []
        for item in group.items:
            key = _normalize(item.line)
            if not key:
                continue
            first = seen.get(key)
            if first is None:
                seen[key] = item
                kept.append(item)
                continue
            # A repeat: keep one copy, with the higher priority and every distinct sub-line.
            if _RANK[item.priority] > _RANK[first.priority]:
                first.line = item.line
            first.subs.extend(s for s in item.subs if s not in first.subs)
        group.items = kept


def _merge_yellow_runs(items: list[_Item]) -> list[_Item]:
    out: list[_Item] = []
    run: list[_Item] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            head = run[0].line
            texts = [_strip_prefix(it.line) for it in run]
            prefix = head[: len(head) - len(_strip_prefix(head))]
            merged = _Item(prefix + '; '.join(t.rstrip('.;') for t in texts))
            for it in run:
                merged.subs.extend(it.subs)
            out.append(merged)
        run.clear()

    for item in items:
        if item.priority == YELLOW:
            run.append(item)
        else:
            flush()
            out.append(item)
    flush()
    return out


def _strip_prefix(line: str) -> str:
    """The text of an observation line after its bullet, emoji and time."""
    t = line.strip()
    if t[:2] in ('* ', '- '):
        t = t[2:].lstrip()
    for emoji in _EMOJIS:
        if t.startswith(emoji):
            t = t[len(emoji) :].lstrip()
    return _TIME_PREFIX_RE.sub('', t)


def _condense_segment(segment: _Segment, level: int) -> None:
    _dedupe(segment)
    groups = [g for g in segment.groups if g.items]
    for group in groups[:-1]:
        # Older dates: condensed harder the higher the level.
        items = [it for it in group.items if it.priority != GREEN]
        if level >= 1:
            items = _merge_yellow_runs(items)
        if level >= 2:
            items = [it for it in items if it.priority != YELLOW]
            for it in items:
                it.subs = []
        if level >= 3:
            for it in items:
                it.line = _truncate(it.line, _LEVEL3_LINE_MAX)
        group.items = items
    if groups and level >= 1:
        # The newest date keeps its last few items in full; earlier ones in it are condensed from level 1.
        last = groups[-1]
        cut = max(0, len(last.items) - _RECENT_TAIL)
        older, recent = last.items[:cut], last.items[cut:]
        older = _merge_yellow_runs([it for it in older if it.priority != GREEN])
        if level >= 2:
            recent = [it for it in recent if it.priority != GREEN]
        if level >= 3:
            older = [it for it in older if it.priority != YELLOW]
            for it in older:
                it.line = _truncate(it.line, _ASSISTANT_LINE_MAX)
        last.items = older + recent
    segment.groups = [g for g in groups if g.items]


def _render_segment(segment: _Segment) -> list[str]:
    lines: list[str] = []
    for group in segment.groups:
        if group.date is not None:
            lines.append(f'Date: {group.date}')
        for item in group.items:
            lines.extend(item.render())
    return lines


def _reflection_level(prompt: str) -> int:
    marker = prompt.rfind('Please analyze these observations')
    tail = (prompt[marker:] if marker >= 0 else prompt).upper()
    if 'CRITICAL COMPRESSION REQUIRED' in tail:
        return 3
    if 'AGGRESSIVE COMPRESSION REQUIRED' in tail:
        return 2
    if 'COMPRESSION REQUIRED' in tail:
        return 1
    return 0


def _observations_from_prompt(prompt: str) -> str:
    m = re.search(r'## OBSERVATIONS TO REFLECT ON\s*\n(.*?)\n-{3,}\s*\n\s*Please analyze', prompt, re.DOTALL)
    return m.group(1).strip() if m else ''


def condense(observations: str, level: int = 0) -> str:
    """Condense an observation log at compression `level` 0–3 (the offline Reflector's core; no tags added).

    Every level merges repeated `Date:` headers and `<thread id>` sections, removes message boundaries, drops
    duplicate lines (same text after the time) and 🟢 lines older than the last date group, and keeps every 🔴 and
    ✅ line. Level 1 also merges runs of 🟡 lines into one line and drops the last group's 🟢 lines except its newest
    few items; level 2 drops 🟡 lines (and sub-lines) outside the last date group and every 🟢 line; level 3 also
    truncates older lines to 80 characters and drops the last group's 🟡 lines except its newest few items.
    """
    level = max(0, min(3, level))
    inner = observations.strip()
    m = re.fullmatch(r'<observations>\s*(.*?)\s*</observations>', inner, re.DOTALL | re.IGNORECASE)
    if m:
        inner = m.group(1)
    out: list[str] = []
    for segment in _parse_log(inner):
        _condense_segment(segment, level)
        body = _render_segment(segment)
        if not body:
            continue
        if segment.thread_id is None:
            out.extend(body)
        else:
            out.extend([f'<thread id="{segment.thread_id}">', *body, '</thread>'])
    return '\n'.join(out)


def reflect(request: ModelRequest) -> str:
    """The offline Reflector's output for a reflector request (see `condense`)."""
    prompt = _user_prompt_text(request.contents)
    source = request.source_observations or _observations_from_prompt(prompt)
    body = condense(source, _reflection_level(prompt))
    if not body:
        body = f'* {GREEN} Nothing notable is remembered yet.'
    return f'<observations>\n{body}\n</observations>'


# ----------------------------------------------------------------------------------------------------------------
# Actor and title
# ----------------------------------------------------------------------------------------------------------------
_OFFLINE_PREFIX = "(offline model) I can't think offline, but here is what I remember that looks relevant:"
_NOTHING = "(offline model) I don't remember anything about that yet."


def _memory_lines(system: str) -> list[tuple[str | None, str]]:
    """(date, line) for every observation line of the memory system text."""
    text = system
    start = text.find('<observations>')
    if start >= 0:
        text = text[start + len('<observations>') :]
        ends = [
            i for i in (text.find(t) for t in ('</observations>', '<current-task>', '<suggested-response>')) if i >= 0
        ]
        if ends:
            text = text[: min(ends)]
    out: list[tuple[str | None, str]] = []
    date: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith('Date:'):
            date = line[5:].strip()
        elif line[:2] in ('* ', '- ') and len(line) > 2:
            out.append((date, line[2:].strip()))
    return out


def _last_user_content_text(contents: Sequence[Content]) -> str:
    for content in reversed(contents):
        if content.role != 'user':
            continue
        texts = [p for p in content.parts if isinstance(p, str) and not p.lstrip().startswith('<system-reminder>')]
        text = _collapse(_strip_reminders(' '.join(texts)))
        if text:
            return text
    return ''


def answer(request: ModelRequest) -> str:
    """The offline Actor's answer: the (up to 3) remembered lines sharing the most words with the last question."""
    question = _last_user_content_text(request.contents)
    wanted = _words(question)
    lines = _memory_lines(request.system)
    scored: list[tuple[int, int, str | None, str]] = []
    for index, (date, line) in enumerate(lines):
        score = len(wanted & _words(_strip_prefix(line)))
        if score > 0:
            scored.append((score, index, date, line))
    if not scored:
        return _NOTHING
    best = sorted(scored, key=lambda s: (-s[0], -s[1]))[:_ACTOR_MAX_CITATIONS]
    best.sort(key=lambda s: s[1])
    cited = [f'- {date}: {line}' if date else f'- {line}' for _, _, date, line in best]
    return '\n'.join([_OFFLINE_PREFIX, *cited])


def _title_for(request: ModelRequest) -> str:
    first = next((m for m in sorted(request.source_messages, key=lambda m: m.created_at) if m.role == 'user'), None)
    if first is not None and first.text().strip():
        return make_title(first.text())
    for content in request.contents:
        if content.role == 'user':
            text = ' '.join(p for p in content.parts if isinstance(p, str))
            if _strip_reminders(text).strip():
                return make_title(text)
    return make_title('')
