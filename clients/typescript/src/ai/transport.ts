/**
 * A chat transport for the AI SDK's `useChat` (and any `Chat`): the AI SDK's `DefaultChatTransport`, pointed at the
 * streaming chat route, sending only the newest message (memory holds the rest), through the client's credentials,
 * retries and typed errors.
 *
 * ```tsx
 * const client = new MemoryClient({ apiUrl, resourceId: user.id, auth: bearerAuth(() => session.idToken()) });
 * const { messages, sendMessage } = useChat<MemoryUIMessage>({ id: threadId, transport: memoryChatTransport({ client }) });
 * // message.parts carry text and the data-om-* parts (observing..., status) as they arrive
 * ```
 *
 * The chat's `id` is the thread id unless `threadId` is given. Resuming a stream (`resume: true`) is not supported:
 * the service keeps no stream to reconnect to; a reply already stored is answered again for the same message id.
 */
import { DefaultChatTransport, type UIMessage } from 'ai';
import { type MemoryClient, encodeRfc3986 } from '../client.js';
import { checkId } from '../messages.js';
import type { OmDataTypes } from '../parts.js';
import type { MessageInput, Part } from '../types.js';

/** A UI message whose data parts are the `data-om-*` parts. */
export type MemoryUIMessage = UIMessage<unknown, OmDataTypes>;

export interface MemoryChatTransportOptions {
  client: MemoryClient;
  /** The thread (default: the chat's `id`). */
  threadId?: string;
  /** Whose memory (default: the client's `resourceId`). */
  resourceId?: string;
  /** Show working memory without letting the Actor change it. */
  readOnly?: boolean;
}

/** A UI message as the API's message: its text and files (`data:` URLs inline), under the UI message's id. */
export function fromUIMessage(message: UIMessage): MessageInput & { id: string } {
  const parts: Part[] = [];
  for (const part of message.parts) {
    if (part.type === 'text') parts.push({ type: 'text', text: part.text });
    else if (part.type === 'file') {
      const kind = part.mediaType.startsWith('image/') ? 'image' : 'file';
      const named = part.filename ? { filename: part.filename } : {};
      const inline = /^data:([^;,]*)(?:;[^,]*)?,(.*)$/s.exec(part.url);
      parts.push(
        inline
          ? { type: kind, mediaType: inline[1] || part.mediaType, data: inline[2] ?? '', ...named }
          : { type: kind, mediaType: part.mediaType, url: part.url, ...named },
      );
    }
  }
  return { id: checkId('message id', message.id), role: message.role, parts };
}

/** `DefaultChatTransport` for the streaming chat route. */
export function memoryChatTransport<UI_MESSAGE extends UIMessage = MemoryUIMessage>(
  options: MemoryChatTransportOptions,
): DefaultChatTransport<UI_MESSAGE> {
  const { client } = options;
  return new DefaultChatTransport<UI_MESSAGE>({
    api: `${client.apiUrl}/threads`,
    prepareSendMessagesRequest: ({ id, messages, headers }) => {
      const threadId = checkId('threadId', options.threadId ?? id);
      const resourceId = checkId('resourceId', options.resourceId ?? client.resourceId);
      const newest = messages.at(-1);
      if (!newest || newest.role !== 'user') {
        throw new TypeError('the chat has no new user message to send (memory holds the conversation)');
      }
      const body = { resourceId, message: fromUIMessage(newest), ...(options.readOnly ? { readOnly: true } : {}) };
      return {
        api: `${client.apiUrl}/threads/${encodeRfc3986(threadId)}/chat`,
        headers: { ...Object.fromEntries(new Headers(headers)), accept: 'text/event-stream' },
        body,
      };
    },
    fetch: (input, init) => client.streamRequest(new Request(input, init), init?.signal ?? undefined),
  });
}
