/**
 * A chat transport for the AI SDK's `useChat` (and any `Chat`): the AI SDK's `DefaultChatTransport`, pointed at the
 * streaming chat route, sending only the newest user message (memory holds the rest), through the client's
 * credentials, retries and typed errors.
 *
 * ```tsx
 * const client = new MemoryClient({ apiUrl, resourceId: user.id, auth: bearerAuth(() => session.idToken()) });
 * const { messages, sendMessage } = useChat<MemoryUIMessage>({ id: threadId, transport: memoryChatTransport({ client }) });
 * // message.parts carry text and the data-om-* parts (observing..., status) as they arrive
 * ```
 *
 * The request body is the AI SDK's own (`{id, messages, trigger, messageId}`, `messages` holding the newest user
 * message alone) plus `resourceId`: the server takes that message's text and files and stores it under its id. The
 * chat's `id` is the thread id unless `threadId` is given. A request whose answer was lost is sent again: a message is
 * answered once, so the repeat streams the stored reply. Resuming a stream (`resume: true`) is not supported: the
 * service keeps no stream to reconnect to.
 */
import { DefaultChatTransport, type UIMessage } from 'ai';
import { type MemoryClient, encodeRfc3986 } from '../client.js';
import { checkId } from '../messages.js';
import type { OmDataTypes } from '../parts.js';

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

/** `DefaultChatTransport` for the streaming chat route. */
export function memoryChatTransport<UI_MESSAGE extends UIMessage = MemoryUIMessage>(
  options: MemoryChatTransportOptions,
): DefaultChatTransport<UI_MESSAGE> {
  const { client } = options;
  return new DefaultChatTransport<UI_MESSAGE>({
    api: `${client.apiUrl}/threads`,
    prepareSendMessagesRequest: ({ id, messages, body, headers, trigger, messageId }) => {
      const threadId = checkId('threadId', options.threadId ?? id);
      const resourceId = checkId('resourceId', options.resourceId ?? client.resourceId);
      const newest = messages.filter((message) => message.role === 'user').at(-1);
      if (!newest) throw new TypeError('the chat has no user message to send (memory holds the conversation)');
      checkId('message id', newest.id);
      return {
        api: `${client.apiUrl}/threads/${encodeRfc3986(threadId)}/chat`,
        headers: { ...Object.fromEntries(new Headers(headers)), accept: 'text/event-stream' },
        body: {
          ...body,
          id,
          trigger,
          ...(messageId === undefined ? {} : { messageId }),
          messages: [newest],
          resourceId,
          ...(options.readOnly ? { readOnly: true } : {}),
        },
      };
    },
    fetch: (input, init) => client.streamRequest(new Request(input, init), init?.signal ?? undefined),
  });
}
