"""Builders for the streamed `data-om-*` parts (seed 000, "Streaming data parts"). Field names are the seed's."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from om_lib.messages import iso

OperationType = Literal['observation', 'reflection']
DataPart = dict[str, Any]


@dataclass(frozen=True)
class MarkerConfig:
    """Snapshot of the thresholds at the time of a marker (`ObservationMarkerConfig`)."""

    message_tokens: int
    observation_tokens: int
    scope: str

    def as_json(self) -> dict[str, Any]:
        """The camelCase form used in parts."""
        return {'messageTokens': self.message_tokens, 'observationTokens': self.observation_tokens, 'scope': self.scope}


def _part(kind: str, data: dict[str, Any]) -> DataPart:
    return {'type': f'data-om-{kind}', 'data': data}


def observation_start(
    *,
    cycle_id: str,
    operation: OperationType,
    started_at: datetime,
    tokens_to_observe: int,
    record_id: str,
    thread_id: str,
    thread_ids: list[str],
    config: MarkerConfig,
) -> DataPart:
    """`data-om-observation-start`: the Observer or Reflector began."""
    return _part(
        'observation-start',
        {
            'cycleId': cycle_id,
            'operationType': operation,
            'startedAt': iso(started_at),
            'tokensToObserve': tokens_to_observe,
            'recordId': record_id,
            'threadId': thread_id,
            'threadIds': thread_ids,
            'config': config.as_json(),
        },
    )


def observation_end(
    *,
    cycle_id: str,
    operation: OperationType,
    completed_at: datetime,
    duration_ms: int,
    tokens_observed: int,
    observation_tokens: int,
    observations: str,
    current_task: str | None,
    suggested_response: str | None,
    record_id: str,
    thread_id: str,
) -> DataPart:
    """`data-om-observation-end`: the cycle committed."""
    data: dict[str, Any] = {
        'cycleId': cycle_id,
        'operationType': operation,
        'completedAt': iso(completed_at),
        'durationMs': duration_ms,
        'tokensObserved': tokens_observed,
        'observationTokens': observation_tokens,
        'observations': observations,
        'recordId': record_id,
        'threadId': thread_id,
    }
    if current_task is not None:
        data['currentTask'] = current_task
    if suggested_response is not None:
        data['suggestedResponse'] = suggested_response
    return _part('observation-end', data)


def observation_failed(
    *,
    cycle_id: str,
    operation: OperationType,
    failed_at: datetime,
    duration_ms: int,
    tokens_attempted: int,
    error: str,
    record_id: str,
    thread_id: str,
    observations: str = '',
    retrying: bool = False,
    reason: str = 'error',
) -> DataPart:
    """`data-om-observation-failed`: nothing was committed; the messages stay unobserved.

    `reason` is ours (CONTRACT §2): `error`, `deferred` (the request's time budget ran out; a worker finishes it),
    `conflict` (another writer won), `not_smaller` (a reflection could not shrink the log).
    """
    return _part(
        'observation-failed',
        {
            'cycleId': cycle_id,
            'operationType': operation,
            'failedAt': iso(failed_at),
            'durationMs': duration_ms,
            'tokensAttempted': tokens_attempted,
            'error': error,
            'reason': reason,
            'retrying': retrying,
            'observations': observations,
            'recordId': record_id,
            'threadId': thread_id,
        },
    )


def thread_update(*, cycle_id: str, thread_id: str, old_title: str | None, new_title: str, at: datetime) -> DataPart:
    """`data-om-thread-update`: the Observer renamed the thread."""
    data: dict[str, Any] = {'cycleId': cycle_id, 'threadId': thread_id, 'newTitle': new_title, 'timestamp': iso(at)}
    if old_title is not None:
        data['oldTitle'] = old_title
    return _part('thread-update', data)


def status(
    *,
    message_tokens: int,
    message_threshold: int,
    observation_tokens: int,
    observation_threshold: int,
    buffered_chunks: int = 0,
    buffered_message_tokens: int = 0,
    projected_message_removal: int = 0,
    buffered_observation_tokens: int = 0,
    buffered_observation_status: str = 'idle',
    reflection_input_tokens: int = 0,
    reflection_output_tokens: int = 0,
    reflection_status: str = 'idle',
    record_id: str,
    thread_id: str,
    step_number: int,
    generation_count: int,
) -> DataPart:
    """`data-om-status`: the memory's windows, emitted on every step."""
    return _part(
        'status',
        {
            'windows': {
                'active': {
                    'messages': {'tokens': message_tokens, 'threshold': message_threshold},
                    'observations': {'tokens': observation_tokens, 'threshold': observation_threshold},
                },
                'buffered': {
                    'observations': {
                        'chunks': buffered_chunks,
                        'messageTokens': buffered_message_tokens,
                        'projectedMessageRemoval': projected_message_removal,
                        'observationTokens': buffered_observation_tokens,
                        'status': buffered_observation_status,
                    },
                    'reflection': {
                        'inputObservationTokens': reflection_input_tokens,
                        'observationTokens': reflection_output_tokens,
                        'status': reflection_status,
                    },
                },
            },
            'recordId': record_id,
            'threadId': thread_id,
            'stepNumber': step_number,
            'generationCount': generation_count,
        },
    )


def buffering_start(
    *,
    cycle_id: str,
    operation: OperationType,
    started_at: datetime,
    tokens_to_buffer: int,
    record_id: str,
    thread_id: str,
    thread_ids: list[str],
    config: MarkerConfig,
) -> DataPart:
    """`data-om-buffering-start`: background buffering of an observation or reflection was started."""
    return _part(
        'buffering-start',
        {
            'cycleId': cycle_id,
            'operationType': operation,
            'startedAt': iso(started_at),
            'tokensToBuffer': tokens_to_buffer,
            'recordId': record_id,
            'threadId': thread_id,
            'threadIds': thread_ids,
            'config': config.as_json(),
        },
    )


def buffering_end(
    *,
    cycle_id: str,
    operation: OperationType,
    completed_at: datetime,
    duration_ms: int,
    tokens_buffered: int,
    buffered_tokens: int,
    observations: str | None,
    record_id: str,
    thread_id: str,
) -> DataPart:
    """`data-om-buffering-end`: the buffered content is stored, not yet active."""
    data: dict[str, Any] = {
        'cycleId': cycle_id,
        'operationType': operation,
        'completedAt': iso(completed_at),
        'durationMs': duration_ms,
        'tokensBuffered': tokens_buffered,
        'bufferedTokens': buffered_tokens,
        'recordId': record_id,
        'threadId': thread_id,
    }
    if observations is not None:
        data['observations'] = observations
    return _part('buffering-end', data)


def with_observations(part: DataPart, observations: str) -> DataPart:
    """A copy of a `data-om-*` part with its `observations` text set (the stored parts leave it to the chunk)."""
    return {**part, 'data': {**part['data'], 'observations': observations}}


def buffering_failed(
    *,
    cycle_id: str,
    operation: OperationType,
    failed_at: datetime,
    duration_ms: int,
    tokens_attempted: int,
    error: str,
    record_id: str,
    thread_id: str,
    reason: str = 'error',
) -> DataPart:
    """`data-om-buffering-failed`: background buffering failed (the threshold path falls back to observing)."""
    return _part(
        'buffering-failed',
        {
            'cycleId': cycle_id,
            'operationType': operation,
            'failedAt': iso(failed_at),
            'durationMs': duration_ms,
            'tokensAttempted': tokens_attempted,
            'error': error,
            'recordId': record_id,
            'threadId': thread_id,
            'reason': reason,
        },
    )


def activation(
    *,
    cycle_id: str,
    operation: OperationType,
    activated_at: datetime,
    chunks_activated: int,
    tokens_activated: int,
    observation_tokens: int,
    messages_activated: int,
    generation_count: int,
    observations: str | None,
    record_id: str,
    thread_id: str,
    config: MarkerConfig,
    triggered_by: str = 'threshold',
) -> DataPart:
    """`data-om-activation`: buffered observations or a buffered reflection became active (no model call)."""
    data: dict[str, Any] = {
        'cycleId': cycle_id,
        'operationType': operation,
        'activatedAt': iso(activated_at),
        'chunksActivated': chunks_activated,
        'tokensActivated': tokens_activated,
        'observationTokens': observation_tokens,
        'messagesActivated': messages_activated,
        'generationCount': generation_count,
        'recordId': record_id,
        'threadId': thread_id,
        'config': config.as_json(),
        'triggeredBy': triggered_by,
    }
    if observations is not None:
        data['observations'] = observations
    return _part('activation', data)
