/**
 * Messages between the AI SDK's language-model prompt (what a middleware sees) and the API.
 *
 * Into the API: the new input of a step (user text and files, tool results) and a call's output (text, reasoning,
 * tool calls, files). Out of it: what memory shows the model (the unobserved messages), with tool calls and results
 * kept in pairs (a provider refuses a call without its result) and reasoning left for the Observer (providers want
 * their own signed reasoning back, not ours).
 *
 * The AI SDK speaks one language-model specification per major version: v2 (AI SDK 5), v3 (6), v4 (7). Messages,
 * parts and tool outputs are the same in all three except files: v4 tags a file's data (`{type: 'data', data}`,
 * `{type: 'url', url}`, ...) where v2 and v3 give the bytes, base64 text or URL itself. Files are read in either
 * shape, and written in the shape of the `spec` the middleware was called with. The types are v4's (the AI SDK this
 * package is built with).
 */
import type { LanguageModelMiddleware } from 'ai';
import { newMessageId } from '../messages.js';
import type { Message, MessageInput, Part } from '../types.js';

type ModelCallOptions = Parameters<NonNullable<LanguageModelMiddleware['transformParams']>>[0]['params'];
export type ModelPrompt = ModelCallOptions['prompt'];
export type ModelMessage = ModelPrompt[number];
type GenerateResult = Awaited<ReturnType<NonNullable<LanguageModelMiddleware['wrapGenerate']>>>;
export type ModelContent = GenerateResult['content'][number];
type UserContent = Extract<ModelMessage, { role: 'user' }>['content'][number];
type AssistantContent = Extract<ModelMessage, { role: 'assistant' }>['content'][number];
type ToolResultContent = Extract<Extract<ModelMessage, { role: 'tool' }>['content'][number], { type: 'tool-result' }>;
type ToolOutput = ToolResultContent['output'];
type FileData = Extract<UserContent, { type: 'file' }>['data'];

/** The language-model specification of the AI SDK calling the middleware: 'v2' (AI SDK 5), 'v3' (6), 'v4' (7). */
export type ModelSpec = 'v2' | 'v3' | 'v4';

/** The specification a model speaks (the AI SDK 7 hands a middleware v4 models only; 5 and 6 their own). */
export function specOf(model: { specificationVersion?: unknown } | undefined): ModelSpec {
  const version = model?.specificationVersion;
  return version === 'v2' || version === 'v3' ? version : 'v4';
}

/** Base64 of bytes (Node and browsers). */
export function toBase64(bytes: Uint8Array): string {
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

/** `{mediaType, data}` of a `data:` URL, else undefined. */
function splitDataUrl(url: string): { mediaType: string | undefined; data: string } | undefined {
  const match = /^data:([^;,]*)(?:;[^,]*)?,(.*)$/s.exec(url);
  return match ? { mediaType: match[1] || undefined, data: match[2] ?? '' } : undefined;
}

/** A file's data in any specification's shape: bytes, base64 text or a URL (v2, v3), or tagged (v4). */
type AnyFileData =
  | Uint8Array
  | string
  | URL
  | { type: 'data'; data: Uint8Array | string }
  | { type: 'url'; url: URL | string }
  | { type: 'reference'; reference: Record<string, string> }
  | { type: 'text'; text: string };

/** A file of a prompt or an output as an image or file part (bytes as base64, URLs kept, `data:` URLs split; a text
 * document as base64 of its UTF-8; a provider's file reference, which memory cannot read, as a note saying so). */
function filePart(data: AnyFileData, mediaType: string, filename?: string): Part {
  const kind = mediaType.startsWith('image/') ? 'image' : 'file';
  const named = filename ? { filename } : {};
  let value: Uint8Array | string | URL;
  if (data instanceof Uint8Array || typeof data === 'string' || data instanceof URL) value = data;
  else if (data.type === 'data') value = data.data;
  else if (data.type === 'url') value = typeof data.url === 'string' ? new URL(data.url) : data.url;
  else if (data.type === 'text') value = toBase64(new TextEncoder().encode(data.text));
  else return { type: 'text', text: `[${kind}${filename ? ` ${filename}` : ''}: a provider's file reference]` };
  if (value instanceof Uint8Array) return { type: kind, mediaType, data: toBase64(value), ...named };
  if (!(value instanceof URL)) return { type: kind, mediaType, data: value, ...named };
  const inline = splitDataUrl(value.href);
  if (inline) return { type: kind, mediaType: inline.mediaType ?? mediaType, data: inline.data, ...named };
  return { type: kind, mediaType, url: value.href, ...named };
}

/** A tool result's output as the stored `result` (and whether it is an error). */
function resultOf(output: ToolOutput): { result: unknown; isError: boolean } {
  switch (output.type) {
    case 'text':
    case 'json':
    case 'content':
      return { result: output.value, isError: false };
    case 'error-text':
    case 'error-json':
      return { result: output.value, isError: true };
    case 'execution-denied':
      return { result: output.reason ?? 'the tool call was denied', isError: true };
    default:
      return { result: (output as { value?: unknown }).value ?? null, isError: false };
  }
}

function toolArgs(input: unknown): unknown {
  if (typeof input !== 'string') return input ?? {};
  try {
    return input.trim() ? JSON.parse(input) : {};
  } catch {
    return input; // kept as the model wrote it
  }
}

function contentPart(part: UserContent | AssistantContent | ToolResultContent): Part | undefined {
  switch (part.type) {
    case 'text':
      return { type: 'text', text: part.text };
    case 'reasoning':
      return { type: 'reasoning', text: part.text };
    case 'file':
      return filePart(part.data as AnyFileData, part.mediaType, part.filename);
    case 'tool-call':
      return { type: 'tool-call', toolCallId: part.toolCallId, toolName: part.toolName, args: toolArgs(part.input) };
    case 'tool-result': {
      const { result, isError } = resultOf(part.output);
      return {
        type: 'tool-result',
        toolCallId: part.toolCallId,
        toolName: part.toolName,
        result,
        ...(isError ? { isError } : {}),
      };
    }
    default:
      return undefined;
  }
}

/** A prompt message as a message for the API (system messages stay with the app: undefined). */
export function fromModelMessage(message: ModelMessage, id: string): (MessageInput & { id: string }) | undefined {
  if (message.role === 'system') return undefined;
  const parts = (message.content as (UserContent | AssistantContent | ToolResultContent)[])
    .map(contentPart)
    .filter((p): p is Part => p !== undefined);
  return parts.length ? { id, role: message.role, parts } : undefined;
}

/** What a model call produced, as the messages to store: one assistant message (empty output: none). */
export function fromModelOutput(content: readonly ModelContent[]): (MessageInput & { id: string })[] {
  const parts: Part[] = [];
  for (const item of content) {
    switch (item.type) {
      case 'text':
        if (item.text) parts.push({ type: 'text', text: item.text });
        break;
      case 'reasoning':
        if (item.text) parts.push({ type: 'reasoning', text: item.text });
        break;
      case 'tool-call':
        parts.push({
          type: 'tool-call',
          toolCallId: item.toolCallId,
          toolName: item.toolName,
          args: toolArgs(item.input),
        });
        break;
      case 'tool-result':
        parts.push({
          type: 'tool-result',
          toolCallId: item.toolCallId,
          toolName: item.toolName,
          result: item.result ?? null,
          ...(item.isError ? { isError: true } : {}),
        });
        break;
      case 'file':
        parts.push(filePart(item.data as AnyFileData, item.mediaType));
        break;
      default:
        break; // sources (citations of the reply), approval requests, provider-specific content
    }
  }
  return parts.length ? [{ id: newMessageId(), role: 'assistant', parts }] : [];
}

function placeholder(part: Extract<Part, { type: 'image' | 'file' }>): { type: 'text'; text: string } {
  const where = part.url ?? 'inline';
  return { type: 'text', text: `[${part.type}${part.filename ? ` ${part.filename}` : ''} at ${where}]` };
}

/** An image or file the model can read: inline data, or an http(s)/data URL, in the shape of `spec`; else a
 * placeholder (an `s3://` attachment a provider cannot fetch). */
function modelFile(part: Extract<Part, { type: 'image' | 'file' }>, spec: ModelSpec): UserContent {
  const mediaType = part.mediaType ?? (part.type === 'image' ? 'image/*' : 'application/octet-stream');
  const named = part.filename ? { filename: part.filename } : {};
  let data: { type: 'data'; data: string } | { type: 'url'; url: URL };
  let type = mediaType;
  if (part.data) {
    const inline = splitDataUrl(part.data);
    data = { type: 'data', data: inline?.data ?? part.data };
    type = inline?.mediaType ?? mediaType;
  } else if (part.url && /^(https?|data):/.test(part.url)) data = { type: 'url', url: new URL(part.url) };
  else return placeholder(part);
  // v2 and v3 take the base64 text or the URL itself.
  const shaped = spec === 'v4' ? data : data.type === 'data' ? data.data : data.url;
  return { type: 'file', mediaType: type, data: shaped as FileData, ...named };
}

function toolOutput(result: unknown, isError: boolean | undefined): ToolOutput {
  if (isError)
    return typeof result === 'string'
      ? { type: 'error-text', value: result }
      : { type: 'error-json', value: (result ?? null) as never };
  return typeof result === 'string'
    ? { type: 'text', value: result }
    : { type: 'json', value: (result ?? null) as never };
}

/** One stored message as prompt messages (none when nothing in it is for the model). */
function toModelMessages(message: Message, spec: ModelSpec): ModelMessage[] {
  const text = (parts: readonly Part[]) =>
    parts
      .filter((p): p is Extract<Part, { type: 'text' }> => p.type === 'text')
      .map((p) => p.text)
      .join('\n');
  switch (message.role) {
    case 'system': {
      const content = text(message.parts);
      return content ? [{ role: 'system', content }] : [];
    }
    case 'user': {
      const content: UserContent[] = [];
      for (const part of message.parts) {
        if (part.type === 'text') content.push({ type: 'text', text: part.text });
        else if (part.type === 'image' || part.type === 'file') content.push(modelFile(part, spec));
      }
      return content.length ? [{ role: 'user', content }] : [];
    }
    case 'assistant': {
      const content: AssistantContent[] = [];
      const results: ToolResultContent[] = [];
      for (const part of message.parts) {
        if (part.type === 'text') content.push({ type: 'text', text: part.text });
        else if (part.type === 'tool-call') {
          content.push({
            type: 'tool-call',
            toolCallId: part.toolCallId,
            toolName: part.toolName,
            input: part.args ?? {},
          });
        } else if (part.type === 'tool-result') {
          results.push({
            type: 'tool-result',
            toolCallId: part.toolCallId,
            toolName: part.toolName,
            output: toolOutput(part.result, part.isError),
          });
        } else if (part.type === 'image' || part.type === 'file') content.push(placeholder(part));
      }
      const out: ModelMessage[] = content.length ? [{ role: 'assistant', content }] : [];
      return results.length ? [...out, { role: 'tool', content: results }] : out;
    }
    case 'tool': {
      const content: ToolResultContent[] = [];
      for (const part of message.parts) {
        if (part.type === 'tool-result') {
          content.push({
            type: 'tool-result',
            toolCallId: part.toolCallId,
            toolName: part.toolName,
            output: toolOutput(part.result, part.isError),
          });
        }
      }
      return content.length ? [{ role: 'tool', content }] : [];
    }
    default:
      return [];
  }
}

/**
 * What memory shows the model, as prompt messages: the stored messages in order, with every tool call that has no
 * result among them (and every result without its call) left out — observation can split a pair, and a provider
 * refuses a call without its result. Files are written in the shape of `spec` (see above).
 */
export function toModelPrompt(messages: readonly Message[], spec: ModelSpec = 'v4'): ModelMessage[] {
  const converted = messages.flatMap((message) => toModelMessages(message, spec));
  const calls = new Set<string>();
  const results = new Set<string>();
  for (const message of converted) {
    if (message.role !== 'assistant' && message.role !== 'tool') continue;
    for (const part of message.content) {
      if (part.type === 'tool-call') calls.add(part.toolCallId);
      else if (part.type === 'tool-result') results.add(part.toolCallId);
    }
  }
  const paired = (part: { type: string; toolCallId?: string }) =>
    part.type === 'tool-call'
      ? results.has(part.toolCallId ?? '')
      : part.type === 'tool-result'
        ? calls.has(part.toolCallId ?? '')
        : true;
  const kept: ModelMessage[] = [];
  for (const message of converted) {
    if (message.role === 'assistant') {
      const content = message.content.filter(paired);
      if (content.length) kept.push({ ...message, content });
    } else if (message.role === 'tool') {
      const content = message.content.filter(paired);
      if (content.length) kept.push({ ...message, content });
    } else kept.push(message);
  }
  return kept;
}
