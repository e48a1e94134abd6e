"""Is a model's answer an observation log? The check every Observer and Reflector answer passes before it may become
memory (a model's answer is untrusted input).

Models write observation logs in many valid ways: `Date:` headers or none, dates written inside the lines, list
items with or without priority emojis, bold section titles, `[O1]` anchors, `(10:00)` times, fenced code blocks under
an item, paragraphs above condensed bullets (the Reflector's strongest compression level asks for them). The
reference implementation accepts all of them, and so does this check. It refuses only what is certainly not a log:

- an empty answer;
- an answer without a single observation line (a refusal such as "I'm sorry, I can't help with that", an essay);
- degenerate repetition, which the parsers detect before this check (`observer.detect_degenerate_repetition`):
  long lines or blocks of lines repeated many times, never repeated short lines such as a tool's `→ ok`.

(The Reflector's ladder also refuses a reflection that is not smaller than its input, after its last level.)

Where a heuristic is unsure (mostly prose around a few items; one item repeated many times; a reflection that no
longer shows the log's newest date), the answer is accepted and the doubt is returned as a note (`answer_notes`):
the caller counts it (a metric) and keeps it for the memory view and the inspector.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime

from om_lib.context.context import parse_date_from_content

_DATE_HEADER = re.compile(r'^\s*(?:[#*_>]+\s*)?Date:\s*(.+?)\s*$', re.IGNORECASE)
# An observation line: a list item, a priority emoji, a `(10:00)` time or an `[O1]` anchor starting the line.
_LIST_ITEM = re.compile(r'^\s*(?:\[O\d+(?:-N\d+)*\]\s*)?(?:[-*•+]|\d{1,3}[.)])\s+(.*\S)')
_LEADING_MARK = re.compile(
    r'^\s*(?:\[O\d+(?:-N\d+)*\]\s*)?(?:[🔴🟡🟢✅]\ufe0f?|\(\d{1,2}:\d{2}(?:\s*[AaPp]\.?[Mm]\.?)?\))\s*(.*\S)'
)
_STRUCTURE = re.compile(
    r'^\s*(?:</?thread\b[^>]*>|</?observation-group\b[^>]*>|</?observations>|```|#{1,6}\s|\*\*[^*]+\*\*:?\s*$'
    r'|_range: `|--- message boundary)',
    re.IGNORECASE,
)
_PRIORITY = re.compile(r'^(?:[🔴🟡🟢✅]\ufe0f?\s*)+')
_TIME = re.compile(r'^\(\d{1,2}:\d{2}(?:\s*[AaPp]\.?[Mm]\.?)?\)\s*')
_FENCE = re.compile(r'^\s*```')

# Notes (doubts that are counted, never refused).
NOTE_MOSTLY_PROSE = 'mostly_prose'
NOTE_REPEATED_ITEM = 'repeated_item'
NOTE_NEWEST_DATE_MISSING = 'newest_date_missing'
# Share of non-empty lines (outside code blocks) that may be prose before an answer is noted as mostly prose.
MAX_PROSE_SHARE = 0.5
# An answer whose items are mostly one repeated line is noted (a faithful summary of a repetitive tool run may be).
MIN_ITEMS_FOR_REPEAT_NOTE = 6
MAX_REPEATED_SHARE = 0.6


def _observation_text(line: str) -> str | None:
    """The text of an observation line (its bullet, priority and time taken off), or None for any other line."""
    match = _LIST_ITEM.match(line) or _LEADING_MARK.match(line)
    if match is None:
        return None
    return _TIME.sub('', _PRIORITY.sub('', match.group(1)).strip()).strip()


def _lines_outside_code(text: str) -> list[str]:
    """Non-empty lines, code blocks left out (code under an item is the item's detail, neither item nor prose)."""
    out: list[str] = []
    in_code = False
    for line in text.split('\n'):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code and line.strip():
            out.append(line)
    return out


def observation_log_problem(text: str) -> str | None:
    """Why `text` is certainly not an observation log (a phrase for an error message), or None when it may be one."""
    if not text.strip():
        return 'the answer is empty'
    if not any(_observation_text(line) for line in _lines_outside_code(text)):
        return 'the answer has no observation lines (is it a refusal or prose?)'
    return None


def answer_notes(text: str) -> tuple[str, ...]:
    """Doubts about an answer that passed `observation_log_problem`: `mostly_prose`, `repeated_item`."""
    lines = _lines_outside_code(text)
    items = [t for line in lines if (t := _observation_text(line))]
    notes: list[str] = []
    prose = [
        line
        for line in lines
        if _observation_text(line) is None and not (_DATE_HEADER.match(line) or _STRUCTURE.match(line))
    ]
    if lines and len(prose) > MAX_PROSE_SHARE * len(lines):
        notes.append(NOTE_MOSTLY_PROSE)
    if len(items) >= MIN_ITEMS_FOR_REPEAT_NOTE:
        _, repeats = Counter(t.lower() for t in items).most_common(1)[0]
        if repeats > MAX_REPEATED_SHARE * len(items):
            notes.append(NOTE_REPEATED_ITEM)
    return tuple(notes)


def _dates(text: str) -> set[datetime]:
    """Every calendar date the text names, in `Date:` headers or anywhere in its lines."""
    found: set[datetime] = set()
    for line in text.split('\n'):
        when = parse_date_from_content(line)
        if when is not None:
            found.add(when)
    return found


def reflection_problem(reflection: str, source: str) -> str | None:
    """Why `reflection` may not replace `source` (None when it may): only when it is certainly not an observation log.

    `source` is unused by the refusal (a reflection may reorganise the log in any valid shape); it is kept so callers
    pass what the reflection replaces, as `reflection_notes` needs it.
    """
    del source
    problem = observation_log_problem(reflection)
    return problem.replace('the answer', 'the reflection') if problem is not None else None


def reflection_notes(reflection: str, source: str) -> tuple[str, ...]:
    """Doubts about an accepted reflection: those of `answer_notes`, and `newest_date_missing` when the log named dates
    and the reflection no longer names the newest one anywhere (dates may be written another way, or lost)."""
    notes = list(answer_notes(reflection))
    before = _dates(source)
    if before and max(before) not in _dates(reflection):
        notes.append(NOTE_NEWEST_DATE_MISSING)
    return tuple(notes)
