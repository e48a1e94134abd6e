/**
 * The streamed chat turn: the AI SDK's UI message stream, protocol v1 (`x-vercel-ai-ui-message-stream: v1`), read as
 * an async iterable of typed chunks.
 *
 * The wire is server-sent events, one JSON chunk per `data:` line, ending with `data: [DONE]`. A turn reads
 * `start` (the reply's message id), `start-step`, `text-start` / `text-delta` / `text-end`, each `data-om-*` part at
 * the moment it happens, `finish-step`, `finish`; or an `error` chunk when the turn fails after the stream began.
 * The chunk types are the AI SDK's (`UIMessageChunk`), declared here so the client needs no `ai` dependency.
 */
import { EventSourceParserStream } from 'eventsource-parser/stream';
import { APIError } from './errors.js';
import type { OmPart } from './parts.js';

type ProviderMetadata = Record<string, Record<string, unknown>>;

/** One chunk of the UI message stream (protocol v1). `data-om-*` chunks are `OmPart`s. */
export type ChatStreamChunk =
  | { type: 'start'; messageId?: string; messageMetadata?: unknown }
  | { type: 'start-step' }
  | { type: 'finish-step' }
  | { type: 'text-start'; id: string; providerMetadata?: ProviderMetadata }
  | { type: 'text-delta'; id: string; delta: string; providerMetadata?: ProviderMetadata }
  | { type: 'text-end'; id: string; providerMetadata?: ProviderMetadata }
  | { type: 'reasoning-start'; id: string; providerMetadata?: ProviderMetadata }
  | { type: 'reasoning-delta'; id: string; delta: string; providerMetadata?: ProviderMetadata }
  | { type: 'reasoning-end'; id: string; providerMetadata?: ProviderMetadata }
  | { type: 'tool-input-start'; toolCallId: string; toolName: string; providerExecuted?: boolean; dynamic?: boolean }
  | { type: 'tool-input-delta'; toolCallId: string; inputTextDelta: string }
  | {
      type: 'tool-input-available';
      toolCallId: string;
      toolName: string;
      input: unknown;
      providerExecuted?: boolean;
      dynamic?: boolean;
    }
  | { type: 'tool-input-error'; toolCallId: string; toolName: string; input: unknown; errorText: string }
  | { type: 'tool-output-available'; toolCallId: string; output: unknown; providerExecuted?: boolean }
  | { type: 'tool-output-error'; toolCallId: string; errorText: string; providerExecuted?: boolean }
  | { type: 'source-url'; sourceId: string; url: string; title?: string }
  | { type: 'source-document'; sourceId: string; mediaType: string; title: string; filename?: string }
  | { type: 'file'; url: string; mediaType: string }
  | OmPart
  | { type: 'finish'; finishReason?: string; messageMetadata?: unknown }
  | { type: 'error'; errorText: string; /** The API's error code (e.g. `model_unavailable`). */ code?: string }
  | { type: 'abort' }
  | { type: 'message-metadata'; messageMetadata: unknown };

/** The protocol version this reader speaks. */
export const UI_MESSAGE_STREAM_VERSION = 'v1';

/** Let go of a body that will not be read (not awaited: the cancel of a tee'd body waits for its twin). */
export function discard(response: Response): void {
  void response.body?.cancel().catch(() => undefined);
}

function isChunk(value: unknown): value is ChatStreamChunk {
  return typeof value === 'object' && value !== null && typeof (value as { type?: unknown }).type === 'string';
}

/**
 * The chunks of a UI message stream response, in order, until `[DONE]` (or the end of the body). A response that is
 * not an event stream (a server that answers chat only as JSON) is refused with an `APIError` that says so; a body
 * line that is not a chunk is an `APIError` too (`invalid_stream`). Aborting `signal` cancels the body.
 */
export async function* readChatStream(
  response: Response,
  signal?: AbortSignal,
): AsyncGenerator<ChatStreamChunk, void, undefined> {
  const kind = response.headers.get('content-type') ?? '';
  if (!kind.startsWith('text/event-stream') || !response.body) {
    discard(response);
    throw new APIError(
      `the server answered ${kind || 'no content type'} instead of an event stream: it does not stream chat ` +
        '(use chat(), or a server version that streams)',
      { status: response.status, code: 'stream_unsupported' },
    );
  }
  const version = response.headers.get('x-vercel-ai-ui-message-stream');
  if (version && version !== UI_MESSAGE_STREAM_VERSION) {
    discard(response);
    throw new APIError(
      `the server streams UI message protocol ${version}; this client reads ${UI_MESSAGE_STREAM_VERSION}`,
      {
        status: response.status,
        code: 'stream_unsupported',
      },
    );
  }
  const events = response.body
    .pipeThrough(new TextDecoderStream() as unknown as TransformStream<Uint8Array, string>)
    .pipeThrough(new EventSourceParserStream());
  const reader = events.getReader();
  const cancel = () => void reader.cancel(signal?.reason).catch(() => undefined);
  signal?.addEventListener('abort', cancel, { once: true });
  try {
    while (true) {
      signal?.throwIfAborted();
      const { value, done } = await reader.read();
      signal?.throwIfAborted(); // an abort while waiting ends the read as `done`: it is still an abort
      if (done) break;
      if (value.data === '[DONE]') break;
      let chunk: unknown;
      try {
        chunk = JSON.parse(value.data);
      } catch {
        throw new APIError(`the stream sent a line that is not JSON: ${value.data.slice(0, 200)}`, {
          status: response.status,
          code: 'invalid_stream',
        });
      }
      if (!isChunk(chunk)) {
        throw new APIError(`the stream sent a chunk without a type: ${value.data.slice(0, 200)}`, {
          status: response.status,
          code: 'invalid_stream',
        });
      }
      yield chunk;
    }
  } finally {
    signal?.removeEventListener('abort', cancel);
    void reader.cancel().catch(() => undefined); // not awaited: a tee'd body's cancel waits for its twin
  }
}
