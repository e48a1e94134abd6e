"""The built-in offline language model: deterministic, no network, used when no model credentials are set.

It is what a newcomer sees first, so it plays each role well enough to show observational memory working (CONTRACT
§3). It reads the structured input a `ModelRequest` carries (`source_messages`, `source_observations`) instead of
following prompts:

* **Observer**: dated, prioritised observations in the reference's format (spec §13.1 item 3) from what was said,
  one line per sentence the user said, each kept whole: statements 🔴, questions 🟡, the assistant's reply 🟢 (its
  first sentence), tool activity 🟡; plus `<current-task>`, `<suggested-response>` and (titles on) `<thread-title>`.
* **Reflector**: really condenses a log (spec §15) toward a size it can reach: about 55% of its input at level 0,
  down to 20% at level 3 (below every target the ladder asks for once the log is past its threshold). It merges
  repeated dates, threads and duplicates, drops chatter, then folds older days into one line per day (the user's
  facts joined, filler words left out), oldest first, until the log fits. The newest day keeps its detail longest;
  `## Group` / `_range:` lines of retrieval mode pass through untouched, so recall still finds the messages.
* **Actor**: answers a question with the remembered lines that match it (words weighted by how rare they are in
  memory, with a few everyday synonyms), quoting them with their date; it acknowledges a statement; and it says it is
  offline.
* **Title**: a 2–5 word Title Case title from the first user message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
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
    time_of,
)
from om_lib.ports import TextSink

__all__ = [
    'OFFLINE_ANSWER_PREFIX',
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
# Every offline Actor answer starts with this (the Observer recognises its own answers by it).
OFFLINE_ANSWER_PREFIX = '(offline model)'

RED, YELLOW, GREEN, DONE = '🔴', '🟡', '🟢', '✅'
_EMOJIS = (RED, YELLOW, GREEN, DONE)

_MONTHS = ('Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec')
_QUESTION_WORDS = frozenset('who what when where why how can could should is are do does which would will did'.split())
_STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been before being below
    between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during each
    few for from further had hadn't has hasn't have haven't having he her here hers herself him himself his how i
    i'm i've i'd if in into is isn't it it's its itself just let's me more most mustn't my myself no nor not now of
    off on once only or other ought our ours ourselves out over own please same shan't she should shouldn't so some
    such than that that's the their theirs them themselves then there there's these they they're this those through
    to too under until up very was wasn't we we're were weren't what what's when where which while who whom why will
    with won't would wouldn't you you're your yours yourself yourselves tell know remember said say told user
    assistant stated asked replied thing things something anything yes okay ok hi hello hey thanks thank really
    """.split()
)
# Question words that point at facts stated in other words ("where do I live?" → "I moved to Lisbon").
_SYNONYMS: dict[str, tuple[str, ...]] = {
    'live': ('home', 'moved', 'based', 'city', 'reside', 'apartment', 'house'),
    'home': ('live', 'moved', 'house', 'apartment'),
    'work': ('job', 'employer', 'company', 'engineer', 'office'),
    'job': ('work', 'employer', 'company', 'profession'),
    'born': ('birthday', 'birth'),
    'birthday': ('born', 'birth'),
    'eat': ('food', 'vegetarian', 'vegan', 'allergic', 'diet', 'dish'),
    'food': ('eat', 'vegetarian', 'vegan', 'allergic', 'favorite', 'favourite', 'dish'),
    'allergic': ('allergy', 'eat', 'can'),
    'pet': ('dog', 'cat', 'bird', 'fish', 'rabbit'),
    'name': ('called', 'named'),
    'afraid': ('fear', 'scared', 'phobia'),
    'fear': ('afraid', 'scared', 'phobia'),
    'scared': ('afraid', 'fear', 'phobia'),
    'grow': ('plant', 'garden', 'growing'),
    'spend': ('budget', 'cost', 'price', 'dollars', 'euros', 'money', 'afford'),
    'budget': ('spend', 'cost', 'price', 'dollars', 'euros', 'money', 'max'),
    'cost': ('price', 'budget', 'dollars', 'euros', 'spend'),
    'price': ('cost', 'budget', 'dollars', 'euros'),
    'called': ('name', 'named'),
    'old': ('age', 'born'),
    'age': ('old', 'born'),
    'married': ('wife', 'husband', 'partner', 'spouse'),
    'partner': ('wife', 'husband', 'married', 'spouse', 'boyfriend', 'girlfriend'),
    'car': ('drive', 'drives', 'vehicle'),
    'drive': ('car', 'vehicle'),
    'favorite': ('favourite', 'love', 'like', 'prefer'),
    'favourite': ('favorite', 'love', 'like', 'prefer'),
    'like': ('love', 'enjoy', 'prefer', 'favorite', 'favourite'),
}

_ASSISTANT_SENTENCE_MAX = 240
_SNIPPET_MAX = 120
_ACTOR_MAX_CITATIONS = 3
_RECENT_TAIL = 3
# The size a reflection aims for, as a share of its input, by compression level (0-3).
_REFLECTION_SHARE = (0.55, 0.45, 0.32, 0.2)

_SKIP_HINTS_RE = re.compile(r'do not include\s*<current-task>', re.IGNORECASE)
_TIME_PREFIX_RE = re.compile(r'^\(\d{1,2}:\d{2}(?:\s*[AP]M)?\)\s*', re.IGNORECASE)
_BOUNDARY_RE = re.compile(r'^---\s*message boundary\s*\(.*\)\s*---$')
_THREAD_OPEN_RE = re.compile(r'^<thread\s+id="([^"]*)"\s*>(.*)$')
_GROUP_HEADER_RE = re.compile(r'^## Group(?: `[^`\n]+`)+\s*$')
_GROUP_ID_RE = re.compile(r'`([^`\n]+)`')
_RANGE_LINE_RE = re.compile(r'^_range: `[^`\n]*`_\s*$')
_HINT_BLOCK_RE = re.compile(r'^<(current-task|suggested-response|thread-title)>(.*)$')
_XML_TAG_LINE_RE = re.compile(r'^</?[A-Za-z][\w-]*(?:\s[^>]*)?>$')
_SENTENCE_SPLIT_RE = re.compile(r'(?<=[.!?])\s+(?=\S)')
_WORD_RE = re.compile(r"[a-z0-9][a-z0-9'_-]*")
_SPEAKER_RE = re.compile(r'^(User|Assistant) (?:stated|asked|replied):?\s*')


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

    def stream(self, model_id: str, request: ModelRequest, *, timeout_s: float, on_text: TextSink) -> ModelResponse:
        """`generate`, its text handed to `on_text` word by word (each word with the space before it)."""
        response = self.generate(model_id, request, timeout_s=timeout_s)
        for piece in re.findall(r'\s*\S+|\s+$', response.text):
            on_text(piece)
        return response


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------
def _collapse(text: str) -> str:
    return ' '.join(text.split())


def _strip_reminders(text: str) -> str:
    return re.sub(r'<system-reminder>.*?(</system-reminder>|$)', ' ', text, flags=re.DOTALL)


def _user_prompt_text(contents: Iterable[Content]) -> str:
    return '\n'.join(p for c in contents if c.role == 'user' for p in c.parts if isinstance(p, str))


def _skip_hints(request: ModelRequest) -> bool:
    return bool(_SKIP_HINTS_RE.search(_user_prompt_text(request.contents)))


def _sentences(text: str) -> list[str]:
    """The sentences of `text`, each whole, repeats once."""
    flat = _collapse(text)
    return list(dict.fromkeys(s.strip() for s in _SENTENCE_SPLIT_RE.split(flat) if s.strip()))


def _strip_prefix(line: str) -> str:
    """The text of an observation line after its bullet, emoji and time."""
    t = line.strip()
    if t[:2] in ('* ', '- '):
        t = t[2:].lstrip()
    for emoji in _EMOJIS:
        if t.startswith(emoji):
            t = t[len(emoji) :].lstrip()
    return _TIME_PREFIX_RE.sub('', t)


def _normalize(text: str) -> str:
    """An observation's text for duplicate detection: no bullet, emoji or time; lower case; single spaces."""
    return _collapse(_strip_prefix(text)).lower().rstrip('.!;,: ')


def _is_question(text: str) -> bool:
    t = text.strip()
    if t.endswith('?'):
        return True
    first = re.match(r"[A-Za-z']+", t)
    return first is not None and first.group(0).lower() in _QUESTION_WORDS


def _stem(word: str) -> str:
    """A crude stem, enough to match `lives`/`living`/`lived` to `live` and `keys` to `key`."""
    if len(word) > 4 and word.endswith('ies'):
        word = word[:-3] + 'y'
    elif len(word) > 5 and word.endswith(('ing', 'ed')):
        word = word[: -3 if word.endswith('ing') else -2]
    elif len(word) > 4 and word.endswith('es') and word[:-2].endswith(('s', 'x', 'z', 'ch', 'sh')):
        word = word[:-2]
    elif len(word) > 3 and word.endswith('s') and not word.endswith('ss'):
        word = word[:-1]
    return word[:-1] if len(word) > 3 and word.endswith('e') else word


def _words(text: str) -> set[str]:
    """The content words of `text`, lower case and stemmed (possessives and common suffixes off)."""
    out: set[str] = set()
    for w in _WORD_RE.findall(text.lower()):
        w = w.strip("'_-")
        if w.endswith("'s"):
            w = w[:-2]
        if len(w) < 2 or w in _STOPWORDS:
            continue
        out.add(_stem(w))
    return out


# Words a shortened fact must keep: without them "Sam can't eat shellfish" would say the opposite.
_NEGATIONS = frozenset(
    "no not nor never cannot can't couldn't don't doesn't didn't isn't aren't wasn't weren't won't wouldn't shouldn't "
    "hasn't haven't hadn't mustn't shan't".split()
)
_FILLER = _STOPWORDS - _NEGATIONS


def _telegraphic(text: str) -> str:
    """`text` without filler words (the offline Reflector's way of saying the same in fewer tokens)."""
    kept = [w for w in text.split() if w.lower().strip('.,;:!?"\'()').replace('’', "'") not in _FILLER]
    return ' '.join(kept).strip(' ,;') or text


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
    """A tool result's opening words (whole words; the rest is behind recall)."""
    if result is None:
        return ''
    if isinstance(result, str):
        text = result
    else:
        try:
            text = json.dumps(result, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = str(result)
    text = _collapse(text)
    if len(text) <= _SNIPPET_MAX:
        return text
    cut = text[:_SNIPPET_MAX].rsplit(' ', 1)[0]
    return f'{cut} (+{len(text) - len(cut)} more characters)'


_INTRODUCTION_RE = re.compile(r"^(?:i'm|i am|my name is|call me)\s+([A-Z][\w'-]*)[.!]?$", re.IGNORECASE)


def _user_text_observations(at: datetime, text: str) -> list[_Obs]:
    """One observation per sentence the user said, kept whole; greetings and other content-free words are left out."""
    out: list[_Obs] = []
    for sentence in _sentences(text):
        intro = _INTRODUCTION_RE.match(sentence)
        if intro and intro.group(1)[:1].isupper():
            out.append(_Obs(at, RED, f'User stated their name is {intro.group(1)}.'))
            continue
        if not _words(sentence):
            continue  # "Hi!", "Thanks." and the like say nothing to remember
        if _is_question(sentence):
            out.append(_Obs(at, YELLOW, f'User asked: {sentence}'))
        else:
            out.append(_Obs(at, RED, f'User stated: {sentence}'))
    return out


def _assistant_observation(at: datetime, text: str) -> _Obs | None:
    flat = _collapse(text)
    if not flat:
        return None
    if flat.startswith(OFFLINE_ANSWER_PREFIX):
        return None  # our own quotes of memory: remembering them again would only echo the lines they quote
    first = _sentences(flat)[0]
    if len(first) > _ASSISTANT_SENTENCE_MAX:
        first = _telegraphic(first)
    return _Obs(at, GREEN, f'Assistant replied: {first}')


def _message_observations(message: Message) -> list[_Obs]:
    at = time_of(message)
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
            reply = _assistant_observation(at, text)
            if reply is not None:
                out.append(reply)

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


def _last_user_sentence(messages: Sequence[Message]) -> str:
    """The last sentence of the last user message (whole), for the continuation hints."""
    for m in reversed(messages):
        if m.role != 'user':
            continue
        texts = [p.text for p in m.parts if isinstance(p, TextPart) and not p.text.lstrip().startswith('<system-')]
        sentences = [s for s in _sentences(' '.join(texts)) if _words(s)]
        if sentences:
            return sentences[-1]
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
    ordered = list(messages)  # arrival order, as the Observer is given them (client times may disagree)
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
        at = time_of(ordered[-1]) if ordered else datetime.now(UTC)
        observations.append(_Obs(at, GREEN, 'Nothing notable happened in this exchange.'))
    last_user = _last_user_sentence(ordered)
    task = f'Primary: {last_user}' if last_user else 'Primary: none yet (waiting for the user)'
    if ordered and ordered[-1].role == 'user' and last_user:
        hint = f'Respond to the user\'s latest message: "{last_user}"'
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
        first_user = next((m for m in msgs if m.role == 'user'), None)
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
    summarized: bool = False


@dataclass
class _Segment:
    """A `<thread id>` section (resource scope), a `## Group` section (retrieval mode), or the ungrouped rest."""

    key: str | None
    header: list[str] = field(default_factory=list)
    closing: str | None = None
    groups: list[_Group] = field(default_factory=list)

    def group(self, date: str | None) -> _Group:
        for g in self.groups:
            if g.date == date:
                return g
        g = _Group(date)
        self.groups.append(g)
        return g

    def render(self) -> list[str]:
        body: list[str] = []
        for group in self.groups:
            if not group.items:
                continue  # a date with nothing left under it is not written
            if group.date is not None:
                body.append(f'Date: {group.date}')
            for item in group.items:
                body.extend(item.render())
        if not body:
            return []
        return [*self.header, *body, *([self.closing] if self.closing else [])]


def _parse_log(text: str) -> list[_Segment]:
    """Split a log into segments → date groups → items; repeated dates and thread sections merge, message boundaries
    and stray tags go."""
    segments: dict[str | None, _Segment] = {}
    order: list[str | None] = []

    def segment(key: str | None, header: list[str] | None = None, closing: str | None = None) -> _Segment:
        if key not in segments:
            segments[key] = _Segment(key, header or [], closing)
            order.append(key)
        return segments[key]

    current: str | None = None
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
            current = f'thread:{m.group(1)}'
            segment(current, [f'<thread id="{m.group(1)}">'], '</thread>')
            last_item = None
            rest = m.group(2).strip()
            if rest:
                pending.insert(i, rest)
            continue
        if stripped.startswith('</thread>'):
            current, last_item = None, None
            continue
        if _GROUP_HEADER_RE.match(stripped):
            # Retrieval mode: a group's header and range line stay exactly as they are (recall reads the range).
            header = [stripped]
            if i < len(pending) and _RANGE_LINE_RE.match(pending[i].strip()):
                header.append(pending[i].strip())
                i += 1
            current = f'group:{stripped}'
            segment(current, [*header, ''])
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
        seg = segment(current)
        if stripped.startswith('Date:'):
            current_date[current] = _collapse(stripped[5:])
            seg.group(current_date[current])
            last_item = None
            continue
        group = seg.group(current_date.get(current))
        indented = raw[:1] in (' ', '\t')
        if indented and last_item is not None:
            last_item.subs.append(raw)
            continue
        last_item = _Item(stripped if not indented else raw)
        group.items.append(last_item)
    return [segments[k] for k in order]


_RANK = {DONE: 4, RED: 4, 'other': 3, YELLOW: 2, GREEN: 1}


def _dedupe(segment: _Segment) -> None:
    seen: dict[str, _Item] = {}
    for group in segment.groups:
        kept: list[_Item] = []
        for item in group.items:
            key = _normalize(item.line)
            if not key or key == 'nothing notable happened in this exchange':
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


def _merge_runs(items: list[_Item], priority: str) -> list[_Item]:
    """Consecutive items of one priority become one line (their texts joined by `; `)."""
    out: list[_Item] = []
    run: list[_Item] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            head = run[0].line
            prefix = head[: len(head) - len(_strip_prefix(head))]
            merged = _Item(prefix + '; '.join(_strip_prefix(it.line).rstrip('.;') for it in run))
            for it in run:
                merged.subs.extend(it.subs)
            out.append(merged)
        run.clear()

    for item in items:
        if item.priority == priority:
            run.append(item)
        else:
            flush()
            out.append(item)
    flush()
    return out


def _fact(line: str) -> str:
    """An observation line's fact, without its speaker label and filler words."""
    return _telegraphic(_SPEAKER_RE.sub('', _strip_prefix(line))).rstrip('.;')


def _summarize(group: _Group) -> None:
    """Fold a day's facts (🔴 lines) into one line, filler words left out; its other lines stay as they are."""
    if group.summarized:
        return
    facts: list[str] = []
    rest: list[_Item] = []
    time = ''
    for item in group.items:
        if item.priority != RED:
            rest.append(item)
            continue
        fact = _fact(item.line)
        if fact:
            facts.append(fact)
        stamp = _TIME_PREFIX_RE.match(_after_emoji(item.line))
        time = time or (stamp.group(0).strip() + ' ' if stamp else '')
    summary = [_Item(f'* {RED} {time}User: {"; ".join(facts)}.')] if facts else []
    group.items = summary + rest
    group.summarized = True


def _after_emoji(line: str) -> str:
    t = line.strip()
    if t[:2] in ('* ', '- '):
        t = t[2:].lstrip()
    for emoji in _EMOJIS:
        if t.startswith(emoji):
            t = t[len(emoji) :].lstrip()
    return t


def _size(segments: Sequence[_Segment]) -> int:
    return sum(len(line) + 1 for s in segments for line in s.render())


def condense(observations: str, level: int = 0) -> str:
    """Condense an observation log at compression `level` 0–3 (the offline Reflector's core; no tags added).

    Every level merges repeated `Date:` headers, `<thread id>` sections and duplicates, removes message boundaries,
    and drops 🟢 chatter outside the newest day. Then, until the log is at most its level's share of the input
    (55%, 45%, 32%, 20%): runs of 🟡 questions merge into one line; older days fold into one line of the user's facts
    each (oldest first; filler words left out, names, numbers and places kept); then their questions go; at level 2
    and up the newest day is folded too (but its last few items), and at level 3 a day's ✅ lines merge. `## Group`
    and `_range:` lines are kept verbatim. Nothing is ever cut mid-word, and a day with nothing left disappears with
    its `Date:` line.
    """
    level = max(0, min(3, level))
    inner = observations.strip()
    m = re.fullmatch(r'<observations>\s*(.*?)\s*</observations>', inner, re.DOTALL | re.IGNORECASE)
    if m:
        inner = m.group(1)
    segments = _merge_older_groups(_parse_log(inner))
    budget = int(len(inner) * _REFLECTION_SHARE[level])
    # The newest day keeps its detail longest: each thread's own in resource scope; retrieval groups are batches of
    # one timeline, so only the last group's newest day counts there.
    threads = [s for s in segments if s.key is not None and s.key.startswith('thread:')]
    timeline = [g for s in segments if s not in threads for g in s.groups]
    newest = [s.groups[-1] for s in threads if s.groups] + timeline[-1:]
    older = [g for s in segments for g in s.groups if not any(g is n for n in newest)]
    for segment in segments:
        _dedupe(segment)
    for group in older:
        group.items = [it for it in group.items if it.priority != GREEN]
    passes: list[Callable[[_Group], None]] = [_merge_questions, _summarize, _drop_questions]
    if level >= 3:
        passes.append(_merge_done)
    for apply in passes:
        for group in older:
            if _size(segments) <= budget:
                break
            apply(group)
    if level >= 2:
        for group in newest:
            if _size(segments) <= budget:
                break
            _fold_newest(group, keep=_RECENT_TAIL if level == 2 else 1)
    out: list[str] = []
    for segment in segments:
        rendered = segment.render()
        if rendered and out and segment.key is not None and segment.key.startswith('group:'):
            out.append('')  # a blank line before each retrieval group, as they are written
        out.extend(rendered)
    return '\n'.join(out).strip()


def _merge_older_groups(segments: list[_Segment]) -> list[_Segment]:
    """Retrieval mode: every `## Group` section but the newest becomes one section naming them all (``## Group `g1`
    `g5` ``), so their days merge and fold like the rest of one timeline; the newest keeps its detail. Recall still
    reaches every message: the reconciled group's range spans the ranges of the groups it names."""
    grouped = [s for s in segments if s.key is not None and s.key.startswith('group:')]
    if len(grouped) < 2:
        return segments
    older = grouped[:-1]
    ids = [group_id for s in older for group_id in _GROUP_ID_RE.findall(s.header[0])]
    merged = _Segment('group:older', [f'## Group {" ".join(f"`{i}`" for i in ids)}', ''])
    for segment in older:
        for group in segment.groups:
            merged.group(group.date).items.extend(group.items)
    out: list[_Segment] = []
    for segment in segments:
        if any(segment is s for s in older):
            if not any(o is merged for o in out):
                out.append(merged)
            continue
        out.append(segment)
    return out


def _merge_questions(group: _Group) -> None:
    group.items = _merge_runs(group.items, YELLOW)


def _drop_questions(group: _Group) -> None:
    group.items = [it for it in group.items if it.priority != YELLOW]


def _merge_done(group: _Group) -> None:
    """Level 3: a day's ✅ lines become one line."""
    done = [it for it in group.items if it.priority == DONE]
    if len(done) > 1:
        merged = _Item(f'* {DONE} Done: {"; ".join(_fact(it.line) for it in done)}.')
        group.items = [it for it in group.items if it.priority != DONE] + [merged]


def _fold_newest(group: _Group, *, keep: int) -> None:
    """The newest day at levels 2-3: its last `keep` items stay whole, the facts before them fold into one line."""
    if group.summarized or len(group.items) <= keep:
        return
    head, tail = group.items[:-keep], group.items[-keep:]
    older = _Group(group.date, [it for it in head if it.priority not in (GREEN, YELLOW)])
    _summarize(older)
    group.items = older.items + tail
    group.summarized = True


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


def reflect(request: ModelRequest) -> str:
    """The offline Reflector's output for a reflector request (see `condense`)."""
    prompt = _user_prompt_text(request.contents)
    source = request.source_observations or _observations_from_prompt(prompt)
    level = _reflection_level(prompt)
    if _skip_hints(request):
        # A buffered reflection condenses the oldest part of the log, and the part appended until it is activated
        # stays whole: it condenses that oldest part as hard as it can (level 3), so the log it leaves lands under
        # `observationTokens` rather than just over it.
        level = 3
    body = condense(source, level)
    if not body:
        body = f'* {GREEN} Nothing notable is remembered yet.'
    return f'<observations>\n{body}\n</observations>'


# ----------------------------------------------------------------------------------------------------------------
# Actor and title
# ----------------------------------------------------------------------------------------------------------------
_FOUND = f'{OFFLINE_ANSWER_PREFIX} I cannot think offline, but this is what I remember that matches your question:'
_NOTHING = f"{OFFLINE_ANSWER_PREFIX} I don't remember anything about that yet."
_NOTED = f'{OFFLINE_ANSWER_PREFIX} Noted: I will remember that.'


@dataclass(frozen=True)
class _Candidate:
    label: str  # the date it was remembered under, or where it comes from
    line: str
    order: int

    def words(self) -> set[str]:
        return _words(_strip_prefix(self.line))


def _memory_lines(system: str) -> list[_Candidate]:
    """Every observation line of the memory system text, with its date."""
    text = system
    start = text.find('<observations>')
    if start < 0:
        return []
    text = text[start + len('<observations>') :]
    ends = [i for i in (text.find(t) for t in ('</observations>', '<current-task>', '<suggested-response>')) if i >= 0]
    if ends:
        text = text[: min(ends)]
    out: list[_Candidate] = []
    date = ''
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith('Date:'):
            date = line[5:].strip()
        elif line[:2] in ('* ', '- ') and len(line) > 2:
            out.append(_Candidate(date, line[2:].strip(), len(out)))
    return out


def _conversation_lines(contents: Sequence[Content], start: int) -> list[_Candidate]:
    """What the user said earlier in the unobserved conversation (not yet in memory), one sentence each."""
    out: list[_Candidate] = []
    user_turns = [c for c in contents if c.role == 'user']
    for content in user_turns[:-1]:  # the last one is the question being answered
        text = _strip_reminders(' '.join(p for p in content.parts if isinstance(p, str)))
        for sentence in _sentences(text):
            if _words(sentence) and not _is_question(sentence):
                out.append(_Candidate('earlier in this conversation', f'User said: {sentence}', start + len(out)))
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


def _expand(words: set[str]) -> set[str]:
    out = set(words)
    for word in words:
        out.update(_stem(w) for w in _SYNONYMS.get(word, ()))
    return out


def _ranked(question: str, candidates: Sequence[_Candidate]) -> list[tuple[float, _Candidate]]:
    """Candidates sharing words with the question, best first; rare words weigh more (idf), exact words more than
    synonyms, and newer lines win ties."""
    asked = _words(question)
    wanted = _expand(asked)
    if not wanted or not candidates:
        return []
    bags = [c.words() for c in candidates]
    df: dict[str, int] = {}
    for bag in bags:
        for w in bag & wanted:
            df[w] = df.get(w, 0) + 1
    n = len(candidates)
    scored: list[tuple[float, _Candidate]] = []
    for candidate, bag in zip(candidates, bags, strict=True):
        shared = bag & wanted
        score = sum(math.log(1 + n / df[w]) * (1.0 if w in asked else 0.6) for w in shared)
        if score > 0:
            scored.append((score, candidate))
    scored.sort(key=lambda s: (-s[0], -s[1].order))
    return scored


def _quoted(line: str, wanted: set[str]) -> str:
    """The line, or for a folded day (`User: a; b; c`) only the clauses that match (the rest marked `…`)."""
    body = _after_emoji(line)
    if '; ' not in body:
        return line
    head = line[: len(line) - len(body)]
    stamp = _TIME_PREFIX_RE.match(body)
    time = stamp.group(0) if stamp else ''
    speaker = 'User: ' if body[len(time) :].startswith('User: ') else ''
    clauses = body[len(time) + len(speaker) :].rstrip('.').split('; ')
    matching = [c for c in clauses if _words(c) & wanted]
    if not matching or len(matching) == len(clauses):
        return line
    return f'{head}{time}{speaker}… {"; ".join(matching)} …'


def _cite(candidates: Iterable[_Candidate], wanted: set[str]) -> list[str]:
    lines = []
    for c in sorted(candidates, key=lambda c: c.order):
        quoted = _quoted(c.line, wanted)
        lines.append(f'- {c.label}: {quoted}' if c.label else f'- {quoted}')
    return lines


def answer(request: ModelRequest) -> str:
    """The offline Actor's answer: for a question, the remembered lines that match it, quoted with their dates; for a
    statement, an acknowledgement."""
    said = _last_user_content_text(request.contents)
    sentences = _sentences(said)
    if sentences and not any(_is_question(s) for s in sentences):
        return _NOTED
    memory = _memory_lines(request.system)
    candidates = memory + _conversation_lines(request.contents, len(memory))
    ranked = _ranked(said, candidates)
    if not ranked:
        return _NOTHING
    best = ranked[0][0]
    chosen = [c for score, c in ranked if score >= best * 0.6][:_ACTOR_MAX_CITATIONS]
    return '\n'.join([_FOUND, *_cite(chosen, _expand(_words(said)))])


def _title_for(request: ModelRequest) -> str:
    first = next((m for m in request.source_messages if m.role == 'user'), None)
    if first is not None and first.text().strip():
        return make_title(first.text())
    for content in request.contents:
        if content.role == 'user':
            text = ' '.join(p for p in content.parts if isinstance(p, str))
            if _strip_reminders(text).strip():
                return make_title(text)
    return make_title('')
