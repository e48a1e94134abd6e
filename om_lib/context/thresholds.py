"""Pure threshold arithmetic of observational memory (reference spec §5, §10.1, §11.2, §12.2).

Nothing here reads configuration, storage or clocks: every function takes the numbers it needs, so the engine,
the stores and the tests share one implementation of each rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    'ThresholdRange',
    'calculate_dynamic_threshold',
    'calculate_projected_message_removal',
    'get_max_threshold',
    'resolve_activation_ratio',
    'resolve_block_after',
    'resolve_buffer_tokens',
    'resolve_retention_floor',
    'select_chunks_to_activate',
    'should_trigger_async_observation',
    'should_trigger_async_reflection_tokens',
]


@dataclass(frozen=True)
class ThresholdRange:
    """A message threshold that grows into unused observation space (`shareTokenBudget`).

    Attributes:
        min: The base threshold (`observation.messageTokens`); the threshold never drops below it.
        max: The whole budget (`messageTokens + reflection.observationTokens`).
    """

    min: int
    max: int


def get_max_threshold(threshold: int | ThresholdRange) -> int:
    """The largest value a threshold can take: the number itself, or a range's `max` (`getMaxThreshold`)."""
    return threshold.max if isinstance(threshold, ThresholdRange) else threshold


def calculate_dynamic_threshold(threshold: int | ThresholdRange, observation_tokens: float) -> int:
    """The message threshold in force given the current observation size (`calculateDynamicThreshold`).

    A plain number is returned unchanged. A range gives `round(max(range.max - observation_tokens, range.min))`:
    messages may use whatever part of the shared budget observations do not.

    Args:
        threshold: The resolved `observation.messageTokens`.
        observation_tokens: Tokens of the record's active observations.

    Returns:
        The threshold in tokens.
    """
    if not isinstance(threshold, ThresholdRange):
        return threshold
    return _js_round(max(threshold.max - observation_tokens, threshold.min))


def resolve_buffer_tokens(buffer_tokens: float, message_tokens: int | ThresholdRange) -> float:
    """`observation.bufferTokens` in tokens: a value strictly between 0 and 1 is a fraction of the threshold.

    Any other value (including 0 or a negative number, which validation then refuses) is taken as-is.
    """
    if 0 < buffer_tokens < 1:
        return _js_round(get_max_threshold(message_tokens) * buffer_tokens)
    return buffer_tokens


def resolve_block_after(block_after: float, threshold: int | ThresholdRange) -> float:
    """`blockAfter` in tokens: `1 <= v < 100` is a multiplier of the threshold, anything else is absolute.

    This follows the reference's code; its doc comments (which say `1 < v < 2`) disagree with it. A value below 1
    is kept as an absolute number and then fails validation (it is below the threshold).
    """
    if 1 <= block_after < 100:
        return _js_round(get_max_threshold(threshold) * block_after)
    return block_after


def resolve_retention_floor(buffer_activation: float, threshold: float) -> float:
    """Message tokens to keep after activation (`resolveRetentionFloor`).

    Args:
        buffer_activation: A ratio in (0, 1], or an absolute number of tokens to keep (>= 1000).
        threshold: The maximum message threshold.

    Returns:
        `buffer_activation` itself when absolute, else `threshold * (1 - ratio)` with the ratio clamped to [0, 1].
    """
    if buffer_activation >= 1000:
        return buffer_activation
    ratio = max(0.0, min(1.0, buffer_activation))
    return threshold * (1 - ratio)


def resolve_activation_ratio(buffer_activation: float, threshold: float) -> float:
    """The activation ratio the storage layer takes (`resolveActivationRatio`).

    An absolute retention (>= 1000 tokens) becomes `clamp(1 - buffer_activation / threshold, 0, 1)`; a ratio is
    clamped to [0, 1].
    """
    if buffer_activation >= 1000:
        return max(0.0, min(1.0, 1 - buffer_activation / threshold))
    return max(0.0, min(1.0, buffer_activation))


def _chunk_boundaries(chunk_message_tokens: Sequence[int], target: float) -> tuple[int, int, int, int]:
    """Walk cumulative chunk sizes: the closest boundary at/over `target` and the closest one under it.

    Returns:
        `(over_count, over_tokens, under_count, under_tokens)`; a count of 0 means no such boundary.
    """
    cumulative = 0
    over_count, over_tokens, under_count, under_tokens = 0, 0, 0, 0
    for index, tokens in enumerate(chunk_message_tokens):
        cumulative += tokens or 0
        if cumulative >= target:
            if over_count == 0 or cumulative < over_tokens:
                over_count, over_tokens = index + 1, cumulative
        elif cumulative > under_tokens:
            under_count, under_tokens = index + 1, cumulative
    return over_count, over_tokens, under_count, under_tokens


def calculate_projected_message_removal(
    chunk_message_tokens: Sequence[int], buffer_activation: float, threshold: float, pending: float
) -> int:
    """Message tokens an activation would remove right now, without activating (`calculateProjectedMessageRemoval`).

    Same boundary rule as storage activation (`select_chunks_to_activate`) minus the forced-maximum branch: prefer
    the first chunk boundary at or over the target unless it overshoots by more than 95% of the retention floor or
    would leave fewer than `min(1000, floor)` tokens; then the largest boundary under the target; then the over
    boundary anyway; else the first chunk.

    Args:
        chunk_message_tokens: `messageTokens` of each buffered chunk, oldest first.
        buffer_activation: `observation.bufferActivation` (ratio or absolute retention).
        threshold: The maximum message threshold.
        pending: Pending message tokens now.

    Returns:
        The projected number of message tokens removed (0 with no chunks; the reference's rule exactly, so with
        pending already within the floor the first boundary counts, as activating now would remove it).
    """
    if not chunk_message_tokens:
        return 0
    floor = resolve_retention_floor(buffer_activation, threshold)
    target = max(0.0, pending - floor)
    over_count, over_tokens, under_count, under_tokens = _chunk_boundaries(chunk_message_tokens, target)
    max_overshoot = floor * 0.95
    min_remaining = min(1000, floor)
    if over_count > 0 and over_tokens - target <= max_overshoot and pending - over_tokens >= min_remaining:
        return over_tokens
    if under_count > 0 and pending - under_tokens >= min_remaining:
        return under_tokens
    if over_count > 0:
        return over_tokens
    return chunk_message_tokens[0] or 0


def select_chunks_to_activate(
    chunk_message_tokens: Sequence[int],
    activation_ratio: float,
    threshold: float,
    pending: float,
    force_max: bool,
) -> int:
    """How many leading buffered chunks storage activation moves into the active log (`swapBufferedToActive`, §11.2).

    Args:
        chunk_message_tokens: `messageTokens` of each buffered chunk, oldest first.
        activation_ratio: The ratio from `resolve_activation_ratio`; the retention floor is `T * (1 - ratio)`.
        threshold: The maximum message threshold `T`.
        pending: Pending message tokens `P`.
        force_max: Pending is at or above `blockAfter`: take the over boundary whenever it leaves
            `min(1000, floor)` tokens, however far it overshoots.

    Returns:
        The number of chunks to activate: 0 only when there are no chunks, otherwise at least 1.
    """
    if not chunk_message_tokens:
        return 0
    floor = threshold * (1 - activation_ratio)
    target = max(0.0, pending - floor)
    over_count, over_tokens, under_count, under_tokens = _chunk_boundaries(chunk_message_tokens, target)
    max_overshoot = floor * 0.95
    min_remaining = min(1000, floor)
    if force_max and over_count > 0 and pending - over_tokens >= min_remaining:
        return over_count
    if over_count > 0 and over_tokens - target <= max_overshoot and pending - over_tokens >= min_remaining:
        return over_count
    if under_count > 0 and pending - under_tokens >= min_remaining:
        return under_count
    if over_count > 0:
        return over_count
    return 1


def should_trigger_async_observation(
    current: float, last_boundary: float, buffer_tokens: float, threshold: float | None
) -> bool:
    """Whether pending tokens crossed a new buffering interval (the arithmetic of §10.1).

    The interval is `buffer_tokens`, halved once `current >= threshold - 1.1 * buffer_tokens` so buffering keeps up
    near the threshold. With no threshold the interval never halves.

    Args:
        current: Pending message tokens now.
        last_boundary: Pending tokens at the last buffer op (`max(record.lastBufferedAtTokens, in-memory boundary)`).
        buffer_tokens: The resolved `observation.bufferTokens` (> 0).
        threshold: The message threshold in force, or None.

    Returns:
        True when `floor(current / interval) > floor(last_boundary / interval)`.
    """
    ramp = threshold - 1.1 * buffer_tokens if threshold is not None else math.inf
    interval = buffer_tokens / 2 if current >= ramp else buffer_tokens
    return math.floor(current / interval) > math.floor(last_boundary / interval)


def should_trigger_async_reflection_tokens(
    observation_tokens: float, threshold: float, buffer_activation: float
) -> bool:
    """Whether observations are big enough to start a background reflection (the arithmetic of §12.2).

    Returns:
        `observation_tokens >= threshold * buffer_activation`.
    """
    return observation_tokens >= threshold * buffer_activation


def _js_round(value: float) -> int:
    """JavaScript's `Math.round`: halves round up (Python's `round` rounds them to even)."""
    return math.floor(value + 0.5)
