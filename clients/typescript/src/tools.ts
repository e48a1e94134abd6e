/**
 * The tools memory offers a model: `recall` (`POST /recall`) and `updateWorkingMemory` (`PUT .../working-memory`),
 * each with one declaration (the Python client's, word for word) and one way to run it.
 *
 * The memory system message (`step.system`) already tells the model when and how to use them. Recall's `threadId`
 * argument names the thread to read (the current one when left out).
 */
import type { MemoryClient } from './client.js';
import { APIError, ConnectionFailed, InvalidRequest } from './errors.js';
import type { RecallMode, RecallResult } from './types.js';

export const RECALL_NAME = 'recall';
export const RECALL_DESCRIPTION =
  'Browse raw conversation history behind your observations. mode "messages" (default) pages through messages from ' +
  'a cursor (one end of an observation section\'s range such as `#12` from "## Messages #12–#19", or a message id), ' +
  'forward with page 1, 2... or backward with page -1, -2...; detail "high" with partIndex shows one part in full. ' +
  'mode "threads" lists the user\'s threads; threadId reads another thread. mode "search" finds messages by meaning ' +
  '(when the service has vectors). mode "observations" pages through archived observations, newest first.';

export const RECALL_PARAMETERS = {
  type: 'object',
  properties: {
    mode: { type: 'string', enum: ['messages', 'threads', 'search', 'observations'], description: 'What to retrieve.' },
    query: { type: 'string', description: 'Search text (mode "search").' },
    cursor: { type: 'string', description: 'A message id to page from.' },
    threadId: { type: 'string', description: 'The thread to read (default: this conversation).' },
    page: { type: 'integer', description: 'Messages: +n forward, -n backward from the cursor. Threads: from 0.' },
    limit: { type: 'integer', description: 'Items per page (default 20).' },
    detail: { type: 'string', enum: ['low', 'high'], description: '"low" (default) or "high".' },
    partIndex: { type: 'integer', description: 'One part of the cursor message, in full.' },
    before: { type: 'string', description: 'Threads created before this ISO 8601 date (mode "threads").' },
    after: { type: 'string', description: 'Threads created after this ISO 8601 date (mode "threads").' },
  },
} as const;

/** The recall tool's arguments, as a model sends them. */
export interface RecallArgs {
  mode?: RecallMode;
  query?: string;
  cursor?: string;
  threadId?: string;
  page?: number;
  limit?: number;
  detail?: 'low' | 'high';
  partIndex?: number;
  before?: string;
  after?: string;
}

export const WORKING_MEMORY_NAME = 'updateWorkingMemory';
export const WORKING_MEMORY_DESCRIPTION =
  'Update the working memory: Markdown replaces it (send the complete text, following the template), a JSON object ' +
  'is merged into it (null deletes a field). Keep everything that is still true.';

export const WORKING_MEMORY_PARAMETERS = {
  type: 'object',
  properties: {
    memory: {
      anyOf: [{ type: 'string' }, { type: 'object' }],
      description: 'The updated working memory: Markdown text, or an object of the fields to change.',
    },
  },
  required: ['memory'],
} as const;

/** The working-memory tool's arguments. */
export interface WorkingMemoryArgs {
  memory: string | Record<string, unknown>;
}

const RECALL_KEYS = ['mode', 'query', 'cursor', 'page', 'limit', 'detail', 'partIndex', 'before', 'after'] as const;

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** What a failed tool call tells the model: the service's message says what to change. */
function toolError(error: unknown): { error: string } {
  if (error instanceof APIError) return { error: error.message };
  if (error instanceof ConnectionFailed) return { error: `the memory service is unreachable: ${error.message}` };
  throw error; // an abort, or a bug: not the model's to read
}

/** One `recall` call from a model: the tool's returns, or `{error}` with the service's message. */
export async function runRecall(
  client: MemoryClient,
  binding: { threadId: string; resourceId: string },
  args: unknown,
  signal?: AbortSignal,
): Promise<RecallResult | { error: string }> {
  if (!isRecord(args)) return { error: 'recall arguments must be a JSON object' };
  const options: Record<string, unknown> = {};
  for (const key of RECALL_KEYS) if (args[key] !== undefined && args[key] !== null) options[key] = args[key];
  const threadId = typeof args.threadId === 'string' && args.threadId ? args.threadId : binding.threadId;
  try {
    return await client.recall(threadId, { ...options, resourceId: binding.resourceId, signal });
  } catch (error) {
    return toolError(error);
  }
}

/** The object a model sent as JSON text (some send objects that way), else undefined. */
function jsonObjectText(value: unknown): Record<string, unknown> | undefined {
  if (typeof value !== 'string' || !value.trimStart().startsWith('{')) return undefined;
  try {
    const parsed: unknown = JSON.parse(value);
    return isRecord(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** One `updateWorkingMemory` call from a model: `{success: true}`, or `{success: false, error}`. */
export async function runUpdateWorkingMemory(
  client: MemoryClient,
  binding: { threadId: string; resourceId: string },
  args: unknown,
  signal?: AbortSignal,
): Promise<{ success: true } | { success: false; error: string }> {
  const value = isRecord(args) ? args.memory : undefined;
  if (typeof value !== 'string' && !isRecord(value)) {
    return { success: false, error: 'updateWorkingMemory needs one argument, `memory`: Markdown text or an object' };
  }
  const options = { threadId: binding.threadId, resourceId: binding.resourceId, signal };
  try {
    try {
      await client.updateWorkingMemory(value, options);
    } catch (error) {
      const asObject = error instanceof InvalidRequest ? jsonObjectText(value) : undefined;
      if (!asObject) throw error;
      await client.updateWorkingMemory(asObject, options); // JSON-format memory sent as text by the model
    }
  } catch (error) {
    return { success: false, error: toolError(error).error };
  }
  return { success: true };
}
