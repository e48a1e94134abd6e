"""The archive: memory stays bounded when reflection cannot keep it small, without a model call.

When the active log passes `observation.archive.afterTokens` (1.5 × `reflection.observationTokens` unless set), its
oldest units move into the record's archive until about `keepTokens` remain (0.5 × by default):

    active log:  [g1][g5][g9][g14][g20]   →   active: [g14][g20]      archive: [g1][g5][g9]

A unit is an observation group (retrieval mode), a `<thread id>` section (resource scope), or the text between two
message boundaries (a plain thread log); a unit that alone passes the bound is split between its top-level lines, and
each piece keeps its group's range and its thread. Nothing is deleted: the Actor sees one `<archived-observations>`
line (`catalog_line`), the recall tool's `mode: "observations"` pages the archived groups back (`page_archive`), the
memory view and the inspector list them. Each move is one conditional write of a new generation (`origin:
'archive'`), so a reflection drafted from the log before it can never commit over it.

The archive bounds the Actor's context, not the stored history: archived groups stay until their messages are
deleted or the thread is cleared (om_lib/history/history.py). A later reflection condenses the active log only and
leaves the archive as it is (docs/decision_log.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from om_lib.config import ArchiveSettings
from om_lib.context import context as ctx
from om_lib.observation import resource_scope as rs
from om_lib.parts import CycleParts, ObservationsArchived
from om_lib.records import NO_STAGED_REFLECTION, ArchivedGroup, OMRecord
from om_lib.runtime.record_writer import lease_active
from om_lib.runtime.runtime import Runtime

Count = Callable[[str], int]

_THREAD_SECTION = re.compile(r'<thread\s+id="([^"]*)"\s*>(.*?)</thread\s*>', re.S | re.I)
_SEQ_RANGE = re.compile(r'^#(\d+):#(\d+)$')
_DATE_LINE = re.compile(r'^\s*Date:\s*\S', re.I)
_BOUNDARY_LINE = re.compile(r'^\s*--- message boundary \([^)]*\) ---\s*$', re.M)


# ---------------------------------------------------------------------------------------------------------------------
# Planning (pure)
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Unit:
    """One archivable piece of the log: `text[start:end]` (with the ungrouped text before it, boundaries included)."""

    start: int
    end: int
    kind: Literal['group', 'thread', 'text']
    group: ctx.ObservationGroup | None = None
    shown_thread: str | None = None
    body: str = ''


@dataclass(frozen=True)
class Piece:
    """What one archived unit (or the retired part of a split one) holds."""

    kind: Literal['group', 'thread', 'text']
    group_id: str | None
    range: str
    shown_thread: str | None
    observations: str


@dataclass(frozen=True)
class ArchivePlan:
    """The log after the move (`retained`) and what moves out (`pieces`, oldest first)."""

    retained: str
    pieces: tuple[Piece, ...]


def _spans(text: str) -> list[_Unit]:
    groups = ctx.parse_observation_groups(text)
    if groups:
        return [_Unit(g.start, g.end, 'group', group=g, body=g.content) for g in groups]
    sections = list(_THREAD_SECTION.finditer(text))
    if sections:
        return [_Unit(m.start(), m.end(), 'thread', shown_thread=m.group(1), body=m.group(2).strip()) for m in sections]
    cuts = [m.start() for m in ctx.BOUNDARY_RE.finditer(text)]
    edges = [0, *cuts, len(text)]
    return [_Unit(a, b, 'text', body=text[a:b]) for a, b in zip(edges, edges[1:], strict=False) if a < b]


def _units(text: str) -> list[_Unit]:
    """The log cut into units that cover it exactly; text between units goes with the unit after it (a boundary
    belongs to the batch it dates), or is a unit of its own when it holds observations."""
    units: list[_Unit] = []
    last = 0
    for span in _spans(text):
        gap = text[last : span.start]
        if _BOUNDARY_LINE.sub('', gap).strip():
            units.append(_Unit(last, span.start, 'text', body=gap))
            last = span.start
        units.append(_Unit(last, span.end, span.kind, span.group, span.shown_thread, span.body))
        last = span.end
    if text[last:].strip():
        units.append(_Unit(last, len(text), 'text', body=text[last:]))
    elif units:
        units[-1] = _Unit(
            units[-1].start, len(text), units[-1].kind, units[-1].group, units[-1].shown_thread, units[-1].body
        )
    return units


def _clean(text: str) -> str:
    return re.sub(r'\n{3,}', '\n\n', _BOUNDARY_LINE.sub('', text)).strip()


def _blocks(body: str) -> list[str]:
    """Top-level line blocks: a line that starts at the margin, with the indented (or blank) lines under it."""
    blocks: list[list[str]] = []
    for line in body.split('\n'):
        if blocks and (not line.strip() or line[:1] in (' ', '\t')):
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return ['\n'.join(b) for b in blocks]


def _split(body: str, count: Count, keep: int) -> tuple[str, str] | None:
    """(retired, retained) lines of one unit's body: leading blocks go until about `keep` tokens remain (at least
    one block stays); the retained part keeps the `Date:` header it was under. None when it cannot be split."""
    blocks = _blocks(body.strip())
    if len(blocks) < 2:
        return None
    sizes = [count(b) for b in blocks]
    cut = 0
    while cut < len(blocks) - 1 and sum(sizes[cut:]) > keep:
        cut += 1
    if cut == 0:
        return None
    retired, retained = blocks[:cut], blocks[cut:]
    header = next((b.split('\n')[0] for b in reversed(retired) if _DATE_LINE.match(b)), None)
    if header is not None and not _DATE_LINE.match(retained[0]):
        retained = [header, *retained]
    return '\n'.join(retired).strip(), '\n'.join(retained).strip()


def _rewrap(unit: _Unit, body: str) -> str:
    if unit.kind == 'group' and unit.group is not None:
        kind = unit.group.kind
        return ctx.wrap_in_observation_group(body, unit.group.range, group_id=unit.group.id, kind=kind)
    if unit.kind == 'thread' and unit.shown_thread is not None:
        return rs.wrap_with_thread_tag(unit.shown_thread, body)
    return body


def _piece(unit: _Unit, observations: str) -> Piece:
    group = unit.group
    return Piece(
        kind=unit.kind,
        group_id=group.id if group is not None else None,
        range=group.range if group is not None else '',
        shown_thread=unit.shown_thread,
        observations=_clean(observations),
    )


def plan_archive(text: str, count: Count, settings: ArchiveSettings) -> ArchivePlan | None:
    """What moves out of a log past `settings.after_tokens`: its oldest units until about `keep_tokens` remain (the
    newest unit always stays; when it alone passes the bound, its oldest blocks go too). None when the log is within
    the bound or nothing can move (one unsplittable unit)."""
    if not text.strip() or count(text) <= settings.after_tokens:
        return None
    units = _units(text)
    if not units:
        return None
    sizes = [count(text[u.start : u.end]) for u in units]
    cut = 0
    while cut < len(units) - 1 and sum(sizes[cut:]) > settings.keep_tokens:
        cut += 1
    pieces = [_piece(u, u.body) for u in units[:cut]]
    retained = text[units[cut].start :] if cut < len(units) else ''
    if count(retained) > settings.after_tokens:
        # The newest unit alone is past the bound: its oldest lines go too (it keeps its group, range and thread).
        last = units[-1]
        split = _split(last.body, count, settings.keep_tokens)
        if split is not None:
            retired_body, kept_body = split
            pieces.append(_piece(last, retired_body))
            retained = _rewrap(last, kept_body)
    pieces = [p for p in pieces if p.observations]
    if not pieces:
        return None
    retained = (
        _BOUNDARY_LINE.sub('', retained, count=1).strip()
        if retained.lstrip().startswith('--- message')
        else retained.strip()
    )
    return ArchivePlan(retained=retained, pieces=tuple(pieces))


def _seqs(range_: str) -> tuple[int | None, int | None]:
    match = _SEQ_RANGE.match(range_.strip())
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def archived_groups(
    plan: ArchivePlan, record: OMRecord, count: Count, now: datetime, *, thread_id: str | None
) -> tuple[ArchivedGroup, ...]:
    """The plan's pieces as archive entries: each with its thread (the real id, in resource scope) and messages."""
    threads = record.observed_thread_ids()
    real_ids = {rs.shown_thread_id(record.resource_id, t): t for t in threads} | {t: t for t in threads}
    out: list[ArchivedGroup] = []
    numbered = len(record.archived)
    for piece in plan.pieces:
        if piece.shown_thread is not None:
            owner: str | None = real_ids.get(piece.shown_thread, piece.shown_thread)
        else:
            owner = thread_id if record.scope == 'thread' else None
        start, end = _seqs(piece.range)
        numbered += 1
        out.append(
            ArchivedGroup(
                id=piece.group_id or f'a{numbered}',
                thread_id=owner,
                range=piece.range,
                start_seq=start,
                end_seq=end,
                observations=piece.observations,
                tokens=count(piece.observations),
                archived_at=now,
                generation=record.generation,
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------------
# What the Actor and recall see
# ---------------------------------------------------------------------------------------------------------------------
def _dates(archived: Sequence[ArchivedGroup]) -> tuple[datetime, datetime] | None:
    found = [
        when
        for group in archived
        for line in group.observations.split('\n')
        if _DATE_LINE.match(line) and (when := ctx.parse_date_from_content(line)) is not None
    ]
    return (min(found), max(found)) if found else None


def catalog_line(archived: Sequence[ArchivedGroup], count: Count, *, max_tokens: int, recall: bool) -> str | None:
    """The Actor's one `<archived-observations>` line: how much was archived, from when, and how to read it back.
    None when nothing is archived or the line would pass `max_tokens`."""
    if not archived or max_tokens <= 0:
        return None
    tokens = sum(g.tokens for g in archived)
    span = _dates(archived)
    dates = f' dates="{span[0]:%b %-d, %Y} – {span[1]:%b %-d, %Y}"' if span else ''
    how = (
        'recall with mode "observations" pages through them, newest first'
        if recall
        else 'they are kept with this memory and listed in its inspector'
    )
    line = (
        f'<archived-observations groups="{len(archived)}" tokens="{tokens}"{dates}>Older observations were moved out '
        f'of this context to keep it small; {how}.</archived-observations>'
    )
    return line if count(line) <= max_tokens else None


def page_archive(
    archived: Sequence[ArchivedGroup],
    *,
    query: str | None,
    page: int,
    limit: int,
    count: Count,
    max_tokens: int,
    show_thread: Callable[[str], str] = str,
) -> dict[str, Any]:
    """One page of archived groups, newest first (`page` from 0), for recall's `mode: "observations"`: `query` keeps
    the groups holding all its words (case-insensitive). Rendered like the active log (`## Messages #12–#19`)."""
    words = [w for w in re.findall(r'\w+', (query or '').lower()) if w]
    matching = [g for g in reversed(archived) if all(w in g.observations.lower() for w in words)]
    chosen = matching[page * limit : (page + 1) * limit]
    blocks = []
    for group in chosen:
        ends = ctx.range_ends(group.range)
        where = f'Messages {ends[0]}–{ends[1]}' if ends else 'Observations'
        thread = f' · thread {show_thread(group.thread_id)}' if group.thread_id else ''
        blocks.append(f'## {where}{thread} · archived {group.archived_at:%Y-%m-%d %H:%MZ}\n{group.observations}')
    text = '\n\n'.join(blocks)
    truncated, offset = False, 0
    total = count(text)
    if total > max_tokens:
        # Cut by characters in proportion, then say so: the Actor pages with a smaller `limit` for the rest.
        keep = max(0, int(len(text) * max_tokens / total) - 40)
        text = text[:keep] + f'\n... [truncated ~{total - max_tokens} tokens]'
        truncated, offset = True, total - max_tokens
    return {
        'observations': text if chosen else 'No archived observations match.' if words else 'Nothing is archived.',
        'count': len(chosen),
        'page': page,
        'limit': limit,
        'hasNextPage': len(matching) > (page + 1) * limit,
        'hasPrevPage': page > 0,
        'truncated': truncated,
        'tokenOffset': offset,
    }


# ---------------------------------------------------------------------------------------------------------------------
# The engine's room
# ---------------------------------------------------------------------------------------------------------------------
# Past this many times the bound the archive acts even when a reflection may still shrink the log (one was handed to
# the worker and has not started): the Actor's context stays bounded however long the queue takes.
HARD_BOUND_FACTOR = 2


class Archive:
    """Keeps a record's active log within its bound by archiving (see module docstring).

    `reflection_pending` says whether a reflection may still shrink a record's log (due and not failing, or staged):
    the archive leaves such a log to it, up to `HARD_BOUND_FACTOR` × the bound, so a healthy Reflector's work is never
    pre-empted by a move that makes its result unusable. It acts once reflection cannot (refused, backing off, the
    model down) or cannot keep up.
    """

    def __init__(self, rt: Runtime, reflection_pending: Callable[[OMRecord], bool] | None = None) -> None:
        self.rt = rt
        self._reflection_pending = reflection_pending or (lambda _record: False)

    def enforce(self, record: OMRecord, thread_id: str, parts: CycleParts) -> OMRecord:
        """Archive the oldest groups of a log past its bound, in one conditional write; the record as it is after."""
        rt = self.rt
        settings = rt.settings.archive
        if record.observation_tokens <= settings.after_tokens or self._waits_for_reflection(record):
            return record
        count = rt.counter.count_observations
        moved: list[tuple[ArchivedGroup, ...]] = []
        now = rt.clock.now()

        def build(current: OMRecord) -> OMRecord | None:
            if current.observation_tokens <= settings.after_tokens or self._waits_for_reflection(current):
                return None
            plan = plan_archive(current.active_observations, count, settings)
            if plan is None:
                return None
            entries = archived_groups(plan, current, count, now, thread_id=thread_id)
            moved[:] = [entries]
            return rt.writer.next_generation(
                current,
                origin='archive',
                active_observations=plan.retained,
                observation_tokens=count(plan.retained),
                archived=(*current.archived, *entries),
                # A staged reflection nobody activated was drafted from lines that are no longer where it would
                # put them.
                **NO_STAGED_REFLECTION,
                last_buffered_at_tokens=0,
            )

        committed = rt.writer.commit_generation(record, build)
        if committed is None or not moved:
            return rt.writer.fresh(record) if committed is None else committed
        entries = moved[0]
        parts.add(
            ObservationsArchived(
                cycle_id=f'archive-{rt.new_id()}',
                archived_at=now,
                groups_archived=len(entries),
                tokens_archived=sum(e.tokens for e in entries),
                observation_tokens=committed.observation_tokens,
                after_tokens=settings.after_tokens,
                archived_groups_total=len(committed.archived),
                archived_tokens_total=sum(g.tokens for g in committed.archived),
                generation_count=committed.generation,
                record_id=committed.id,
                thread_id=thread_id,
            )
        )
        return committed

    def _waits_for_reflection(self, record: OMRecord) -> bool:
        """Leave this log to a reflection: one is running, or one may still shrink it and the log is within the hard
        bound (an observation that jumps past both thresholds hands its reflection to the worker first)."""
        if self._reflecting(record):
            return True
        hard_bound = self.rt.settings.archive.after_tokens * HARD_BOUND_FACTOR
        return record.observation_tokens <= hard_bound and self._reflection_pending(record)

    def _reflecting(self, record: OMRecord) -> bool:
        """A reflection of this very log is running (a step's, or the workflow's, staging or committing): its result
        will shrink the log, and a new generation now would make it unusable (a model call thrown away). The bound
        waits for it; the log may pass it meanwhile by what is observed while it runs."""
        now = self.rt.clock.now()
        return lease_active(record.reflecting, now) or lease_active(record.buffering_reflection, now)
