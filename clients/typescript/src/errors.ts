/**
 * Errors: one class per error code of the API, grouped by HTTP status, as in the Python client.
 *
 * Every error answer has the shape `{"error": {"code", "message", "details"}}`; `errorFor(status, body)` picks the
 * class registered for `code`, or the class of the status family when the code is one this client does not know yet
 * (so `instanceof NotFound` keeps working when the server adds a new 404 code).
 *
 * ```ts
 * try {
 *   await om.memory('t1');
 * } catch (error) {
 *   if (error instanceof ThreadNotFound) console.log(error.code, error.message, error.details);
 * }
 * ```
 */

/** A field-level detail of an error (`{location, field, type, message}` for validation errors). */
export type ErrorDetail = Record<string, unknown>;

/** Root of every error this package throws (an aborted call rejects with the signal's reason instead). */
export class OMClientError extends Error {
  override name = 'OMClientError';
}

/** The API could not be reached (or the connection broke) and the retries are spent. */
export class ConnectionFailed extends OMClientError {
  override name = 'ConnectionFailed';
  /** How many times the request was sent. */
  readonly attempts: number;

  constructor(message: string, options: { cause?: unknown; attempts?: number } = {}) {
    super(message, { cause: options.cause });
    this.attempts = options.attempts ?? 1;
  }
}

/** What `APIError` and its subclasses are built from. */
export interface APIErrorInit {
  /** The HTTP status (undefined for a refusal made by this client before sending anything). */
  status?: number | undefined;
  /** The API's snake_case error code. */
  code?: string | undefined;
  details?: ErrorDetail[] | undefined;
  /** Milliseconds the server asked to wait (`Retry-After`). */
  retryAfterMs?: number | undefined;
  attempts?: number | undefined;
}

/** The API answered with an error. */
export class APIError extends OMClientError {
  override name = 'APIError';
  /** The status of this class's family (subclasses set it). */
  static readonly status: number | undefined = undefined;
  /** The error code this class stands for (subclasses set it). */
  static readonly code: string | undefined = undefined;

  /** The HTTP status (undefined for a refusal made by this client before sending anything). */
  readonly status: number | undefined;
  /** The API's snake_case error code. */
  readonly code: string;
  /** Field-level details (`[{location, field, type, message}]` for validation errors). */
  readonly details: ErrorDetail[];
  /** Milliseconds the server asked to wait (`Retry-After`), when it said. */
  readonly retryAfterMs: number | undefined;
  /** How many times the request was sent. */
  readonly attempts: number;

  constructor(message: string, init: APIErrorInit = {}) {
    super(message);
    const own = this.constructor as typeof APIError;
    this.status = init.status ?? own.status;
    this.code = init.code ?? own.code ?? 'error';
    this.details = [...(init.details ?? [])];
    this.retryAfterMs = init.retryAfterMs;
    this.attempts = init.attempts ?? 1;
  }

  override toString(): string {
    return `${this.status !== undefined ? `${this.status} ` : ''}${this.code}: ${this.message}`;
  }
}

// -- status families ------------------------------------------------------------------------------------------------
/** 400: the request is malformed. */
export class BadRequest extends APIError {
  override name = 'BadRequest';
  static override readonly status: number | undefined = 400;
  static override readonly code: string | undefined = 'bad_request';
}
/** 401: no identity (sign with SigV4, or send a valid bearer token). */
export class Unauthenticated extends APIError {
  override name = 'Unauthenticated';
  static override readonly status: number | undefined = 401;
  static override readonly code: string | undefined = 'unauthenticated';
}
/** 403: the identity may not act for this resourceId. */
export class Forbidden extends APIError {
  override name = 'Forbidden';
  static override readonly status: number | undefined = 403;
  static override readonly code: string | undefined = 'forbidden';
}
/** 404: no such route or item. */
export class NotFound extends APIError {
  override name = 'NotFound';
  static override readonly status: number | undefined = 404;
  static override readonly code: string | undefined = 'not_found';
}
/** 421 `host_not_allowed`: `om serve` does not answer for the Host the request named (start it with `--allowed-host`). */
export class HostNotAllowed extends APIError {
  override name = 'HostNotAllowed';
  static override readonly status: number | undefined = 421;
  static override readonly code: string | undefined = 'host_not_allowed';
}
/** 405: the path exists with other methods. */
export class MethodNotAllowed extends APIError {
  override name = 'MethodNotAllowed';
  static override readonly status: number | undefined = 405;
  static override readonly code: string | undefined = 'method_not_allowed';
}
/** 409: a conflict that left nothing written. */
export class Conflict extends APIError {
  override name = 'Conflict';
  static override readonly status: number | undefined = 409;
  static override readonly code: string | undefined = 'conflict';
}
/** 413: a documented size limit was passed. */
export class TooLarge extends APIError {
  override name = 'TooLarge';
  static override readonly status: number | undefined = 413;
  static override readonly code: string | undefined = 'too_large';
}
/** 415: the body is not JSON. */
export class UnsupportedMediaType extends APIError {
  override name = 'UnsupportedMediaType';
  static override readonly status: number | undefined = 415;
  static override readonly code: string | undefined = 'unsupported_media_type';
}
/** 422: well-formed but invalid. */
export class InvalidRequest extends APIError {
  override name = 'InvalidRequest';
  static override readonly status: number | undefined = 422;
  static override readonly code: string | undefined = 'invalid_request';
}
/** 429: throttled; retried with backoff until the retries are spent. */
export class RateLimited extends APIError {
  override name = 'RateLimited';
  static override readonly status: number | undefined = 429;
  static override readonly code: string | undefined = 'too_many_requests';
}
/** 5xx: the server failed. */
export class ServerError extends APIError {
  override name = 'ServerError';
  static override readonly status: number | undefined = 500;
  static override readonly code: string | undefined = 'server_error';
}

// -- codes ----------------------------------------------------------------------------------------------------------
/** 400 `invalid_json`: the body is not a JSON object. */
export class InvalidJSON extends BadRequest {
  override name = 'InvalidJSON';
  static override readonly code: string | undefined = 'invalid_json';
}
/** 403 `origin_not_allowed`: a web page of an origin the API does not allow tried to change data (browsers only). */
export class OriginNotAllowed extends Forbidden {
  override name = 'OriginNotAllowed';
  static override readonly code: string | undefined = 'origin_not_allowed';
}
/** 404 `thread_not_found`: no such thread for this resource (a thread of another resource reads the same). */
export class ThreadNotFound extends NotFound {
  override name = 'ThreadNotFound';
  static override readonly code: string | undefined = 'thread_not_found';
}
/** 409 `message_conflict`: a message id is stored with other content. */
export class MessageConflict extends Conflict {
  override name = 'MessageConflict';
  static override readonly code: string | undefined = 'message_conflict';
}
/** 409 `in_progress`: another request is answering this message; send it again (same id) to get its reply. */
export class InProgress extends Conflict {
  override name = 'InProgress';
  static override readonly code: string | undefined = 'in_progress';
}
/** 409 `thread_exists`: the thread id is taken. */
export class ThreadExists extends Conflict {
  override name = 'ThreadExists';
  static override readonly code: string | undefined = 'thread_exists';
}
/** 409 `version_conflict`: another request changed this memory at the same time; retry. */
export class VersionConflict extends Conflict {
  override name = 'VersionConflict';
  static override readonly code: string | undefined = 'version_conflict';
}
/** 409 `erased`: the thread or resource was erased while the request ran. */
export class Erased extends Conflict {
  override name = 'Erased';
  static override readonly code: string | undefined = 'erased';
}
/** 413 `payload_too_large`: the body, a list or an attachment is over its limit. */
export class PayloadTooLarge extends TooLarge {
  override name = 'PayloadTooLarge';
  static override readonly code: string | undefined = 'payload_too_large';
}
/** 413 `working_memory_too_large`. */
export class WorkingMemoryTooLarge extends TooLarge {
  override name = 'WorkingMemoryTooLarge';
  static override readonly code: string | undefined = 'working_memory_too_large';
}
/** 422 `validation_error`: fields are invalid (see `details` for each). */
export class ValidationFailed extends InvalidRequest {
  override name = 'ValidationFailed';
  static override readonly code: string | undefined = 'validation_error';
}
/** 422 `invalid_id`: a resource, thread or message id outside the id grammar. */
export class InvalidId extends InvalidRequest {
  override name = 'InvalidId';
  static override readonly code: string | undefined = 'invalid_id';
}
/** 422 `invalid_input`: a value the service cannot use (a cursor, a page, a date...). */
export class InvalidInput extends InvalidRequest {
  override name = 'InvalidInput';
  static override readonly code: string | undefined = 'invalid_input';
}
/** 422 `retrieval_disabled`: recall needs `retrieval` in the server's configuration. */
export class RetrievalDisabled extends InvalidRequest {
  override name = 'RetrievalDisabled';
  static override readonly code: string | undefined = 'retrieval_disabled';
}
/** 422 `buffering_disabled`: `buffer` needs observations buffered (thread scope with `observation.bufferTokens`);
 * observe instead. */
export class BufferingDisabled extends InvalidRequest {
  override name = 'BufferingDisabled';
  static override readonly code: string | undefined = 'buffering_disabled';
}
/** 422 `working_memory_disabled`: working memory is off in the server's configuration. */
export class WorkingMemoryDisabled extends InvalidRequest {
  override name = 'WorkingMemoryDisabled';
  static override readonly code: string | undefined = 'working_memory_disabled';
}
/** 422 `invalid_working_memory`: the update does not match the template or schema. */
export class InvalidWorkingMemory extends InvalidRequest {
  override name = 'InvalidWorkingMemory';
  static override readonly code: string | undefined = 'invalid_working_memory';
}
/** 500 `internal_error`. */
export class InternalError extends ServerError {
  override name = 'InternalError';
  static override readonly code: string | undefined = 'internal_error';
}
/** 502 `model_error`: the language model refused or failed the request. */
export class ModelError extends ServerError {
  override name = 'ModelError';
  static override readonly status: number | undefined = 502;
  static override readonly code: string | undefined = 'model_error';
}
/** 502 `dependency_unavailable`: API Gateway could not reach the function. */
export class DependencyUnavailable extends ServerError {
  override name = 'DependencyUnavailable';
  static override readonly status: number | undefined = 502;
  static override readonly code: string | undefined = 'dependency_unavailable';
}
/** 503: a model or dependency is unavailable right now; nothing was written. */
export class ServiceUnavailable extends ServerError {
  override name = 'ServiceUnavailable';
  static override readonly status: number | undefined = 503;
  static override readonly code: string | undefined = 'service_unavailable';
}
/** 503 `model_unavailable`. */
export class ModelUnavailable extends ServiceUnavailable {
  override name = 'ModelUnavailable';
  static override readonly code: string | undefined = 'model_unavailable';
}
/** 503 `storage_unavailable`. */
export class StorageUnavailable extends ServiceUnavailable {
  override name = 'StorageUnavailable';
  static override readonly code: string | undefined = 'storage_unavailable';
}
/** 504 `timeout`: API Gateway stopped waiting for the function. */
export class GatewayTimeout extends ServerError {
  override name = 'GatewayTimeout';
  static override readonly status: number | undefined = 504;
  static override readonly code: string | undefined = 'timeout';
}

type ErrorClass = typeof APIError;

/** The class of each error code the API answers. */
export const BY_CODE: ReadonlyMap<string, ErrorClass> = new Map(
  [
    BadRequest,
    Unauthenticated,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    TooLarge,
    UnsupportedMediaType,
    InvalidRequest,
    RateLimited,
    ServerError,
    HostNotAllowed,
    InvalidJSON,
    OriginNotAllowed,
    ThreadNotFound,
    MessageConflict,
    InProgress,
    ThreadExists,
    VersionConflict,
    Erased,
    PayloadTooLarge,
    WorkingMemoryTooLarge,
    ValidationFailed,
    InvalidId,
    InvalidInput,
    RetrievalDisabled,
    BufferingDisabled,
    WorkingMemoryDisabled,
    InvalidWorkingMemory,
    InternalError,
    ModelError,
    DependencyUnavailable,
    ServiceUnavailable,
    ModelUnavailable,
    StorageUnavailable,
    GatewayTimeout,
  ].map((cls): [string, ErrorClass] => [cls.code as string, cls]),
);

/** The class of each status family, for codes this client does not know. */
export const BY_STATUS: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [400, BadRequest],
  [401, Unauthenticated],
  [403, Forbidden],
  [404, NotFound],
  [405, MethodNotAllowed],
  [409, Conflict],
  [413, TooLarge],
  [415, UnsupportedMediaType],
  [421, HostNotAllowed],
  [422, InvalidRequest],
  [429, RateLimited],
  [500, InternalError],
  [502, ServerError],
  [503, ServiceUnavailable],
  [504, GatewayTimeout],
]);

/** Milliseconds from a `Retry-After` header (delta-seconds or an HTTP date); undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null | undefined, now: number = Date.now()): number | undefined {
  if (!value || !value.trim()) return undefined;
  const text = value.trim();
  if (/^\d+(\.\d+)?$/.test(text)) return Math.max(0, Number(text) * 1000);
  const when = Date.parse(text);
  return Number.isNaN(when) ? undefined : Math.max(0, when - now);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The error for an error answer: by `error.code` first, else by status (else `APIError`). */
export function errorFor(
  status: number,
  body: unknown,
  options: { headers?: Headers; text?: string; attempts?: number } = {},
): APIError {
  const error = isRecord(body) && isRecord(body.error) ? body.error : undefined;
  const code = typeof error?.code === 'string' ? error.code : undefined;
  const message = typeof error?.message === 'string' ? error.message : undefined;
  const details = Array.isArray(error?.details)
    ? error.details.map((d): ErrorDetail => (isRecord(d) ? d : { message: String(d) }))
    : [];
  const cls = (code && BY_CODE.get(code)) || BY_STATUS.get(status) || (status >= 500 ? ServerError : APIError);
  const fallback = (options.text ?? '').trim().slice(0, 500) || `HTTP ${status}`;
  return new cls(message ?? fallback, {
    status,
    code,
    details,
    retryAfterMs: parseRetryAfter(options.headers?.get('retry-after')),
    attempts: options.attempts ?? 1,
  });
}
