"""What the Actor sees of its memory: system text, relative dates, observation groups (spec §16, §18.1-18.2).

Pure functions only. The observation log is append-only text whose batches are separated by message-boundary
lines; `build_observation_system_messages` turns it into the ordered system messages of §16.1 and
`join_system_messages` folds them into the single `system` string our HTTP API returns.

Prompt sentences are our own wording; tags, headings and marker strings are fixed because parsers, tests and the
reference's clients rely on them.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from om_lib.messages import iso

# ----------------------------------------------------------------------------------------------------------------
# Message boundaries (§9 step 9, §16.4)
# ----------------------------------------------------------------------------------------------------------------

BOUNDARY_RE = re.compile(r'\n{2,}--- message boundary \((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{3})?Z)\) ---\n{2,}')


def message_boundary(dt: datetime) -> str:
    """The separator placed between two observation batches.

    Args:
        dt: The newest `createdAt` of the messages the following batch observed.

    Returns:
        `"\\n\\n--- message boundary (2025-01-01T10:00:00.000Z) ---\\n\\n"` for that time.
    """
    return f'\n\n--- message boundary ({iso(_utc(dt))}) ---\n\n'


def split_observation_chunks(text: str) -> list[str]:
    """Split the observation log at its message boundaries.

    Args:
        text: Observation text.

    Returns:
        The trimmed, non-empty chunks in order.
    """
    chunks = (chunk.strip() for chunk in BOUNDARY_RE.sub('\x00', text).split('\x00'))
    return [chunk for chunk in chunks if chunk]


def get_observations_as_of(text: str, as_of: datetime) -> str:
    """The observations that existed at a point in time (spec §16.4).

    The first chunk is always kept; a later chunk is kept when its boundary time is at or before `as_of`.

    Args:
        text: Observation text.
        as_of: The cut-off time (inclusive); a naive value is read as UTC.

    Returns:
        The kept chunks joined by a blank line; `''` for blank input; the text unchanged when it has no boundaries.
    """
    if not text.strip():
        return ''
    matches = list(BOUNDARY_RE.finditer(text))
    if not matches:
        return text
    cutoff = _utc(as_of)
    kept = [text[: matches[0].start()]]
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        if datetime.fromisoformat(match.group(1).replace('Z', '+00:00')) <= cutoff:
            kept.append(text[match.end() : end])
    return '\n\n'.join(kept)


# ----------------------------------------------------------------------------------------------------------------
# Shrinking observations for the Actor (§16.1 a)
# ----------------------------------------------------------------------------------------------------------------

# Bracket tags such as "[O3]" or "[Image #1: a.png]" are noise for the Actor. Two kinds carry meaning and stay:
# "[N items collapsed …]" summaries and markdown links "[label](url)".
_BRACKET_TAG_RE = re.compile(r'\[(?![\d\s]*items collapsed)[^\]\n]+\](?!\()')


def optimize_observations_for_context(text: str) -> str:
    """Make observations cheaper for the Actor without losing facts (spec §16.1 a).

    Drops the 🟡/🟢 priority markers (🔴 and ✅ stay), bracket tags, `->` arrows and runs of spaces, and collapses
    blank-line runs.

    Args:
        text: Observation text.

    Returns:
        The compacted text.
    """
    out = re.sub(r'[🟡🟢][^\S\n]*', '', text)
    out = _BRACKET_TAG_RE.sub('', out)
    out = re.sub(r'\s*->\s*', ' ', out)
    out = re.sub(r' {2,}', ' ', out)
    out = re.sub(r'\n{3,}', '\n\n', out)
    return out.strip()


# ----------------------------------------------------------------------------------------------------------------
# Relative time (§16.3)
# ----------------------------------------------------------------------------------------------------------------

_MONTHS = {
    'january': 1,
    'february': 2,
    'march': 3,
    'april': 4,
    'may': 5,
    'june': 6,
    'july': 7,
    'august': 8,
    'september': 9,
    'october': 10,
    'november': 11,
    'december': 12,
}
_MONTH_ABBREVIATIONS = {name[:3]: number for name, number in _MONTHS.items()} | {'sept': 9}
_MONTH = (
    r'(?:January|February|March|April|May|June|July|August|September|October|November|December'
    r'|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?'
)
_ORDINAL = r'(?:st|nd|rd|th)?'

_DATE_FULL_RE = re.compile(rf'\b({_MONTH})\s+(\d{{1,2}}){_ORDINAL},?\s+(\d{{4}})\b', re.I)
_DATE_SPAN_RE = re.compile(rf'\b({_MONTH})\s+(\d{{1,2}}){_ORDINAL}\s*[-–]\s*\d{{1,2}}{_ORDINAL},?\s+(\d{{4}})\b', re.I)
_DATE_PART_RE = re.compile(rf'\b(early|mid|late)(?:-to-(?:early|mid|late))?[\s-]+({_MONTH})\s+(\d{{4}})\b', re.I)
_DATE_MONTHS_RE = re.compile(rf'\b{_MONTH}\s+to\s+({_MONTH})\s+(\d{{4}})\b', re.I)
_PART_OF_MONTH_DAY = {'early': 7, 'mid': 15, 'late': 23}

_FUTURE_INTENT_RE = re.compile(
    r'\b(?:will\s+\w+|plans to|planning to|looking forward to|going to|intends to|wants to|needs to|about to)\b',
    re.I,
)
_INLINE_ESTIMATE_RE = re.compile(r'\((estimated|meaning)\s+([^()\n]*?\d{4})\)', re.I)
_DATE_HEADER_RE = re.compile(rf'^Date:\s*({_MONTH}\s+\d{{1,2}},\s*\d{{4}})[ \t]*$', re.M | re.I)


def _utc(value: datetime | date) -> datetime:
    if not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _whole_days(start: datetime | date, end: datetime | date) -> int:
    return math.floor((_utc(end) - _utc(start)) / timedelta(days=1))


def _month_number(name: str) -> int:
    key = name.lower().rstrip('.')
    return _MONTHS.get(key) or _MONTH_ABBREVIATIONS[key[:4] if key == 'sept' else key[:3]]


def _make_date(year: str | int, month: int, day: str | int) -> datetime | None:
    try:
        return datetime(int(year), month, int(day), tzinfo=UTC)
    except ValueError:  # "Feb 30" and the like
        return None


def _plural(n: int, unit: str) -> str:
    return f'{n} {unit}' if n == 1 else f'{n} {unit}s'


def format_relative_time(date_: datetime | date, now: datetime | date) -> str:
    """Describe a date relative to now, in whole days ("today", "2 weeks ago", "in 3 days").

    Args:
        date_: The date to describe (naive values are UTC).
        now: The current time.

    Returns:
        The phrase.
    """
    d = _whole_days(date_, now)
    if d >= 0:
        if d == 0:
            return 'today'
        if d == 1:
            return 'yesterday'
        if d < 7:
            return f'{d} days ago'
        if d < 14:
            return '1 week ago'
        if d < 30:
            return f'{d // 7} weeks ago'
        if d < 60:
            return '1 month ago'
        if d < 365:
            return f'{d // 30} months ago'
        return f'{_plural(d // 365, "year")} ago'
    f = -d
    if f == 1:
        return 'tomorrow'
    if f < 7:
        return f'in {f} days'
    if f < 14:
        return 'in 1 week'
    if f < 30:
        return f'in {f // 7} weeks'
    if f < 60:
        return 'in 1 month'
    if f < 365:
        return f'in {f // 30} months'
    return f'in {_plural(f // 365, "year")}'


def format_gap_between_dates(prev: datetime | date, cur: datetime | date) -> str | None:
    """The marker placed between two date headers that are more than a day apart.

    Args:
        prev: The earlier header's date.
        cur: The later header's date.

    Returns:
        `[N days later]`, `[1 week later]`, `[N weeks later]`, `[1 month later]` or `[N months later]`; None for
        a gap of a day or less.
    """
    d = _whole_days(prev, cur)
    if d <= 1:
        return None
    if d < 7:
        return f'[{d} days later]'
    if d < 14:
        return '[1 week later]'
    if d < 30:
        return f'[{d // 7} weeks later]'
    if d < 60:
        return '[1 month later]'
    return f'[{d // 30} months later]'


def parse_date_from_content(s: str) -> datetime | None:
    """Find a calendar date in free text; the first pattern that matches wins.

    Recognised, in order: `Month D, YYYY`; `Month D-D, YYYY` (the first day); `early|mid|late Month YYYY`
    (day 7, 15 or 23, also as `early-to-mid Month YYYY`); `Month to Month YYYY` (the first of the second month).
    Month names may be full or abbreviated.

    Args:
        s: Text to search.

    Returns:
        Midnight UTC of the date, or None.
    """
    if m := _DATE_FULL_RE.search(s):
        return _make_date(m.group(3), _month_number(m.group(1)), m.group(2))
    if m := _DATE_SPAN_RE.search(s):
        return _make_date(m.group(3), _month_number(m.group(1)), m.group(2))
    if m := _DATE_PART_RE.search(s):
        return _make_date(m.group(3), _month_number(m.group(2)), _PART_OF_MONTH_DAY[m.group(1).lower()])
    if m := _DATE_MONTHS_RE.search(s):
        return _make_date(m.group(2), _month_number(m.group(1)), 1)
    return None


def is_future_intent_observation(line: str) -> bool:
    """Whether an observation states an intention ("will visit", "plans to", "going to", ...).

    Args:
        line: Observation text.

    Returns:
        True when the line speaks of something the user meant to do.
    """
    return _FUTURE_INTENT_RE.search(line) is not None


def expand_inline_estimated_dates(text: str, now: datetime | date) -> str:
    """Add a relative time inside every `(meaning …YYYY)` / `(estimated …YYYY)` note that holds a date.

    A plan whose date is already behind us is marked `likely already happened`, so the Actor does not talk about
    it as still ahead.

    Args:
        text: Observation text.
        now: The current time.

    Returns:
        The text with expanded notes; unparseable notes are left as they are.
    """

    def expand(m: re.Match[str]) -> str:
        found = parse_date_from_content(m.group(2))
        if found is None:
            return m.group(0)
        relative = format_relative_time(found, now)
        line_start = text.rfind('\n', 0, m.start()) + 1
        # "In the past" is by calendar day: a plan for today has not necessarily happened yet.
        if _whole_days(found, now) >= 1 and is_future_intent_observation(text[line_start : m.start()]):
            return f'({m.group(1)} {m.group(2)} - {relative}, likely already happened)'
        return f'({m.group(1)} {m.group(2)} - {relative})'

    return _INLINE_ESTIMATE_RE.sub(expand, text)


def add_relative_time_to_observations(text: str, now: datetime | date) -> str:
    """Annotate dates with how long ago they were, and mark gaps between date headers (spec §16.3).

    `Date: Jan 1, 2025` becomes `Date: Jan 1, 2025 (2 weeks ago)`, and a header more than a day after the previous
    one is preceded by a gap line such as `[2 weeks later]`.

    Args:
        text: Observation text.
        now: The current time.

    Returns:
        The annotated text.
    """
    expanded = expand_inline_estimated_dates(text, now)
    previous: datetime | None = None
    pieces: list[str] = []
    last_end = 0
    for m in _DATE_HEADER_RE.finditer(expanded):
        found = parse_date_from_content(m.group(1))
        if found is None:
            continue
        header = f'Date: {m.group(1)} ({format_relative_time(found, now)})'
        gap = format_gap_between_dates(previous, found) if previous is not None else None
        before = expanded[last_end : m.start()]
        pieces.append(before)
        if gap:
            # The reference inserts "\n<gap>\n\n"; skip the leading newline when a blank line is already there.
            pieces.append(f'{gap}\n\n' if before.endswith('\n\n') else f'\n{gap}\n\n')
        pieces.append(header)
        last_end = m.end()
        previous = found
    if not pieces:
        return expanded
    pieces.append(expanded[last_end:])
    return ''.join(pieces)


# ----------------------------------------------------------------------------------------------------------------
# Observation groups (§18.1)
# ----------------------------------------------------------------------------------------------------------------

# In retrieval mode every observation batch is stored as
#     <observation-group id="g12" range="#12:#19">
#     …observations…
#     </observation-group>
# The range names the batch's messages by their sequence numbers in the thread (`#12` is the message with seq 12;
# `#` never occurs in a message id, so the two cannot be confused). It costs a few tokens where two client-chosen
# message ids cost dozens, and the recall tool maps it back to the messages. Groups written before (a 16-hex id and
# a `startMessageId:endMessageId` range) still parse and render.
_GROUP_OPEN = '<observation-group'
_GROUP_CLOSE = '</observation-group>'
_ATTRIBUTE_RE = re.compile(r'([A-Za-z_][\w-]*)="([^"]*)"')
# A Reflector section: ``## Group `g12` `` (or ``## Group `g1` `g5` `` for one section condensing several groups).
_SECTION_RE = re.compile(r'^#{1,6}[ \t]+Group[ \t]+`?([^`\s]+)`?([^\n]*)$', re.M)
_SECTION_IDS_RE = re.compile(r'`([^`\s]+)`')
_RANGE_LINE_RE = re.compile(r'^_range: `[^`\n]*`_[ \t]*$\n?', re.M)
_INT_RANGE_RE = re.compile(r'^(#?)(\d+):#?(\d+)$')
_DATE_LINE_RE = re.compile(r'^Date:\s*(.+?)\s*$')
# Any group tag, opening or closing, however a model spelled it: never part of an observation's own text.
_ANY_GROUP_TAG_RE = re.compile(r'^[ \t]*</?observation-group\b[^>\n]*>[ \t]*\n?|</?observation-group\b[^>\n]*>', re.M)


@dataclass(frozen=True)
class ObservationGroup:
    """One `<observation-group>` found in observation text.

    Attributes:
        id: The group id.
        range: `#start:#end` (message seqs), a legacy `startMessageId:endMessageId`, or '' when unknown.
        content: The trimmed text inside the group.
        kind: The optional `kind` attribute.
        start: Offset of the opening tag in the scanned text.
        end: Offset just past the closing tag.
        attributes: Every attribute of the opening tag (unescaped).
    """

    id: str
    range: str
    content: str
    kind: str | None
    start: int
    end: int
    attributes: dict[str, str]


_GroupRenderer = Callable[[ObservationGroup], str]


def group_range(start_seq: int, end_seq: int) -> str:
    """The range of a group of messages `start_seq`..`end_seq` of one thread: `#12:#19`."""
    return f'#{start_seq}:#{end_seq}'


def group_id_for(start_seq: int) -> str:
    """The id of a group that begins at message `start_seq`: `g12` (unique in a thread's log: batches never overlap)."""
    return f'g{start_seq}'


def strip_group_tags(text: str) -> str:
    """Remove every group tag (opening or closing, with its line when alone on it) from a model's text, so an echoed
    or invented tag can never unbalance the stored markup."""
    return _ANY_GROUP_TAG_RE.sub('', text)


def _format_group(group_id: str, range_: str, content: str, extra: dict[str, str] | None = None) -> str:
    # Ids and ranges may come from a model or a client: escape them so a quote or '>' cannot break the tag.
    attributes = {'id': group_id, **({'range': range_} if range_ else {}), **(extra or {})}
    rendered = ' '.join(f'{key}="{html.escape(value, quote=True)}"' for key, value in attributes.items())
    return f'<observation-group {rendered}>\n{strip_group_tags(content).strip()}\n{_GROUP_CLOSE}'


def wrap_in_observation_group(observations: str, range_: str, *, group_id: str, kind: str | None = None) -> str:
    """Wrap one observation batch in a group that points back at the messages it came from (retrieval mode).

    Args:
        observations: The batch's observations (any group tags in them are removed).
        range_: The messages it came from, `#start:#end` (see `group_range`).
        group_id: The group id (see `group_id_for`).
        kind: Optional `kind` attribute.

    Returns:
        `<observation-group id=".." range="..">\\n…\\n</observation-group>`.
    """
    return _format_group(group_id, range_, observations, {'kind': kind} if kind else None)


def parse_observation_groups(text: str) -> list[ObservationGroup]:
    """Find the observation groups in a text with a small scanner (a regex would mis-handle nesting and noise).

    A group opens with `<observation-group` followed by whitespace, its attributes and `>`, and ends at the next
    `</observation-group>`. Groups without an `id` are ignored (their text stays as it is).

    Args:
        text: Observation text.

    Returns:
        The groups, in order.
    """
    groups: list[ObservationGroup] = []
    pos = 0
    while True:
        start = text.find(_GROUP_OPEN, pos)
        if start < 0:
            break
        after_name = start + len(_GROUP_OPEN)
        if after_name >= len(text) or not text[after_name].isspace():
            pos = after_name
            continue
        tag_end = text.find('>', after_name)
        if tag_end < 0:
            break
        close = text.find(_GROUP_CLOSE, tag_end + 1)
        if close < 0:
            break
        attributes = {k: html.unescape(v) for k, v in _ATTRIBUTE_RE.findall(text[after_name:tag_end])}
        end = close + len(_GROUP_CLOSE)
        if attributes.get('id'):
            groups.append(
                ObservationGroup(
                    id=attributes['id'],
                    range=attributes.get('range', ''),
                    content=text[tag_end + 1 : close].strip(),
                    kind=attributes.get('kind'),
                    start=start,
                    end=end,
                    attributes=attributes,
                )
            )
        pos = end
    return groups


def group_markup_problem(text: str) -> str | None:
    """What is wrong with the group markup of a log (None when it is well formed): every opening tag is closed
    before the next one opens, no closing tag is left without its opening tag, every group has an id."""
    depth = 0
    for match in re.finditer(r'<(/?)observation-group\b([^>]*)>', text):
        if match.group(1):
            if depth == 0:
                return f'a closing tag without its opening tag at offset {match.start()}'
            depth = 0
        else:
            if depth:
                return f'a group opens inside another at offset {match.start()}'
            if not _ATTRIBUTE_RE.search(match.group(2)) or 'id="' not in match.group(2):
                return f'a group without an id at offset {match.start()}'
            depth = 1
    return 'a group is never closed' if depth else None


def _rewrite_groups(text: str, groups: list[ObservationGroup], render_group: _GroupRenderer) -> str:
    pieces: list[str] = []
    last = 0
    for group in groups:
        pieces.append(text[last : group.start])
        pieces.append(render_group(group))
        last = group.end
    pieces.append(text[last:])
    return re.sub(r'\n{3,}', '\n\n', ''.join(pieces)).strip()


def strip_observation_groups(text: str) -> str:
    """Replace every group with its content (the plain observations, without group markup).

    Args:
        text: Observation text.

    Returns:
        The text without groups, blank-line runs collapsed, trimmed.
    """
    return _rewrite_groups(text, parse_observation_groups(text), lambda g: g.content)


def range_ends(range_: str) -> tuple[str, str] | None:
    """The first and the last message of a range (`#12:#19`, a legacy `a:b` or a comma list of them), or None."""
    segments = [s.strip() for s in range_.split(',') if s.strip()]
    if not segments:
        return None
    first, last = segments[0], segments[-1]
    start = first[: first.index(':')] if ':' in first else first
    end = last[last.rindex(':') + 1 :] if ':' in last else last
    return (start, end) if start and end else None


def render_observation_groups_for_reflection(text: str) -> str | None:
    """Render groups as markdown sections the Reflector can read and keep: ``## Group `id` `` + its content.

    The Reflector needs no ranges (`reconcile_observation_groups_from_reflection` maps its sections back to the
    groups they came from); ungrouped text stays in place.

    Args:
        text: Observation text.

    Returns:
        The rendered text, or None when the text has no groups.
    """
    groups = parse_observation_groups(text)
    if not groups:
        return None
    return _rewrite_groups(text, groups, lambda g: f'## Group `{g.id}`\n\n{g.content}')


def _actor_header(group: ObservationGroup) -> str:
    # The group id is the Reflector's handle; the Actor needs only the messages (its recall cursors).
    ends = range_ends(group.range)
    if ends is None:
        return '## Messages (range unknown)'
    start, end = ends
    return f'## Messages {start}–{end}' if start != end else f'## Message {start}'


def render_observation_groups_for_actor(text: str) -> str:
    """The log as the Actor is shown it (and as its tokens are counted): each group as one header line naming the
    messages it came from (`## Messages #12–#19`) above its content; no tags.

    Args:
        text: Observation text.

    Returns:
        The rendered text (the text itself when it has no groups).
    """
    groups = parse_observation_groups(text)
    if not groups:
        return text
    rendered = _rewrite_groups(text, groups, lambda g: f'{_actor_header(g)}\n{g.content}')
    # Each batch repeats the day it was observed on; under a group header, a `Date:` line naming the day the log is
    # already on says nothing new (and costs tokens on every step).
    out: list[str] = []
    day: str | None = None
    for line in rendered.split('\n'):
        header = _DATE_LINE_RE.match(line)
        if header is not None:
            if header.group(1) == day and out and out[-1].startswith('## Message'):
                continue
            day = header.group(1)
        out.append(line)
    return '\n'.join(out)


def combine_observation_group_ranges(ranges: Iterable[str]) -> str:
    """Merge the ranges of several groups into one range attribute.

    Sequence ranges (`#3:#5`, `#7:#9`, or bare `3:5`) merge into one span (`#3:#9`); legacy message-id ranges cannot
    be ordered, so they are kept as a de-duplicated comma list (`m1:m2,m3:m4`).

    Args:
        ranges: Range strings, each possibly a comma list itself.

    Returns:
        The combined range.
    """
    segments: list[str] = []
    for value in ranges:
        for segment in value.split(','):
            segment = segment.strip()
            if segment and segment not in segments:
                segments.append(segment)
    numeric = [_INT_RANGE_RE.match(s) for s in segments]
    if segments and all(numeric):
        endpoints = [int(n) for m in numeric if m for n in m.groups()[1:]]
        hash_ = '#' if any(m and m.group(1) for m in numeric) else ''
        return f'{hash_}{min(endpoints)}:{hash_}{max(endpoints)}'
    return ','.join(segments)


def _unique(candidate: str, used: set[str]) -> str:
    group_id, n = candidate, 1
    while group_id in used:
        n += 1
        group_id = f'{candidate}-{n}'
    used.add(group_id)
    return group_id


def reconcile_observation_groups_from_reflection(reflection: str, source: str) -> str | None:
    """Turn a reflection of grouped observations back into canonical `<observation-group>` markup.

    The Reflector sees groups as ``## Group `id` `` sections. Each section it writes is mapped back to source
    groups: the ones its header names (``## Group `g1` `g5` `` condenses two), else those sharing at least one line
    with it, else the one at the same position; the new group's range combines theirs, so recall still reaches the
    raw messages. A section keeps its id when it names a source group, else takes the first matched source group's
    id; ids stay unique. A reflection with no sections becomes one `kind="reflection"` group spanning every source
    range. Group tags the Reflector wrote itself are dropped, so the result is always well formed.

    Args:
        reflection: The Reflector's observations.
        source: The observation text that was reflected.

    Returns:
        The reconciled text; `''` for an empty reflection; None when the source had no groups (use the reflection
        as it is).
    """
    source_groups = parse_observation_groups(source)
    if not source_groups:
        return None
    reflection = _RANGE_LINE_RE.sub('', strip_group_tags(reflection))
    if not reflection.strip():
        return ''
    all_ranges = combine_observation_group_ranges(g.range for g in source_groups)
    headers = list(_SECTION_RE.finditer(reflection))
    if not headers:
        return _format_group(source_groups[0].id, all_ranges, reflection, {'kind': 'reflection'})

    by_id = {g.id: g for g in source_groups}
    source_lines = [{line.strip() for line in g.content.split('\n') if line.strip()} for g in source_groups]
    pieces: list[str] = []
    used: set[str] = set()
    preamble = reflection[: headers[0].start()].strip()
    if preamble:
        pieces.append(preamble)  # text the Reflector put before the first section stays, ungrouped
    for index, header in enumerate(headers):
        section_id = header.group(1)
        named = [section_id, *_SECTION_IDS_RE.findall(header.group(2))]
        body_end = headers[index + 1].start() if index + 1 < len(headers) else len(reflection)
        body = reflection[header.end() : body_end].strip()
        if any(name in by_id for name in named):
            matched = [by_id[name] for name in dict.fromkeys(named) if name in by_id]
        else:
            body_lines = {line.strip() for line in body.split('\n') if line.strip()}
            matched = [g for g, lines in zip(source_groups, source_lines, strict=True) if lines & body_lines]
            if not matched and index < len(source_groups):
                matched = [source_groups[index]]
        if not body:
            continue
        range_ = combine_observation_group_ranges(g.range for g in matched) if matched else all_ranges
        group_id = _unique(section_id if section_id in by_id else (matched or source_groups)[0].id, used)
        pieces.append(_format_group(group_id, range_, body))
    return '\n\n'.join(pieces)


# ----------------------------------------------------------------------------------------------------------------
# Actor system messages (§16.1, §16.2, §18.2)
# ----------------------------------------------------------------------------------------------------------------

CONTINUATION_REMINDER_ID = 'om-continuation'

_CONTEXT_PROMPT = 'The observations block below is your memory of earlier conversations with this user.'

_CONTEXT_INSTRUCTIONS = """IMPORTANT: Answer from the specifics in these observations. Mention the concrete details \
the user told you, tailor your answer to them, and tie suggestions to what they did, liked or struggled with before.

KNOWLEDGE UPDATES: When a question is about how things stand now, trust the most recent observation. Newer \
observations override older ones; wording such as "will start", "is switching", "changed to" or "moved to" marks a \
change of state.

PLANNED ACTIONS: If the user planned something for a date that has now passed (the relative times such as \
"3 weeks ago" show this), assume it took place unless an observation says otherwise.

MOST RECENT USER INPUT: The user's latest message is what you are answering. Give it the highest priority, while \
still respecting constraints and preferences from earlier."""

_RETRIEVAL_THREAD = """## Recall — looking up source messages

Observations are grouped in sections headed like `## Messages #12–#19`: the raw messages (by their numbers in the \
conversation) that the section summarises. The recall tool fetches those messages.

Use recall when the user asks you to repeat or show something, wants exact content (code, quotes, error messages, \
URLs, file paths, numbers), when your memory lacks a detail you need, or when you want to verify a recollection. \
When the user refers to specific earlier content, reach for recall by default.

How to call it:
- pass one end of a section's range as `cursor`: the start (`#12`) reads forward from its first message, the end \
(`#19`) with `page: -1` reads backward; a message id from a recall answer works too (one message, not the range);
- `page: 1` reads forward from the cursor, `page: -1` reads backward; check `hasNextPage` / `hasPrevPage` to go on;
- `detail: "low"` (the default) gives shortened text and tool names with part indices such as [p0], [p1]; \
`detail: "high"` gives full content, one part at a time; `partIndex` fetches one specific part in full;
- `truncated: true` means the output hit its budget; follow any hint of the form \
[truncated — call recall cursor="..." partIndex=N detail="high" for full content];
- when an `<archived-observations>` line says older observations were archived, `mode: "observations"` pages \
through them (newest first, `page` from 0); add `query` to keep only the groups that contain all its words.

High-level summaries and questions about the user's preferences do not need recall: the observations cover them."""

_RETRIEVAL_RESOURCE_EXTRA = """
Recall can also look beyond this conversation: `mode: "threads"` lists the user's other conversations, a \
`threadId` lets you browse one of them, and `mode: "search"` (when available) finds messages by meaning across all \
of them."""

_OTHER_CONVERSATIONS_INTRO = (
    'The content below comes from OTHER conversations with this user, not the current one. It is here for '
    'reference; it is not necessarily what you should focus on:'
)

_CONTINUATION_HINT = """This message does not come from the user. The conversation became too long to keep in \
full, so its earlier part now lives in your memory observations. Carry on from where those observations end.

Do not mention "memory observations" and do not say things like "based on our previous conversation": this is the \
same conversation, not a new one. Reply naturally, as someone who simply remembers. If a suggested response is \
given, follow it.

IMPORTANT: this system reminder is NOT from the user.
NOTE: Any messages following this system reminder are newer than your memories."""


def continuation_reminder_text() -> str:
    """The text of the synthetic `om-continuation` user message placed before the unobserved messages (§16.2).

    Returns:
        `<system-reminder>…</system-reminder>`.
    """
    return f'<system-reminder>{_CONTINUATION_HINT}</system-reminder>'


def retrieval_instructions(scope: str = 'resource') -> str:
    """How the Actor should use the recall tool (§18.2).

    Args:
        scope: The recall tool's scope, `'thread'` or `'resource'` (which adds cross-conversation browsing).

    Returns:
        The instructions text.
    """
    return _RETRIEVAL_THREAD + (_RETRIEVAL_RESOURCE_EXTRA if scope == 'resource' else '')


def _other_conversations_message(blocks: str) -> str:
    block = f'START_OTHER_CONVERSATIONS_BLOCK\n{blocks.strip()}\nEND_OTHER_CONVERSATIONS_BLOCK'
    return f'{_OTHER_CONVERSATIONS_INTRO}\n{block}'


def build_observation_system_messages(
    observations: str,
    *,
    now: datetime,
    current_task: str | None,
    suggested_response: str | None,
    retrieval: bool = False,
    retrieval_scope: str = 'resource',
    other_conversations: str | None = None,
    archived_catalog: str | None = None,
) -> list[str]:
    """The ordered memory system messages for the Actor (spec §16.1).

    Order: preamble with instructions (plus recall guidance in retrieval mode), the other-conversations block, the
    `<archived-observations>` catalog line (when older observations were archived), `<observations>`, one message per
    boundary chunk, `<current-task>`, `<suggested-response>`. Chunks stay separate because the log is append-only:
    every chunk but the newest is a stable prefix a prompt cache can hit.

    Args:
        observations: The active observation text.
        now: The request's current time, for relative dates.
        current_task: The thread's current task hint, if any.
        suggested_response: The thread's suggested response hint, if any.
        retrieval: Whether retrieval mode (observation groups and recall) is on.
        retrieval_scope: The recall tool's scope.
        other_conversations: Pre-rendered `<other-conversation>` blocks (resource scope), if any.
        archived_catalog: The `<archived-observations>` line, if any observations were archived.

    Returns:
        The messages; empty when there are no observations.
    """
    has_others = bool(other_conversations and other_conversations.strip())
    if not observations.strip() and not archived_catalog:
        # Resource scope before the first observation: what was said in other threads still reaches the Actor.
        return [_other_conversations_message(other_conversations or '')] if has_others else []
    preamble = f'{_CONTEXT_PROMPT}\n\n{_CONTEXT_INSTRUCTIONS}'
    if retrieval:
        preamble += f'\n\n{retrieval_instructions(retrieval_scope)}'
    messages = [preamble]
    if has_others:
        messages.append(_other_conversations_message(other_conversations or ''))
    if archived_catalog:
        messages.append(archived_catalog)
    if retrieval:
        processed = render_observation_groups_for_actor(observations)
    else:
        processed = optimize_observations_for_context(observations)
    processed = add_relative_time_to_observations(processed, now)
    chunks = split_observation_chunks(processed)
    if chunks:
        messages.append('<observations>')
        messages.extend(chunks)
    if current_task:
        messages.append(f'<current-task>\n{current_task}\n</current-task>')
    if suggested_response:
        messages.append(f'<suggested-response>\n{suggested_response}\n</suggested-response>')
    return messages


def join_system_messages(messages: list[str]) -> str:
    """Fold the system messages into the single `system` string our API returns.

    The reference sends each entry as its own system message and never closes `<observations>`: the block simply
    ends where the next message starts. In one string nothing marks that end, so `</observations>` is added after
    the last chunk; otherwise the current task and suggested response would read as part of the observations.

    Args:
        messages: The output of `build_observation_system_messages`.

    Returns:
        The entries joined by blank lines; `''` for none.
    """
    out: list[str] = []
    in_observations = False
    for message in messages:
        if message == '<observations>':
            in_observations = True
        elif in_observations and message.startswith(('<current-task>', '<suggested-response>')):
            out.append('</observations>')
            in_observations = False
        out.append(message)
    if in_observations:
        out.append('</observations>')
    return '\n\n'.join(out)
