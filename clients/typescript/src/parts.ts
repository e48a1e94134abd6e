/**
 * The `data-om-*` parts the API returns with steps, turns and chat replies (and streams while a turn runs).
 *
 * Each part is `{type: 'data-om-…', data: {…}}` — the shape of a data part of the AI SDK's UI message stream, so an
 * app can write it to its stream as it is. `OmDataTypes` names the data of each kind for `UIMessage<_, OmDataTypes>`.
 * The union is what this client knows: a newer server may send other `data-om-*` kinds, which arrive unchanged.
 */

export type OperationType = 'observation' | 'reflection';

/** Why a cycle did not commit. */
export type FailureReason =
  | 'error'
  | 'timeout'
  | 'deferred'
  | 'conflict'
  | 'not_smaller'
  | 'not_under_target'
  | 'invalid_output'
  | 'invalid_reflection'
  | 'model_unavailable'
  | 'busy';

/** The thresholds in force when a marker was made. */
export interface MarkerConfig {
  messageTokens: number;
  observationTokens: number;
  scope: string;
}

/** `data-om-status`: the memory's windows, on every step. */
export interface OmStatusData {
  windows: {
    active: {
      messages: { tokens: number; threshold: number };
      observations: { tokens: number; threshold: number };
    };
    buffered: {
      observations: {
        chunks: number;
        messageTokens: number;
        projectedMessageRemoval: number;
        observationTokens: number;
        status: string;
      };
      reflection: { inputObservationTokens: number; observationTokens: number; status: string };
    };
  };
  recordId: string;
  threadId: string;
  stepNumber: number;
  generationCount: number;
}

/** `data-om-observation-start`: the Observer or Reflector began. */
export interface OmObservationStartData {
  cycleId: string;
  operationType: OperationType;
  startedAt: string;
  tokensToObserve: number;
  recordId: string;
  threadId: string;
  threadIds: string[];
  config: MarkerConfig;
}

/** `data-om-observation-end`: the cycle committed. */
export interface OmObservationEndData {
  cycleId: string;
  operationType: OperationType;
  completedAt: string;
  durationMs: number;
  tokensObserved: number;
  observationTokens: number;
  observations: string;
  recordId: string;
  threadId: string;
  currentTask?: string;
  suggestedResponse?: string;
  /** Doubts about the answer that was accepted (`mostly_prose`, `repeated_item`, ...). */
  notes?: string[];
}

/** `data-om-observation-failed`: nothing was committed; the messages stay unobserved. */
export interface OmObservationFailedData {
  cycleId: string;
  operationType: OperationType;
  failedAt: string;
  durationMs: number;
  tokensAttempted: number;
  error: string;
  reason: FailureReason;
  retrying: boolean;
  observations: string;
  recordId: string;
  threadId: string;
}

/** `data-om-thread-update`: the Observer renamed the thread. */
export interface OmThreadUpdateData {
  cycleId: string;
  threadId: string;
  oldTitle?: string;
  newTitle: string;
  timestamp: string;
}

/** `data-om-buffering-start`: background buffering of an observation or reflection was started. */
export interface OmBufferingStartData {
  cycleId: string;
  operationType: OperationType;
  startedAt: string;
  tokensToBuffer: number;
  recordId: string;
  threadId: string;
  threadIds: string[];
  config: MarkerConfig;
}

/** `data-om-buffering-end`: the buffered content is stored, not yet active. */
export interface OmBufferingEndData {
  cycleId: string;
  operationType: OperationType;
  completedAt: string;
  durationMs: number;
  tokensBuffered: number;
  bufferedTokens: number;
  recordId: string;
  threadId: string;
  observations?: string;
}

/** `data-om-buffering-failed`: background buffering failed (the threshold path observes those messages). */
export interface OmBufferingFailedData {
  cycleId: string;
  operationType: OperationType;
  failedAt: string;
  durationMs: number;
  tokensAttempted: number;
  error: string;
  observations: string;
  recordId: string;
  threadId: string;
  reason: FailureReason;
}

/** `data-om-activation`: buffered observations or a buffered reflection became active (no model call). */
export interface OmActivationData {
  cycleId: string;
  operationType: OperationType;
  activatedAt: string;
  chunksActivated: number;
  tokensActivated: number;
  observationTokens: number;
  messagesActivated: number;
  generationCount: number;
  recordId: string;
  threadId: string;
  config: MarkerConfig;
  /** What started it: the threshold, idle time past `activateAfterIdle` (`ttl`), or a change of the Actor's model
   * (`provider_change`: the steps named another `actorModel`). */
  triggeredBy: 'threshold' | 'ttl' | 'provider_change' | (string & {});
  observations?: string;
  /** `ttl`: Unix milliseconds of the last reply the idle time is measured from. */
  lastActivityAt?: number;
  /** `ttl`: how long the thread had been idle, in milliseconds. */
  ttlExpiredMs?: number;
  /** `ttl`: the idle time in force, in milliseconds. */
  activateAfterIdle?: number;
  /** `provider_change`: the Actor's model before (`provider/model`). */
  previousModel?: string;
  /** `provider_change`: the Actor's model now (`provider/model`). */
  currentModel?: string;
}

/** `data-om-observations-archived`: the log passed `observation.archive.afterTokens`, so its oldest observation
 * groups moved into the archive (no model call); recall's `mode: "observations"` pages them back. */
export interface OmObservationsArchivedData {
  cycleId: string;
  archivedAt: string;
  groupsArchived: number;
  tokensArchived: number;
  observationTokens: number;
  afterTokens: number;
  archivedGroupsTotal: number;
  archivedTokensTotal: number;
  generationCount: number;
  recordId: string;
  threadId: string;
}

/** `data-om-scheduled`: background operations a request queued (`buffer`, `observe`, `reflect`, `title`). */
export interface OmScheduledData {
  operations: string[];
}

/** `data-om-actor-failed`: the chat Actor did not answer; the user's message is saved (retry with the same id). */
export interface OmActorFailedData {
  error: string;
  message: string;
  retryable: boolean;
  model: string | null;
}

/** `data-om-reply-unsaved`: the Actor's reply is returned but could not be saved (send it to `/turns`). */
export interface OmReplyUnsavedData {
  error: string;
  retryable: boolean;
}

/** `data-om-semantic-recall-failed`: similar earlier messages could not be looked up for this request. */
export interface OmSemanticRecallFailedData {
  error: string;
  retryable: boolean;
}

/** The data of each `data-om-*` part, by name without the `data-` prefix: `UIMessage<unknown, OmDataTypes>`. */
export type OmDataTypes = {
  'om-status': OmStatusData;
  'om-observation-start': OmObservationStartData;
  'om-observation-end': OmObservationEndData;
  'om-observation-failed': OmObservationFailedData;
  'om-thread-update': OmThreadUpdateData;
  'om-buffering-start': OmBufferingStartData;
  'om-buffering-end': OmBufferingEndData;
  'om-buffering-failed': OmBufferingFailedData;
  'om-activation': OmActivationData;
  'om-observations-archived': OmObservationsArchivedData;
  'om-scheduled': OmScheduledData;
  'om-actor-failed': OmActorFailedData;
  'om-reply-unsaved': OmReplyUnsavedData;
  'om-semantic-recall-failed': OmSemanticRecallFailedData;
};

/** One `data-om-*` part (narrow on `type`). */
export type OmPart = {
  [K in keyof OmDataTypes]: { type: `data-${K}`; data: OmDataTypes[K]; id?: string; transient?: boolean };
}[keyof OmDataTypes];

/** The type of an `OmPart`. */
export type OmPartType = OmPart['type'];

/** The parts of one type, e.g. `partsOf(step.parts, 'data-om-observation-end')`. */
export function partsOf<T extends OmPartType>(parts: readonly OmPart[], type: T): Extract<OmPart, { type: T }>[] {
  return parts.filter((part): part is Extract<OmPart, { type: T }> => part.type === type);
}

/** The `data-om-status` data of an answer (the last one), if it has one. */
export function statusOf(parts: readonly OmPart[]): OmStatusData | undefined {
  return partsOf(parts, 'data-om-status').at(-1)?.data;
}

/** `data-om-observation-failed` and `-buffering-failed` parts: trouble after the input was saved. */
export function failuresOf(parts: readonly OmPart[]): OmPart[] {
  return parts.filter((part) => part.type.endsWith('-failed'));
}
