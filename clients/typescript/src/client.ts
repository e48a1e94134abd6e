/**
 * `MemoryClient`: every route of the Observational Memory API, typed from the served OpenAPI document.
 *
 * ```ts
 * import { MemoryClient, userMessage } from 'om-client';
 *
 * const om = new MemoryClient({ apiUrl: 'http://127.0.0.1:8787', resourceId: 'user-42' });
 * const step = await om.step('t1', [userMessage('I moved to Lisbon.')]); // before every model call
 * // ... call your model with step.system + step.messages ...
 * await om.turn('t1', ['Noted!']);                                        // after the turn
 * ```
 *
 * Messages get their ids here, so a write that is sent again (a retry, or your own) changes nothing on the server,
 * and a chat message sent again gets the reply already given. Calls are retried on 429/502/503/504, timeouts and
 * connection failures with backoff and jitter (see `RetryPolicy`); errors
 * throw the class of their code (`ThreadNotFound`, `MessageConflict`, `RateLimited`, ...). Every method takes an
 * `AbortSignal` (`{ signal }`): aborting stops the request and any wait between retries.
 */
import createClient from 'openapi-fetch';
import { type Auth, noAuth } from './auth.js';
import { type ChatStreamChunk, discard, readChatStream } from './chat-stream.js';
import { APIError, ConnectionFailed, ThreadExists, errorFor } from './errors.js';
import type { paths } from './generated/openapi.js';
import { asMessage, checkId, newMessageId } from './messages.js';
import {
  type RetryPolicy,
  retriesStatus,
  retriesTransportError,
  retryDelay,
  retryPolicy,
  sleep as abortableSleep,
} from './retry.js';
import type {
  AttachmentUpload,
  ChatResult,
  CloneResult,
  DateRange,
  FilePart,
  Health,
  ImagePart,
  Include,
  ImportedMessage,
  ListedMessage,
  MemoryGenerations,
  MemoryOperation,
  MemoryStatus,
  Message,
  MessageInput,
  MessageLike,
  MessagesPage,
  MessagesQueryResult,
  RecallMode,
  RecallResult,
  StepResult,
  Thread,
  ThreadsPage,
  TurnResult,
  WorkingMemory,
} from './types.js';

export const VERSION = '0.1.0';
/** API Gateway gives up on an integration after ~29 s. */
const DEFAULT_TIMEOUT_MS = 35_000;
const UPLOAD_TIMEOUT_MS = 120_000;

export interface MemoryClientOptions {
  /** The API's base URL: the API Gateway stage URL, or `http://127.0.0.1:8787` for `om serve`. */
  apiUrl: string;
  /** Default `resourceId` of every call (the user or tenant whose memory this is). */
  resourceId?: string;
  /** `noAuth` (default), `bearerAuth(token)`, or `iamAuth()` from `om-client/iam`. */
  auth?: Auth;
  /** A retry policy (partial), or the number of retries (0 turns them off). */
  retries?: Partial<RetryPolicy> | number;
  /** Milliseconds per attempt (default 35 000). */
  timeoutMs?: number;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** The `fetch` to use (default: the global one); tests and proxies pass their own. */
  fetch?: (request: Request) => Promise<Response>;
  /** How to wait between retries (tests). */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** Random numbers in [0, 1) for the jitter (tests). */
  random?: () => number;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the request (and any wait between retries); the call rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Whose memory (default: the client's `resourceId`). */
  resourceId?: string;
}

/** How one call may be retried. */
interface SendRules {
  /** A 404 on a repeated attempt means an earlier attempt already did it (deletes). */
  doneIfMissingOnRetry?: boolean;
  signal?: AbortSignal | undefined;
}

/** What openapi-fetch answers for one attempt. */
interface Attempt {
  data?: unknown;
  error?: unknown;
  response: Response;
}

/** A request that failed on the way (fetch rejected, the connection broke, the attempt timed out). */
class TransportFailure extends Error {
  override name = 'TransportFailure';
}

/** Percent-encoding as SigV4 and API Gateway expect it (RFC 3986: a space is %20, never +; `!'()*` escaped). */
export function encodeRfc3986(value: string): string {
  return encodeURIComponent(value).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

function serializeQuery(query: Record<string, unknown>): string {
  return Object.entries(query)
    .filter(([, value]) => value !== undefined && value !== null)
    .map(([key, value]) => `${encodeRfc3986(key)}=${encodeRfc3986(String(value))}`)
    .join('&');
}

function serializePath(pathname: string, params: Record<string, unknown>): string {
  return pathname.replace(/\{(\w+)\}/g, (_, name: string) => encodeRfc3986(checkId(name, params[name])));
}

function clean<T extends Record<string, unknown>>(body: T): T {
  return Object.fromEntries(Object.entries(body).filter(([, value]) => value !== undefined && value !== null)) as T;
}

function withTimeout(signal: AbortSignal | undefined, ms: number): AbortSignal {
  const timeout = AbortSignal.timeout(ms);
  return signal ? AbortSignal.any([signal, timeout]) : timeout;
}

const NULL_BODY_STATUSES = new Set([101, 204, 205, 304]);

export class MemoryClient {
  /** The API's base URL (no trailing slash). */
  readonly apiUrl: string;
  /** The default `resourceId` of calls. */
  readonly resourceId: string | undefined;
  readonly retries: RetryPolicy;
  private readonly auth: Auth;
  private readonly timeoutMs: number;
  private readonly fetchImpl: (request: Request) => Promise<Response>;
  private readonly wait: (ms: number, signal?: AbortSignal) => Promise<void>;
  private readonly random: () => number;
  private readonly api: ReturnType<typeof createClient<paths>>;
  private readonly headers: Record<string, string>;

  constructor(options: MemoryClientOptions) {
    if (!options?.apiUrl || !/^https?:\/\//.test(options.apiUrl)) {
      throw new TypeError(
        `apiUrl must be an http(s) URL (the API stage URL, or http://127.0.0.1:8787), not ${JSON.stringify(options?.apiUrl)}`,
      );
    }
    this.apiUrl = options.apiUrl.replace(/\/+$/, '');
    this.resourceId = options.resourceId === undefined ? undefined : checkId('resourceId', options.resourceId);
    this.auth = options.auth ?? noAuth;
    this.retries = retryPolicy(options.retries);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.fetchImpl = options.fetch ?? ((request) => globalThis.fetch(request));
    this.wait = options.sleep ?? abortableSleep;
    this.random = options.random ?? Math.random;
    this.headers = { accept: 'application/json', ...options.headers };
    this.api = createClient<paths>({
      baseUrl: this.apiUrl,
      fetch: (request) => this.transport(request),
      querySerializer: serializeQuery,
      pathSerializer: serializePath,
      headers: this.headers,
    });
  }

  /** The resource id to use, checked. */
  private resource(resourceId: string | undefined): string {
    const value = resourceId ?? this.resourceId;
    if (!value) {
      throw new TypeError('resourceId is required: pass { resourceId } or new MemoryClient({ apiUrl, resourceId })');
    }
    return checkId('resourceId', value);
  }

  // -- sending --------------------------------------------------------------------------------------------------
  /** Credentials, one more try with fresh ones after a 401, and the answer read whole (a connection that breaks
   * while the body arrives is a transport failure, like one that breaks before). */
  private async transport(request: Request, options: { stream?: boolean } = {}): Promise<Response> {
    const spare = this.auth.refresh ? request.clone() : undefined;
    let response = await this.exchange(await this.auth.authorize(request), options);
    if (response.status === 401 && spare && (await this.auth.refresh?.())) {
      response = await this.exchange(await this.auth.authorize(spare), options);
    }
    return response;
  }

  private async exchange(request: Request, options: { stream?: boolean }): Promise<Response> {
    try {
      const response = await this.fetchImpl(request);
      if (options.stream && response.ok) return response;
      const body = NULL_BODY_STATUSES.has(response.status) ? null : await response.arrayBuffer();
      return new Response(body, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      });
    } catch (error) {
      throw new TransportFailure(error instanceof Error ? error.message : String(error), { cause: error });
    }
  }

  /** One call, retried per the policy: the answer's data, or the error of its code. */
  private async send<T>(
    label: string,
    attempt: (signal: AbortSignal) => Promise<Attempt>,
    rules: SendRules = {},
  ): Promise<T> {
    // Every call is repeatable: writes carry client-side ids, and a chat message is answered once by the server.
    const idempotent = true;
    const { signal } = rules;
    for (let n = 1; ; n += 1) {
      signal?.throwIfAborted();
      let wait: number;
      try {
        const { data, error, response } = await attempt(withTimeout(signal, this.timeoutMs));
        if (response.ok) return data as T;
        if (rules.doneIfMissingOnRetry && response.status === 404 && n > 1) return undefined as T;
        const text = typeof error === 'string' ? error : '';
        const failure = errorFor(response.status, error, { headers: response.headers, text, attempts: n });
        if (n > this.retries.maxRetries || !retriesStatus(this.retries, response.status, idempotent)) throw failure;
        wait = retryDelay(this.retries, n - 1, failure.retryAfterMs, this.random);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (!(error instanceof TransportFailure)) throw error;
        const cause = error.cause;
        if (n > this.retries.maxRetries || !retriesTransportError(cause, idempotent)) {
          throw new ConnectionFailed(`${label} failed after ${n} attempt(s): ${describe(cause)}`, {
            cause,
            attempts: n,
          });
        }
        wait = retryDelay(this.retries, n - 1, undefined, this.random);
      }
      await this.wait(wait, signal);
    }
  }

  // -- conversation ---------------------------------------------------------------------------------------------
  /** Save a step's new input (plain strings are user messages) and get the Actor's context. `actorModel`
   * (`provider/model`): the model your Actor calls, which `activateAfterIdle: "auto"` and `activateOnProviderChange`
   * use (the memory middleware sends the wrapped model's). */
  async step(
    threadId: string,
    messages: readonly MessageLike[] = [],
    options: CallOptions & { stepNumber?: number; readOnly?: boolean; actorModel?: string } = {},
  ): Promise<StepResult> {
    const body = clean({
      resourceId: this.resource(options.resourceId),
      messages: messages.map((m) => asMessage(m, 'user')),
      stepNumber: options.stepNumber,
      readOnly: options.readOnly,
      actorModel: options.actorModel,
    });
    return this.send(
      `POST /threads/${threadId}/steps`,
      (signal) => this.api.POST('/threads/{threadId}/steps', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** Save a turn's outputs (plain strings are assistant messages); schedules background work when due. */
  async turn(threadId: string, messages: readonly MessageLike[], options: CallOptions = {}): Promise<TurnResult> {
    const body = {
      resourceId: this.resource(options.resourceId),
      messages: messages.map((m) => asMessage(m, 'assistant')),
    };
    return this.send(
      `POST /threads/${threadId}/turns`,
      (signal) => this.api.POST('/threads/{threadId}/turns', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** Send a user message and get the server Actor's reply (steps + Actor + turns in one call). Retried like any
   * write: the server answers a message id once, so a repeat gets the stored reply (no second Actor call), and one
   * sent while the first is still being answered waits for it (or throws `InProgress`: send the same message again). */
  async chat(
    threadId: string,
    message: MessageLike,
    options: CallOptions & { readOnly?: boolean } = {},
  ): Promise<ChatResult> {
    const body = clean({
      resourceId: this.resource(options.resourceId),
      message: asMessage(message, 'user'),
      readOnly: options.readOnly,
    });
    return this.send(
      `POST /threads/${threadId}/chat`,
      (signal) => this.api.POST('/threads/{threadId}/chat', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /**
   * The same turn as `chat`, streamed: the AI SDK UI message stream (protocol v1) as typed chunks — `start`, text
   * deltas, each `data-om-*` part as it happens, `finish` — ending at the server's `[DONE]`. Until the stream starts,
   * failures are retried like `chat`; once chunks flow, nothing is resent (a broken stream throws). The turn is saved
   * even when the reader stops early or the connection breaks: send the same message (keep the `userMessage(...)`
   * you sent, with its id) to get the stored reply streamed again. Needs a server that streams chat (`Accept:
   * text/event-stream`); an older one is refused with a clear error.
   */
  async *chatStream(
    threadId: string,
    message: MessageLike,
    options: CallOptions & { readOnly?: boolean } = {},
  ): AsyncGenerator<ChatStreamChunk, void, undefined> {
    const body: paths['/threads/{threadId}/chat']['post']['requestBody']['content']['application/json'] = clean({
      resourceId: this.resource(options.resourceId),
      message: asMessage(message, 'user'),
      readOnly: options.readOnly,
    });
    const request = new Request(`${this.apiUrl}/threads/${encodeRfc3986(checkId('threadId', threadId))}/chat`, {
      method: 'POST',
      headers: { ...this.headers, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const response = await this.streamRequest(request, options.signal);
    yield* readChatStream(response, options.signal);
  }

  /**
   * Send a prepared request whose answer is an event stream (the streaming chat route), with this client's
   * credentials, retries and errors: the response once its headers arrive. Error answers throw the class of their
   * code; failures before the stream starts are retried as for `chat` (the message's id makes a repeat return the
   * turn the first attempt ran). The chat transport for `useChat` sends its requests through here.
   */
  async streamRequest(request: Request, signal?: AbortSignal): Promise<Response> {
    const label = `${request.method} ${new URL(request.url).pathname} (stream)`;
    const response = await this.send<Response>(
      label,
      async (firstByte) => {
        const attempt = new Request(request.clone(), {
          headers: { ...Object.fromEntries(request.headers), accept: 'text/event-stream' },
          signal: signal ?? null,
        });
        const answer = await this.streamTransport(attempt, firstByte);
        if (answer.ok) return { data: answer, response: answer };
        const text = await answer.text();
        let error: unknown = text;
        try {
          error = JSON.parse(text);
        } catch {
          // not JSON: the text is the message
        }
        return { error, response: answer };
      },
      { signal },
    );
    const kind = response.headers.get('content-type') ?? '';
    if (!kind.startsWith('text/event-stream')) {
      discard(response);
      throw new APIError(
        `the server answered ${kind || 'no content type'} instead of an event stream: it does not stream chat ` +
          '(use chat(), or a server version that streams)',
        { status: response.status, code: 'stream_unsupported' },
      );
    }
    return response;
  }

  /** The attempt's timeout covers the wait for the response headers only; the stream then runs under the caller's
   * signal alone. */
  private async streamTransport(request: Request, firstByte: AbortSignal): Promise<Response> {
    const timer = new AbortController();
    const stop = () => timer.abort(firstByte.reason);
    if (firstByte.aborted) stop();
    firstByte.addEventListener('abort', stop, { once: true });
    try {
      return await this.transport(new Request(request, { signal: AbortSignal.any([request.signal, timer.signal]) }), {
        stream: true,
      });
    } finally {
      firstByte.removeEventListener('abort', stop);
    }
  }

  // -- memory and messages --------------------------------------------------------------------------------------
  /** The thread's observational memory: observations, token counts, thresholds, current task. */
  async memory(threadId: string, options: CallOptions = {}): Promise<MemoryStatus> {
    const query = { resourceId: this.resource(options.resourceId) };
    return this.send(
      `GET /threads/${threadId}/memory`,
      (signal) => this.api.GET('/threads/{threadId}/memory', { params: { path: { threadId }, query }, signal }),
      options,
    );
  }

  /** The memory's generations, newest first: the current one, then the earlier ones (`limit` at most). */
  async memoryGenerations(
    threadId: string,
    options: CallOptions & { limit?: number } = {},
  ): Promise<MemoryGenerations> {
    const query = clean({ resourceId: this.resource(options.resourceId), limit: options.limit });
    return this.send(
      `GET /threads/${threadId}/memory/generations`,
      (signal) =>
        this.api.GET('/threads/{threadId}/memory/generations', { params: { path: { threadId }, query }, signal }),
      options,
    );
  }

  // Observe, reflect and buffer are retried like every call: the same import is observed once (the server knows it by
  // its messages' roles, contents and dates), a log just reflected is not reflected again, and a repeated observe or
  // buffer finds nothing left (`nothing_to_do`).

  /** Observe now: the thread's unobserved messages (below the threshold too), or, with `messages`, history imported
   * from another system (each with its `createdAt`), observed into the thread's memory without being added to its
   * messages. The same import twice is observed once. One import is one Observer call: at most
   * `observation.messageTokens` tokens (else `TooLarge`, nothing observed): send a long history in parts, oldest
   * first. The thread must exist (`createThread`). */
  async observe(
    threadId: string,
    messages?: readonly (ImportedMessage | MessageInput)[],
    options: CallOptions = {},
  ): Promise<MemoryOperation> {
    const body = clean({
      resourceId: this.resource(options.resourceId),
      messages: messages?.length ? importedMessages(messages) : undefined,
    });
    return this.send(
      `POST /threads/${threadId}/memory/observe`,
      (signal) => this.api.POST('/threads/{threadId}/memory/observe', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** Reflect the memory now (below the threshold too); a log just reflected is left alone (`nothing_to_do`). */
  async reflect(threadId: string, options: CallOptions = {}): Promise<MemoryOperation> {
    const body = { resourceId: this.resource(options.resourceId) };
    return this.send(
      `POST /threads/${threadId}/memory/reflect`,
      (signal) => this.api.POST('/threads/{threadId}/memory/reflect', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** Buffer the thread's unbuffered messages now, as one chunk that activates like any other (at the threshold, or on
   * idle). Only where observations are buffered (thread scope with `observation.bufferTokens`): else
   * `BufferingDisabled`. */
  async buffer(threadId: string, options: CallOptions = {}): Promise<MemoryOperation> {
    const body = { resourceId: this.resource(options.resourceId) };
    return this.send(
      `POST /threads/${threadId}/memory/buffer`,
      (signal) => this.api.POST('/threads/{threadId}/memory/buffer', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** A page of the thread's stored messages, oldest first (`direction: 'DESC'`: newest first, page 0 the newest). */
  async messages(
    threadId: string,
    options: CallOptions & { page?: number; perPage?: number; direction?: 'ASC' | 'DESC' } = {},
  ): Promise<MessagesPage> {
    const query = {
      resourceId: this.resource(options.resourceId),
      page: options.page ?? 0,
      perPage: options.perPage ?? 100,
      ...(options.direction !== undefined && options.direction !== 'ASC' ? { direction: options.direction } : {}),
    };
    return this.send(
      `GET /threads/${threadId}/messages`,
      (signal) => this.api.GET('/threads/{threadId}/messages', { params: { path: { threadId }, query }, signal }),
      options,
    );
  }

  /** Every stored message of the thread, oldest first (pages fetched as needed). */
  async *iterMessages(
    threadId: string,
    options: CallOptions & { perPage?: number } = {},
  ): AsyncGenerator<ListedMessage, void, undefined> {
    for (let page = 0; ; page += 1) {
      const result = await this.messages(threadId, { ...options, page, perPage: options.perPage ?? 1000 });
      yield* result.messages;
      if (!result.hasMore) return;
    }
  }

  /** The `recall()` query: a page, a date range, messages by id with neighbours, a vector search. */
  async queryMessages(
    threadId: string,
    options: CallOptions & {
      page?: number;
      /** `null`: every message (default 40). */
      perPage?: number | null;
      dateRange?: DateRange;
      include?: readonly (Include | string)[];
      vectorSearchString?: string;
    } = {},
  ): Promise<MessagesQueryResult> {
    const body = clean({
      resourceId: this.resource(options.resourceId),
      page: options.page,
      dateRange: options.dateRange,
      include: options.include?.map((i) => (typeof i === 'string' ? { id: i } : i)),
      vectorSearchString: options.vectorSearchString,
    });
    if (options.perPage !== undefined) Object.assign(body, { perPage: options.perPage });
    return this.send(
      `POST /threads/${threadId}/messages/query`,
      (signal) => this.api.POST('/threads/{threadId}/messages/query', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** Delete messages by id, or every message of the thread when `messageIds` is left out. */
  async deleteMessages(threadId: string, messageIds?: readonly string[], options: CallOptions = {}): Promise<void> {
    const body = clean({
      resourceId: this.resource(options.resourceId),
      messageIds: messageIds?.length ? [...messageIds] : undefined,
    });
    await this.send(
      `DELETE /threads/${threadId}/messages`,
      (signal) => this.api.DELETE('/threads/{threadId}/messages', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  /** The recall tool: page raw history (`mode: 'messages'`), list threads (`'threads'`), search (`'search'`). */
  async recall(
    threadId: string,
    options: CallOptions & {
      mode?: RecallMode;
      query?: string;
      cursor?: string;
      page?: number;
      limit?: number;
      detail?: 'low' | 'high';
      partIndex?: number;
      before?: string;
      after?: string;
    } = {},
  ): Promise<RecallResult> {
    const { signal, resourceId, ...args } = options;
    const body = clean({ resourceId: this.resource(resourceId), threadId: checkId('threadId', threadId), ...args });
    return this.send('POST /recall', (s) => this.api.POST('/recall', { body, signal: s }), { signal });
  }

  // -- threads --------------------------------------------------------------------------------------------------
  /** Create an empty thread (its id is generated here when not given, so a retry cannot make two). */
  async createThread(
    options: CallOptions & { threadId?: string; title?: string; metadata?: Record<string, unknown> } = {},
  ): Promise<Thread> {
    const generated = options.threadId === undefined;
    const id = checkId('threadId', options.threadId ?? globalThis.crypto.randomUUID());
    const body = clean({
      resourceId: this.resource(options.resourceId),
      id,
      title: options.title,
      metadata: options.metadata,
    });
    try {
      const created = await this.send<{ thread: Thread }>(
        'POST /threads',
        (signal) => this.api.POST('/threads', { body, signal }),
        options,
      );
      return created.thread;
    } catch (error) {
      if (generated && error instanceof ThreadExists && error.attempts > 1) {
        return this.getThread(id, options); // an earlier attempt created it and its answer was lost
      }
      throw error;
    }
  }

  /** A thread. */
  async getThread(threadId: string, options: CallOptions = {}): Promise<Thread> {
    const query = { resourceId: this.resource(options.resourceId) };
    const found = await this.send<{ thread: Thread }>(
      `GET /threads/${threadId}`,
      (signal) => this.api.GET('/threads/{threadId}', { params: { path: { threadId }, query }, signal }),
      options,
    );
    return found.thread;
  }

  /** Change the title (`null` removes it) and/or replace the metadata; what is left out stays. */
  async updateThread(
    threadId: string,
    options: CallOptions & { title?: string | null; metadata?: Record<string, unknown> | null } = {},
  ): Promise<Thread> {
    const body: paths['/threads/{threadId}']['patch']['requestBody']['content']['application/json'] = {
      resourceId: this.resource(options.resourceId),
    };
    if (options.title !== undefined) body.title = options.title;
    if (options.metadata !== undefined) body.metadata = options.metadata;
    const updated = await this.send<{ thread: Thread }>(
      `PATCH /threads/${threadId}`,
      (signal) => this.api.PATCH('/threads/{threadId}', { params: { path: { threadId } }, body, signal }),
      options,
    );
    return updated.thread;
  }

  /** Copy a thread (the newest `messageLimit` messages, or a date range) into a new one. */
  async cloneThread(
    threadId: string,
    options: CallOptions & { newThreadId?: string; title?: string; messageLimit?: number; dateRange?: DateRange } = {},
  ): Promise<CloneResult> {
    const generated = options.newThreadId === undefined;
    const newThreadId = checkId('newThreadId', options.newThreadId ?? globalThis.crypto.randomUUID());
    const body = clean({
      resourceId: this.resource(options.resourceId),
      newThreadId,
      title: options.title,
      messageLimit: options.messageLimit,
      dateRange: options.dateRange,
    });
    try {
      return await this.send<CloneResult>(
        `POST /threads/${threadId}/clone`,
        (signal) => this.api.POST('/threads/{threadId}/clone', { params: { path: { threadId } }, body, signal }),
        options,
      );
    } catch (error) {
      if (generated && error instanceof ThreadExists && error.attempts > 1) {
        // An earlier attempt cloned it and its answer was lost: read the clone back.
        const thread = await this.getThread(newThreadId, options);
        const clonedMessages: Message[] = [];
        for await (const message of this.iterMessages(newThreadId, options)) {
          const { omStatus: _, ...stored } = message;
          clonedMessages.push(stored);
        }
        return { thread, clonedMessages };
      }
      throw error;
    }
  }

  /** Erase a thread: messages, observations, vectors and attachments. */
  async deleteThread(threadId: string, options: CallOptions = {}): Promise<void> {
    const query = { resourceId: this.resource(options.resourceId) };
    await this.send(
      `DELETE /threads/${threadId}`,
      (signal) => this.api.DELETE('/threads/{threadId}', { params: { path: { threadId }, query }, signal }),
      { ...options, doneIfMissingOnRetry: true },
    );
  }

  /** A page of the resource's threads (filter with `metadata: {key: value}`). */
  async listThreads(
    options: CallOptions & {
      page?: number;
      perPage?: number;
      orderBy?: 'createdAt' | 'updatedAt';
      direction?: 'ASC' | 'DESC';
      metadata?: Record<string, string>;
    } = {},
  ): Promise<ThreadsPage> {
    const resourceId = this.resource(options.resourceId);
    const query: Record<string, string | number> = {
      page: options.page ?? 0,
      perPage: options.perPage ?? 100,
      orderBy: options.orderBy ?? 'createdAt',
      direction: options.direction ?? 'DESC',
    };
    for (const [key, value] of Object.entries(options.metadata ?? {})) query[`metadata.${key}`] = value;
    return this.send(
      `GET /resources/${resourceId}/threads`,
      (signal) =>
        this.api.GET('/resources/{resourceId}/threads', {
          params: { path: { resourceId }, query: query as { page?: number } },
          signal,
        }),
      options,
    );
  }

  /** Erase everything stored for the resource. */
  async deleteResource(options: CallOptions = {}): Promise<void> {
    const resourceId = this.resource(options.resourceId);
    await this.send(
      `DELETE /resources/${resourceId}`,
      (signal) => this.api.DELETE('/resources/{resourceId}', { params: { path: { resourceId } }, signal }),
      options,
    );
  }

  // -- working memory -------------------------------------------------------------------------------------------
  /** The working memory a thread sees (with `threadId`), or the resource's (resource scope). */
  async getWorkingMemory(options: CallOptions & { threadId?: string } = {}): Promise<WorkingMemory> {
    const resourceId = this.resource(options.resourceId);
    const { threadId } = options;
    if (threadId === undefined) {
      return this.send(
        `GET /resources/${resourceId}/working-memory`,
        (signal) =>
          this.api.GET('/resources/{resourceId}/working-memory', { params: { path: { resourceId } }, signal }),
        options,
      );
    }
    return this.send(
      `GET /threads/${threadId}/working-memory`,
      (signal) =>
        this.api.GET('/threads/{threadId}/working-memory', {
          params: { path: { threadId }, query: { resourceId } },
          signal,
        }),
      options,
    );
  }

  /** Markdown replaces; a JSON object is merged (null deletes a field). */
  async updateWorkingMemory(
    value: string | Record<string, unknown>,
    options: CallOptions & { threadId?: string } = {},
  ): Promise<WorkingMemory> {
    const resourceId = this.resource(options.resourceId);
    const body = { workingMemory: value, resourceId };
    const { threadId } = options;
    if (threadId === undefined) {
      return this.send(
        `PUT /resources/${resourceId}/working-memory`,
        (signal) =>
          this.api.PUT('/resources/{resourceId}/working-memory', { params: { path: { resourceId } }, body, signal }),
        options,
      );
    }
    return this.send(
      `PUT /threads/${threadId}/working-memory`,
      (signal) => this.api.PUT('/threads/{threadId}/working-memory', { params: { path: { threadId } }, body, signal }),
      options,
    );
  }

  // -- attachments and meta -------------------------------------------------------------------------------------
  /** A presigned S3 upload URL (use `uploadAttachment` to have the upload done too). */
  async createAttachment(
    threadId: string,
    file: { filename: string; mediaType: string; size: number },
    options: CallOptions = {},
  ): Promise<AttachmentUpload> {
    const body = {
      resourceId: this.resource(options.resourceId),
      threadId: checkId('threadId', threadId),
      filename: file.filename,
      mediaType: file.mediaType,
      size: file.size,
    };
    return this.send('POST /attachments', (signal) => this.api.POST('/attachments', { body, signal }), options);
  }

  /** Upload a file for the thread and return the part to put in a message (an `s3://` URL). */
  async uploadAttachment(
    threadId: string,
    data: Uint8Array | ArrayBuffer | Blob,
    file: { filename: string; mediaType?: string },
    options: CallOptions = {},
  ): Promise<ImagePart | FilePart> {
    const bytes = data instanceof Blob ? new Uint8Array(await data.arrayBuffer()) : new Uint8Array(data);
    const mediaType = file.mediaType || (data instanceof Blob && data.type) || 'application/octet-stream';
    const upload = await this.createAttachment(
      threadId,
      { filename: file.filename, mediaType, size: bytes.byteLength },
      options,
    );
    await this.putUpload(upload.uploadUrl, bytes, mediaType, options.signal);
    const part = { url: upload.url, mediaType, filename: file.filename, size: bytes.byteLength };
    return mediaType.startsWith('image/') ? { type: 'image', ...part } : { type: 'file', ...part };
  }

  /** PUT to a presigned URL (its own signature: the API's credentials are not sent), retrying failures and 5xx. */
  private async putUpload(url: string, bytes: Uint8Array, mediaType: string, signal?: AbortSignal): Promise<void> {
    const headers: Record<string, string> = { 'content-type': mediaType };
    const signed = new URL(url).searchParams.get('X-Amz-SignedHeaders')?.split(';') ?? [];
    if (signed.includes('x-amz-server-side-encryption')) headers['x-amz-server-side-encryption'] = 'AES256';
    for (let n = 1; ; n += 1) {
      signal?.throwIfAborted();
      let response: Response;
      try {
        const request = new Request(url, {
          method: 'PUT',
          body: bytes as BodyInit,
          headers,
          signal: withTimeout(signal, UPLOAD_TIMEOUT_MS),
        });
        response = await this.fetchImpl(request);
        await response.arrayBuffer().catch(() => undefined);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (n > this.retries.maxRetries) {
          throw new ConnectionFailed(`the attachment upload failed after ${n} attempt(s): ${describe(error)}`, {
            cause: error,
            attempts: n,
          });
        }
        await this.wait(retryDelay(this.retries, n - 1, undefined, this.random), signal);
        continue;
      }
      if (response.ok) return;
      if (n > this.retries.maxRetries || response.status < 500) {
        throw new APIError(`the attachment upload was refused (${response.status})`, {
          status: response.status,
          code: 'upload_failed',
          attempts: n,
        });
      }
      await this.wait(retryDelay(this.retries, n - 1, undefined, this.random), signal);
    }
  }

  /** `GET /health`. */
  async health(options: Pick<CallOptions, 'signal'> = {}): Promise<Health> {
    return this.send('GET /health', (signal) => this.api.GET('/health', { signal }), options);
  }

  /** The served OpenAPI document. */
  async openapi(options: Pick<CallOptions, 'signal'> = {}): Promise<Record<string, unknown>> {
    return this.send('GET /openapi.json', (signal) => this.api.GET('/openapi.json', { signal }), options);
  }
}

/** Imported messages as the API takes them (each with its client-side id); a message without `createdAt` is refused
 * before anything is sent, since its date is what dates the observations. */
function importedMessages(messages: readonly (ImportedMessage | MessageInput)[]): ImportedMessage[] {
  const imported = messages.map((m) => asMessage(m));
  const undated = imported.filter((m) => !m.createdAt).map((m) => m.id);
  if (undated.length) {
    throw new TypeError(
      `imported messages need createdAt (when they were said): ${undated.slice(0, 5).join(', ')} have none`,
    );
  }
  return imported.map((m) => ({ ...m, createdAt: m.createdAt as string }));
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = error.cause instanceof Error ? ` (${error.cause.message})` : '';
  return `${error.message}${cause}`;
}

export { newMessageId };
