"""Resource scope's pure parts: thread attribution in the shared log, thread selection and batching, shown ids.

Pure functions only (no store, no model): the engine composes them. Spec §17 and seed 004, with two deliberate
departures from the reference:
- a new section merges into the *newest* section of its thread when that section is the log's tail and has the same
  date, never into an older section in the middle of the text (the reference merges into the first one, which
  rewrites old text and breaks prefix caching and prefix checks);
- shown thread ids are a keyed BLAKE2 hash (48 bits, stdlib) rather than xxHash32: nothing outside this service
  needs to reproduce them, 48 bits keeps collisions negligible for a resource's threads, and the key (the resource
  id) keeps one resource's hashes from being compared with another's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from om_lib.context import context as ctx
from om_lib.prompts.observer import strip_thread_tags

SHOWN_ID_HEX_CHARS = 12
_SECTION = re.compile(r'<thread id="([^"]*)">\n?(.*?)\n?</thread>', re.DOTALL)
_SECTION_OPEN = re.compile(r'<thread id="([^"]*)">')
_ANY_BOUNDARY = re.compile(r'\s*--- message boundary \(([0-9T:.\-]+Z)\) ---\s*')
_DATE_LINE = re.compile(r'^Date: ([A-Z][a-z]+ \d{1,2}, \d{4})\s*$', re.MULTILINE)


# -- shown thread ids ---------------------------------------------------------------------------------------------


def shown_thread_id(resource_id: str, thread_id: str) -> str:
    """The id models see for `thread_id` when thread ids are obscured: a keyed hash, stable per resource."""
    digest = hashlib.blake2s(thread_id.encode(), key=resource_id.encode()[:32], digest_size=16).hexdigest()
    return digest[:SHOWN_ID_HEX_CHARS]


@dataclass(frozen=True)
class ThreadIdCodec:
    """Maps real thread ids to the ids models see and back, for one resource.

    With `obscure` off the shown id is the real id. Resolving a shown id needs the resource's real ids (the hash is
    one-way): tools and recall pass the ids they can list.
    """

    resource_id: str
    obscure: bool

    def shown(self, thread_id: str) -> str:
        return shown_thread_id(self.resource_id, thread_id) if self.obscure else thread_id

    def resolve(self, shown: str, candidates: Iterable[str]) -> str | None:
        """The real id among `candidates` whose shown id is `shown` (a real id is accepted as itself too)."""
        for candidate in candidates:
            if candidate == shown or self.shown(candidate) == shown:
                return candidate
        return None


def reveal_thread_ids(text: str, resource_id: str, thread_ids: Iterable[str]) -> str:
    """`text` with each `<thread id>` section naming its real thread instead of the obscured id models saw.

    Only `thread_ids` can be resolved (the hash is one-way); a section of any other id is left as it is.
    """
    real = {shown_thread_id(resource_id, t): t for t in thread_ids}
    if not real:
        return text
    return _SECTION_OPEN.sub(lambda m: f'<thread id="{real.get(m.group(1), m.group(1))}">', text)


# -- thread sections in the shared log ----------------------------------------------------------------------------


def wrap_with_thread_tag(shown_id: str, observations: str) -> str:
    """`<thread id="…">` around one thread's new observations (tags the Observer wrote itself are removed first)."""
    return f'<thread id="{shown_id}">\n{strip_thread_tags(observations)}\n</thread>'


def _first_date(text: str) -> str | None:
    match = _DATE_LINE.search(text)
    return match.group(1) if match else None


def replace_or_append_thread_section(existing: str, section: str, last_observed_at: datetime) -> str:
    """Add one thread's section to the resource log.

    The section merges into the log's last section when that section is the same thread's and carries the same
    `Date:` line (the new lines after the section's Date line go before its `</thread>`); otherwise it is appended
    after a message boundary. Text before the tail is never rewritten.
    """
    if not existing.strip():
        return section
    new = _SECTION.fullmatch(section.strip())
    date = _first_date(section)
    appended = existing + ctx.message_boundary(last_observed_at) + section
    if new is None or date is None:
        return appended
    sections = list(_SECTION.finditer(existing))
    tail = sections[-1] if sections else None
    if tail is None or tail.end() != len(existing.rstrip()) or tail.group(1) != new.group(1):
        return appended
    if f'Date: {date}' not in tail.group(2):
        return appended
    body = new.group(2)
    after_date = body.split(f'Date: {date}', 1)[1].strip('\n')
    if not after_date.strip():
        return existing
    insert_at = tail.end() - len('</thread>')
    head = existing[:insert_at].rstrip('\n')
    return f'{head}\n{after_date}\n</thread>{existing[tail.end() :]}'


def remove_thread_sections(text: str, shown_ids: set[str]) -> str:
    """The log without the sections of the given threads (erase), and without the boundaries they leave dangling."""
    kept = _SECTION.sub(lambda m: '' if m.group(1) in shown_ids else m.group(0), text)
    chunks = [c.strip() for c in _ANY_BOUNDARY.split(kept)]
    # BOUNDARY_RE captures the boundary time: chunks alternate text, time, text, time, ...
    texts, times = chunks[0::2], chunks[1::2]
    out = ''
    for index, chunk in enumerate(texts):
        if not chunk:
            continue
        if out:
            out += ctx.message_boundary(datetime.fromisoformat(times[index - 1].replace('Z', '+00:00')))
        out += chunk
    return out


# -- which threads to observe, in which batches --------------------------------------------------------------------


@dataclass(frozen=True)
class ThreadLoad:
    """One thread's unobserved messages, as the selection sees them."""

    thread_id: str
    tokens: int
    oldest_at: datetime | None


def select_threads(loads: Sequence[ThreadLoad], threshold: int, *, now: datetime) -> list[ThreadLoad]:
    """The threads one observation cycle takes (spec §17.4 step 4).

    Largest first until the total reaches `threshold` (the first thread always goes in), then ordered by their oldest
    unobserved message (a missing time counts as `now`) so the log stays in time order.
    """
    chosen: list[ThreadLoad] = []
    total = 0
    for load in sorted((x for x in loads if x.tokens > 0), key=lambda x: (-x.tokens, x.thread_id)):
        if chosen and total >= threshold:
            break
        chosen.append(load)
        total += load.tokens
    return sorted(chosen, key=lambda x: (x.oldest_at or now, x.thread_id))


def batch_threads(ordered: Sequence[ThreadLoad], max_tokens_per_batch: int) -> list[list[ThreadLoad]]:
    """Split the ordered threads into Observer calls of at most `max_tokens_per_batch` (never an empty batch)."""
    batches: list[list[ThreadLoad]] = []
    current: list[ThreadLoad] = []
    current_tokens = 0
    for load in ordered:
        if current and current_tokens + load.tokens > max_tokens_per_batch:
            batches.append(current)
            current, current_tokens = [], 0
        current.append(load)
        current_tokens += load.tokens
    if current:
        batches.append(current)
    return batches


# -- other threads' unobserved messages, for the Actor -------------------------------------------------------------


def other_conversation_block(shown_id: str, transcript: str) -> str:
    """One other thread's unobserved messages as the Actor sees them."""
    return f'<other-conversation id="{shown_id}">\n{transcript}\n</other-conversation>'


def join_other_conversations(blocks: Sequence[str]) -> str | None:
    """The blocks joined with a blank line, or None when there are none."""
    return '\n\n'.join(blocks) if blocks else None
