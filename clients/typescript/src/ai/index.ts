/**
 * om-client/ai: observational memory for the AI SDK (versions 5, 6 and 7).
 *
 * - `observationalMemory(...)`: a `LanguageModelMiddleware` for `wrapLanguageModel` (generateText and streamText);
 * - `recallTool` / `workingMemoryTool` / `memoryTools`: the memory tools as AI SDK `tool()`s;
 * - `memoryChatTransport(...)`: a `useChat` transport for the streaming chat route.
 */
export {
  type MemoryBinding,
  type ObservationalMemory,
  type ObservationalMemoryOptions,
  observationalMemory,
  type OmProviderMetadata,
  type OmProviderOptions,
  type PartsEvent,
} from './memory.js';
export { fromModelMessage, fromModelOutput, type ModelSpec, specOf, toModelPrompt } from './convert.js';
export { type MemoryToolOptions, type MemoryTools, memoryTools, recallTool, workingMemoryTool } from './tools.js';
export { type MemoryChatTransportOptions, memoryChatTransport, type MemoryUIMessage } from './transport.js';
