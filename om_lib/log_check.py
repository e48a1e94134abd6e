"""Is a model's answer still an observation log? The check every Observer and Reflector answer passes before it may
become memory (a model's answer is untrusted input).

An observation log, in the Observer's format, is mostly structure: `Date:` headers, list items (`* 🔴 (09:00) …`,
indented sub-items), `<thread id>` sections, observation-group markers and message boundaries. A refusal ("I'm sorry,
I can't help with that"), an essay, an empty answer or a loop of one line is not one.

A reflection replaces the whole log, so it must also keep the log's span: the newest date (where the current work is)
and the oldest date (a reflection condenses old material, it does not drop a day), and some of the newest day's lines.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

from om_lib.context import parse_date_from_content

_DATE_HEADER = re.compile(r'^\s*Date:\s*(.+?)\s*$', re.IGNORECASE)
_LIST_ITEM = re.compile(r'^\s*(?:[-*•]|\d+\.)\s+(.*\S)')
_STRUCTURE = re.compile(
    r'^\s*(?:</?thread\b[^>]*>|</?observation-group\b[^>]*>|</?observations>'
    r'|## Group `|_range: `|--- message boundary)',
    re.IGNORECASE,
)
_PRIORITY = re.compile(r'^(?:[🔴🟡🟢✅]\ufe0f?\s*)+')
# Share of non-empty lines that may be prose (neither a header, an item nor a marker).
MAX_PROSE_SHARE = 0.5
# A log whose items are mostly one repeated line is a loop, however short.
MIN_ITEMS_FOR_LOOP_CHECK = 6
MAX_REPEATED_SHARE = 0.6


def _item_text(line: str) -> str | None:
    match = _LIST_ITEM.match(line)
    if match is None:
        return None
    text = _PRIORITY.sub('', match.group(1)).strip()
    return re.sub(r'^\(\d{1,2}:\d{2}\)\s*', '', text)


def observation_log_problem(text: str) -> str | None:
    """Why `text` is not an observation log (a phrase for an error message), or None when it is one."""
    lines = [line for line in text.split('\n') if line.strip()]
    if not lines:
        return 'the answer is empty'
    items = [t for line in lines if (t := _item_text(line)) is not None]
    if not any(items):
        return 'the answer has no observation lines (is it a refusal or prose?)'
    prose = [line for line in lines if _item_text(line) is None and not _DATE_HEADER.match(line)]
    prose = [line for line in prose if not _STRUCTURE.match(line)]
    if len(prose) > MAX_PROSE_SHARE * len(lines):
        return f'the answer is mostly prose ({len(prose)} of {len(lines)} lines are not observations)'
    if len(items) >= MIN_ITEMS_FOR_LOOP_CHECK:  # a real loop repeats itself many times; a sloppy log, a few
        _, repeats = Counter(t.lower() for t in items).most_common(1)[0]
        if repeats > MAX_REPEATED_SHARE * len(items):
            return f'the answer repeats one observation ({repeats} of {len(items)} lines)'
    return None


def _dates(text: str) -> dict[datetime, str]:
    found: dict[datetime, str] = {}
    for line in text.split('\n'):
        match = _DATE_HEADER.match(line)
        if match is None:
            continue
        when = parse_date_from_content(match.group(1))
        if when is not None:
            found.setdefault(when, match.group(1))
    return found


def _newest_day_items(text: str) -> set[str]:
    """The item texts under the newest `Date:` header (anywhere in the text: thread sections repeat headers)."""
    current: datetime | None = None
    by_day: dict[datetime, set[str]] = {}
    for line in text.split('\n'):
        header = _DATE_HEADER.match(line)
        if header is not None:
            current = parse_date_from_content(header.group(1))
            continue
        item = _item_text(line)
        if item and current is not None:
            by_day.setdefault(current, set()).add(item.lower())
    return by_day[max(by_day)] if by_day else set()


def reflection_problem(reflection: str, source: str) -> str | None:
    """Why `reflection` may not replace `source` (None when it may): not an observation log, or it lost the log's
    span (its newest or oldest date, or everything of the newest day)."""
    problem = observation_log_problem(reflection)
    if problem is not None:
        return problem.replace('the answer', 'the reflection')
    before, after = _dates(source), _dates(reflection)
    if not before:
        return None
    newest, oldest = max(before), min(before)
    if newest not in after:
        return f'the reflection dropped the newest date of the log ({before[newest]}), where the current work is'
    if oldest not in after and min(after, default=newest) > oldest:
        return f'the reflection dropped the oldest date of the log ({before[oldest]}) instead of condensing it'
    if _newest_day_items(source) and not _newest_day_items(reflection):
        return f'the reflection kept no observation of the newest day ({before[newest]})'
    return None
