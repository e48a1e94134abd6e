/**
 * The memory tools as AI SDK tools: `recall` (browse and search raw history behind the observations, `POST /recall`;
 * needs `retrieval` in the server's configuration) and `updateWorkingMemory` (needs `workingMemory`).
 *
 * ```ts
 * const result = await generateText({ model, prompt, tools: { recall: recallTool({ client, threadId, resourceId }) } });
 * ```
 *
 * A failed call answers `{error}` (or `{success: false, error}`) with the service's message, so the model can
 * correct its arguments; an aborted call rejects.
 */
import { jsonSchema, type Tool, tool } from 'ai';
import type { MemoryClient } from '../client.js';
import {
  RECALL_DESCRIPTION,
  RECALL_PARAMETERS,
  type RecallArgs,
  runRecall,
  runUpdateWorkingMemory,
  WORKING_MEMORY_DESCRIPTION,
  WORKING_MEMORY_PARAMETERS,
  type WorkingMemoryArgs,
} from '../tools.js';
import type { RecallResult } from '../types.js';

export interface MemoryToolOptions {
  client: MemoryClient;
  /** The conversation the tools read and write (recall may name another thread of the resource). */
  threadId: string;
  /** Whose memory (default: the client's `resourceId`). */
  resourceId?: string;
}

export type RecallTool = Tool<RecallArgs, RecallResult | { error: string }>;
export type WorkingMemoryTool = Tool<WorkingMemoryArgs, { success: true } | { success: false; error: string }>;
/** A type, not an interface, so it fits where the AI SDK takes a `ToolSet`. */
export type MemoryTools = {
  recall: RecallTool;
  updateWorkingMemory: WorkingMemoryTool;
};

function bindingOf(options: MemoryToolOptions): { threadId: string; resourceId: string } {
  const resourceId = options.resourceId ?? options.client.resourceId;
  if (!resourceId) throw new TypeError('the memory tools need a resourceId (or a client made with one)');
  return { threadId: options.threadId, resourceId };
}

/** `recall` as an AI SDK tool. */
export function recallTool(options: MemoryToolOptions): RecallTool {
  const binding = bindingOf(options);
  return tool({
    description: RECALL_DESCRIPTION,
    inputSchema: jsonSchema<RecallArgs>(RECALL_PARAMETERS as never),
    execute: (args, { abortSignal }) => runRecall(options.client, binding, args, abortSignal),
  });
}

/** `updateWorkingMemory` as an AI SDK tool. */
export function workingMemoryTool(options: MemoryToolOptions): WorkingMemoryTool {
  const binding = bindingOf(options);
  return tool({
    description: WORKING_MEMORY_DESCRIPTION,
    inputSchema: jsonSchema<WorkingMemoryArgs>(WORKING_MEMORY_PARAMETERS as never),
    execute: (args, { abortSignal }) => runUpdateWorkingMemory(options.client, binding, args, abortSignal),
  });
}

/** Both tools, keyed by the names the memory system message uses. */
export function memoryTools(options: MemoryToolOptions): MemoryTools {
  return { recall: recallTool(options), updateWorkingMemory: workingMemoryTool(options) };
}
