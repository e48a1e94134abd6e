/**
 * om-client: a typed client for the Observational Memory API.
 *
 * `MemoryClient` covers every route; `om-client/ai` adds the AI SDK memory middleware, the recall tool and a chat
 * transport for `useChat`; `om-client/iam` signs requests with SigV4 (Node).
 */
export { type Auth, bearerAuth, noAuth, type TokenSource } from './auth.js';
export { type ChatStreamChunk, readChatStream, UI_MESSAGE_STREAM_VERSION } from './chat-stream.js';
export { type CallOptions, encodeRfc3986, MemoryClient, type MemoryClientOptions, VERSION } from './client.js';
export * from './errors.js';
export { asMessage, assistantMessage, checkId, newMessageId, textOf, userMessage } from './messages.js';
export * from './parts.js';
export { DEFAULT_RETRY_POLICY, type RetryPolicy, retryDelay, retryPolicy } from './retry.js';
export {
  RECALL_DESCRIPTION,
  RECALL_PARAMETERS,
  type RecallArgs,
  WORKING_MEMORY_DESCRIPTION,
  WORKING_MEMORY_PARAMETERS,
} from './tools.js';
export type * from './types.js';
export type { components, paths } from './generated/openapi.js';
