/**
 * When and how long to wait before sending a request again: the Python client's rules.
 *
 * Retried: 429, 502 and 503 (such answers left nothing written), connection failures before the request was sent,
 * and — for calls that are safe to repeat — timeouts, broken connections and 504. Every call of `MemoryClient` is
 * safe to repeat: messages carry client-side ids, and the server answers a chat message once (a repeat gets the
 * stored reply). Waits grow exponentially with jitter (half fixed, half random) up to `backoffMaxMs`; a
 * `Retry-After` header is honoured up to `maxRetryAfterMs`.
 */

export interface RetryPolicy {
  /** Retries after the first attempt (0 turns retries off). */
  maxRetries: number;
  /** The first retry's ceiling; each later one doubles it. */
  backoffBaseMs: number;
  /** The largest wait between attempts. */
  backoffMaxMs: number;
  /** The longest `Retry-After` honoured. */
  maxRetryAfterMs: number;
  /** Statuses retried for every call. */
  statuses: ReadonlySet<number>;
}

export const DEFAULT_RETRY_POLICY: Readonly<RetryPolicy> = Object.freeze({
  maxRetries: 3,
  backoffBaseMs: 500,
  backoffMaxMs: 8000,
  maxRetryAfterMs: 60_000,
  statuses: new Set([429, 502, 503]),
});

/** A policy from a partial one, or from a number of retries. */
export function retryPolicy(value: Partial<RetryPolicy> | number | undefined): RetryPolicy {
  if (typeof value === 'number') return { ...DEFAULT_RETRY_POLICY, maxRetries: value };
  return { ...DEFAULT_RETRY_POLICY, ...value };
}

/** Milliseconds to wait before retry number `retry` (0 for the first retry). */
export function retryDelay(
  policy: RetryPolicy,
  retry: number,
  retryAfterMs?: number,
  random: () => number = Math.random,
): number {
  if (retryAfterMs !== undefined) return Math.min(retryAfterMs, policy.maxRetryAfterMs);
  const ceiling = Math.min(policy.backoffMaxMs, policy.backoffBaseMs * 2 ** retry);
  return ceiling / 2 + random() * (ceiling / 2);
}

/** Whether an answer with `status` is worth sending again. */
export function retriesStatus(policy: RetryPolicy, status: number, idempotent: boolean): boolean {
  return policy.statuses.has(status) || (idempotent && status === 504);
}

// Node (undici) error codes of a connection that was never made: the request did not reach the server.
const NOT_SENT_CODES = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_CONNECT_TIMEOUT',
]);

function errorCode(error: unknown): string | undefined {
  for (let current: unknown = error, depth = 0; current && depth < 4; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === 'string') return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Whether a transport failure (fetch rejected, or the attempt's timeout fired) is worth sending again. Browsers do
 * not say whether a failed request was sent, so there only repeatable calls are retried. */
export function retriesTransportError(error: unknown, idempotent: boolean): boolean {
  const code = errorCode(error);
  if (code !== undefined && NOT_SENT_CODES.has(code)) return true;
  return idempotent;
}

/** Wait `ms`, or reject with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
