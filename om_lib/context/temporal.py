"""Temporal gap markers (`temporalMarkers`): when time passed between two messages, the Actor and the Observer are told.

As the reference does it: a `<system-reminder type="temporal-gap">` before the message that follows the gap, saying
how long it was ("2 hours later") and when the message was written. The gap is measured between the messages' own
times (`messages.time_of`), so replayed or imported history with its dates gets the markers its dates call for.

- The Actor's context gets a reminder message before each such message among its visible messages (never stored:
  a client that sends one back finds it dropped, like the continuation reminder).
- The Observer's transcript gets a `system-reminder` line at the same place (om_lib/prompts/observer.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from om_lib.messages import Message, TextPart, time_of

DEFAULT_MIN_GAP_S = 10 * 60.0
"""The reference's smallest gap worth a marker (10 minutes)."""
MARKER_ID_PREFIX = '__temporal_gap_'
MARKER_OPEN = '<system-reminder type="temporal-gap">'
MARKER_CLOSE = '</system-reminder>'


def format_gap(seconds: float) -> str:
    """The gap in words, in the reference's steps: "1 minute later" … "30 minutes later", "1 hour later" …
    "12 hours later", "1 day later" … "1 week later", "3 weeks later"."""
    minutes = int(seconds // 60)
    hours = minutes // 60
    days = hours // 24
    weeks = days // 7
    if weeks >= 2:
        return f'{weeks} weeks later'
    if weeks >= 1:
        return '1 week later'
    if days >= 3:
        return f'{days} days later'
    if days >= 2:
        return '2 days later'
    if days >= 1:
        return '1 day later'
    for step in (12, 6, 3, 2):
        if hours >= step:
            return f'{step} hours later'
    if hours >= 1:
        return '1 hour later'
    for step in (30, 15, 5):
        if minutes >= step:
            return f'{step} minutes later'
    return '1 minute later'


def format_timestamp(moment: datetime, timezone: str = 'UTC') -> str:
    """`11/28/2026, 3:04 PM UTC`: when the message after the gap was written, in the memory's time zone."""
    try:
        zone = ZoneInfo(timezone or 'UTC')
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo('UTC')
    local = moment.astimezone(zone)
    hour = local.hour % 12 or 12
    return f'{local:%m/%d/%Y}, {hour}:{local:%M} {"AM" if local.hour < 12 else "PM"} {local.tzname() or "UTC"}'


def marker_text(gap_s: float, moment: datetime, timezone: str = 'UTC') -> str:
    """What the marker says: `2 hours later — 11/28/2026, 3:04 PM UTC`."""
    return f'{format_gap(gap_s)} — {format_timestamp(moment, timezone)}'


def gaps(messages: Sequence[Message], min_gap_s: float) -> dict[str, float]:
    """`{message id: seconds}` for each message that comes at least `min_gap_s` after the one before it."""
    out: dict[str, float] = {}
    previous: datetime | None = None
    for message in messages:
        moment = time_of(message)
        if previous is not None and (gap := (moment - previous).total_seconds()) >= min_gap_s:
            out[message.id] = gap
        previous = moment
    return out


_MARKER_TEXT = re.compile(re.escape(MARKER_OPEN) + r'[^<]*' + re.escape(MARKER_CLOSE))


def is_marker(message: Message) -> bool:
    """Is this a gap marker the engine made (never stored)? Its id says so, or its whole text is one."""
    if message.id.startswith(MARKER_ID_PREFIX):
        return True
    return message.role == 'user' and bool(_MARKER_TEXT.fullmatch(message.text().strip()))


def with_markers(messages: Sequence[Message], min_gap_s: float | None, timezone: str = 'UTC') -> list[Message]:
    """The Actor's messages with a marker before each message that follows a gap (unchanged when markers are off)."""
    if min_gap_s is None or len(messages) < 2:
        return list(messages)
    # The continuation reminder is dated 1970 on purpose; it never makes a gap.
    dated = [m for m in messages if m.created_at.year > 1970]
    found = gaps(dated, min_gap_s)
    if not found:
        return list(messages)
    out: list[Message] = []
    for message in messages:
        gap = found.get(message.id)
        if gap is not None:
            moment = time_of(message)
            out.append(
                Message(
                    id=f'{MARKER_ID_PREFIX}{message.id}',
                    role='user',
                    created_at=moment - timedelta(milliseconds=1),
                    parts=(TextPart(text=f'{MARKER_OPEN}{marker_text(gap, moment, timezone)}{MARKER_CLOSE}'),),
                )
            )
        out.append(message)
    return out


def without_markers(messages: Iterable[Message]) -> list[Message]:
    """Messages minus gap markers (a client that sends the Actor's context back)."""
    return [m for m in messages if not is_marker(m)]
