"""Async buffering, the pure part: which messages a buffering job observes, when buffered chunks activate and how,
and which lines a background reflection covers (reference spec §10–§12).

Nothing here reads configuration, storage or clocks; the engine passes the numbers in. The boundary arithmetic
itself (retention floor, projected removal, chunk selection, trigger intervals) lives in `om_lib.context.thresholds`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from om_lib.context import context as ctx
from om_lib.context.thresholds import (
    calculate_projected_message_removal,
    resolve_activation_ratio,
    resolve_retention_floor,
    select_chunks_to_activate,
    should_trigger_async_observation,
)
from om_lib.messages import Message
from om_lib.prompts import reflector as refl
from om_lib.records import BufferedChunk

__all__ = [
    'DEFAULT_BUFFER_ACTIVATION',
    'MAX_BACKGROUND_PARTS',
    'Activation',
    'ReflectionSlice',
    'activate_chunks',
    'background_part_key',
    'buffered_through',
    'keep_background_part',
    'live_chunks',
    'plan_activation',
    'retained_after_observation',
    'projected_removal',
    'reflection_slice',
    'should_buffer',
    'slice_start',
]

# The reference's fallback when bufferActivation is unset at activation time (spec §11.1 step 6).
DEFAULT_BUFFER_ACTIVATION = 0.7
# A buffered reflection asks for a modest 25% reduction of the slice it covers (spec §12.5 step 6).
BUFFERED_REFLECTION_TARGET = 0.75


def buffered_through(cursor: int, chunks: Sequence[BufferedChunk]) -> int:
    """The highest `seq` already observed or buffered: the record's cursor or the last chunk's end."""
    return max([cursor, *(c.end_seq for c in chunks)])


def slice_start(cursor: int, chunks: Sequence[BufferedChunk]) -> int:
    """The first `seq` a new buffering job may observe, so consecutive chunks cover disjoint, gapless ranges."""
    return buffered_through(cursor, chunks) + 1


# Background end/failed parts a record keeps for the next step; older ones are dropped (they are in the logs too).
MAX_BACKGROUND_PARTS = 20


def background_part_key(part: Mapping[str, Any]) -> tuple[str, str]:
    """What identifies a kept part: its type and cycle."""
    data = part.get('data') or {}
    return str(part.get('type', '')), str(data.get('cycleId', ''))


def keep_background_part(kept: Sequence[dict[str, Any]], part: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """`kept` plus `part` (replacing one of the same type and cycle), the newest `MAX_BACKGROUND_PARTS`."""
    key = background_part_key(part)
    rest = [p for p in kept if background_part_key(p) != key]
    return (*rest, part)[-MAX_BACKGROUND_PARTS:]


def retained_after_observation(
    observed: Sequence[Message], remaining_tokens: int, floor: float, count: Callable[[Sequence[Message]], int]
) -> list[Message]:
    """The newest just-observed messages the Actor keeps so its raw window holds `floor` tokens (spec §6.4 step 5).

    A synchronous observation at `blockAfter` would otherwise leave the Actor only the in-flight input; like the
    reference's cleanup, the most recent observed messages stay in this step's context until the floor holds.
    """
    kept: list[Message] = []
    for message in reversed(observed):
        if remaining_tokens + count(kept) >= floor:
            break
        kept.insert(0, message)
    return kept


def live_chunks(chunks: Sequence[BufferedChunk], cursor: int) -> tuple[BufferedChunk, ...]:
    """The chunks that may still activate, given the cursor a synchronous observation may have moved since.

    Chunks the cursor passed are superseded. A chunk the cursor stops inside is dropped with every chunk after it:
    activating a later one would move the cursor over the straddled chunk's unobserved messages, and the next
    buffering slice would start after it, so those messages would never reach the Observer. Dropping them makes the
    next slice start right after the cursor instead.
    """
    live: list[BufferedChunk] = []
    for chunk in sorted(chunks, key=lambda c: c.start_seq):
        if chunk.end_seq <= cursor:
            continue
        if chunk.start_seq <= cursor:
            break
        live.append(chunk)
    return tuple(live)


def should_buffer(pending: int, last_boundary: int, buffer_tokens: float, threshold: int) -> bool:
    """Has pending crossed a new buffering interval since the last job (spec §10.1)?

    A boundary above the current pending count is stale (the window shrank after an activation, a reflection or a
    delete) and counts as the current count, so no job fires until a fresh interval is crossed.
    """
    last = min(last_boundary, pending)
    return should_trigger_async_observation(pending, last, buffer_tokens, threshold)


def projected_removal(
    chunks: Sequence[BufferedChunk], buffer_activation: float | None, threshold: int, pending: int
) -> int:
    """`projectedMessageRemoval` of `data-om-status`: what an activation would remove now (spec §5, §7.10)."""
    ba = buffer_activation if buffer_activation is not None else 1
    return calculate_projected_message_removal([c.message_tokens for c in chunks], ba, threshold, pending)


def plan_activation(
    chunk_message_tokens: Sequence[int],
    *,
    pending: int,
    threshold: int,
    buffer_activation: float | None,
    buffer_tokens: float | None,
    block_after: float | None,
) -> int:
    """How many leading chunks to activate now; 0 means wait (spec §11.1 steps 4–8 and §11.2).

    Args:
        chunk_message_tokens: `messageTokens` of each buffered chunk, oldest first.
        pending: Unobserved message tokens now.
        threshold: The (maximum) message threshold `messageTokens`.
        buffer_activation: Ratio in (0, 1] or absolute retention (>= 1000); None means 0.7.
        buffer_tokens: The buffering interval in tokens (None: buffering off).
        block_after: The forced-observation point in tokens, or None.

    Returns:
        0 when there are no chunks, pending is below the threshold, or activating now would leave more than
        `floor + bufferTokens` pending (better to wait for more chunks); otherwise the chunk count of the storage rule.
    """
    if not chunk_message_tokens or pending < threshold:
        return 0
    ba = buffer_activation if buffer_activation is not None else DEFAULT_BUFFER_ACTIVATION
    ratio = resolve_activation_ratio(ba, threshold)
    force_max = block_after is not None and pending >= block_after
    floor = resolve_retention_floor(ba, threshold)
    projected = calculate_projected_message_removal(chunk_message_tokens, ba, threshold, pending)
    remaining = max(0, pending - projected)
    if not force_max and buffer_tokens and remaining > floor + buffer_tokens:
        return 0
    return select_chunks_to_activate(chunk_message_tokens, ratio, threshold, pending, force_max)


@dataclass(frozen=True)
class Activation:
    """The outcome of moving the first chunks into the active observations (no model call)."""

    active_observations: str
    activated: tuple[BufferedChunk, ...]
    remaining: tuple[BufferedChunk, ...]
    cursor: int
    last_observed_at: datetime | None
    message_tokens: int
    observation_tokens: int
    current_task: str | None
    suggested_response: str | None
    thread_title: str | None

    @property
    def message_ids(self) -> list[str]:
        """Every message id the activated chunks covered, in order."""
        return [mid for chunk in self.activated for mid in chunk.message_ids]


def activate_chunks(
    active_observations: str,
    chunks: Sequence[BufferedChunk],
    count: int,
    *,
    cursor: int,
    last_observed_at: datetime | None,
    render: Callable[[BufferedChunk], str] | None = None,
) -> Activation:
    """Append the first `count` chunks to the active log (storage swap, spec §11.2).

    The chunks' observations (each as `render(chunk)` gives it: retrieval mode wraps it in its observation group) are
    joined with a blank line and appended after one message boundary dated at the last activated chunk; the cursor and
    `lastObservedAt` never move backward. Continuation hints come from the last activated chunk only (a chunk without
    hints yields none: the caller decides whether to keep older ones).
    """
    count = max(0, min(count, len(chunks)))
    activated = tuple(chunks[:count])
    remaining = tuple(chunks[count:])
    if not activated:
        return Activation(active_observations, (), remaining, cursor, last_observed_at, 0, 0, None, None, None)
    shown = render or (lambda chunk: chunk.observations)
    content = '\n\n'.join(shown(c).strip() for c in activated if c.observations.strip())
    observed_at = activated[-1].last_observed_at
    if active_observations.strip() and content:
        text = active_observations + ctx.message_boundary(observed_at) + content
    else:
        text = active_observations if not content else content
    last = activated[-1]
    return Activation(
        active_observations=text,
        activated=activated,
        remaining=remaining,
        cursor=max(cursor, last.end_seq),
        last_observed_at=max(last_observed_at, observed_at) if last_observed_at else observed_at,
        message_tokens=sum(c.message_tokens for c in activated),
        observation_tokens=sum(c.token_count for c in activated),
        current_task=last.current_task,
        suggested_response=last.suggested_response,
        thread_title=next((c.thread_title for c in reversed(activated) if c.thread_title), None),
    )


@dataclass(frozen=True)
class ReflectionSlice:
    """The leading lines a background reflection covers (spec §12.5)."""

    text: str
    line_count: int
    input_tokens: int
    target_tokens: int


def reflection_slice(
    active_observations: str, observation_tokens: int, threshold: int, buffer_activation: float
) -> ReflectionSlice:
    """The first `floor(threshold × bufferActivation / avgTokensPerLine)` lines of the log and the target size.

    Example (spec §25 G 44): 300 lines of 30,000 tokens, threshold 40,000, activation 0.5 → 200 lines, an input
    estimate of 20,000 tokens and a target of 15,000.
    """
    text, count, estimate = refl.reflection_slice(active_observations, observation_tokens, threshold, buffer_activation)
    if count == 0 and active_observations.strip():
        # One line bigger than the whole activation point: reflect that line rather than nothing.
        text = active_observations.split('\n')[0]
        count, estimate = 1, observation_tokens
    lines = active_observations.split('\n')
    ends = group_end_lines(active_observations)
    if ends and count < len(lines) and count not in ends:
        # Never cut an observation group in two (the merge would leave half its markup): end at the last group end
        # inside the slice, or at the first one after it.
        inside = [end for end in ends if end <= count]
        count = inside[-1] if inside else min(end for end in ends if end > count)
        text = '\n'.join(lines[:count])
        estimate = math.floor(observation_tokens * count / len(lines) + 0.5)
    return ReflectionSlice(
        text=text,
        line_count=count,
        input_tokens=estimate,
        target_tokens=math.floor(BUFFERED_REFLECTION_TARGET * estimate + 0.5),
    )


def group_end_lines(text: str) -> list[int]:
    """For each observation group of a log, the number of lines up to and including its closing tag (ascending)."""
    return [text.count('\n', 0, group.end) + 1 for group in ctx.parse_observation_groups(text)]
