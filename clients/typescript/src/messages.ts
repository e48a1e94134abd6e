/**
 * Messages and ids. Every message gets its id here, on the client, so sending it again (a retry, or your own) is a
 * no-op on the server: a stored message is immutable, and the same id with the same content is accepted once.
 */
import { InvalidId } from './errors.js';
import type { Message, MessageInput, MessageLike, Part, Role } from './types.js';

/** A fresh message id, in the server's style (`msg_<uuid hex>`). */
export function newMessageId(): string {
  return `msg_${globalThis.crypto.randomUUID().replaceAll('-', '')}`;
}

// Characters the id grammar forbids: they would change the URL's meaning or are not printable.
const BAD_ID_CHARS = /[/?#%\s\x00-\x1f\x7f]/u;

/** `value` when it is a usable id; else `InvalidId` (nothing is sent). */
export function checkId(name: string, value: unknown): string {
  if (typeof value !== 'string' || !value || BAD_ID_CHARS.test(value)) {
    throw new InvalidId(
      `${name} ${JSON.stringify(value)} is not a valid id: ids are 1-128 characters without "/", "?", "#", "%", ` +
        'whitespace or control characters',
      { details: [{ location: 'client', field: name, type: 'invalid_id', message: 'invalid id' }] },
    );
  }
  return value;
}

/** A message with an id, as the API takes it: from a message (its id kept, or a new one) or from plain text. */
export function asMessage(value: MessageLike, role: Role = 'user'): MessageInput & { id: string } {
  if (typeof value === 'string') return { id: newMessageId(), role, parts: [{ type: 'text', text: value }] };
  const { id, ...rest } = value;
  return { id: id ? checkId('message id', id) : newMessageId(), ...rest };
}

/** A user message with one text part and a fresh id (keep it to send the same message again). */
export function userMessage(text: string, fields: Partial<MessageInput> = {}): MessageInput & { id: string } {
  return { id: newMessageId(), role: 'user', parts: [{ type: 'text', text }], ...fields } as MessageInput & {
    id: string;
  };
}

/** An assistant message with one text part and a fresh id. */
export function assistantMessage(text: string, fields: Partial<MessageInput> = {}): MessageInput & { id: string } {
  return { id: newMessageId(), role: 'assistant', parts: [{ type: 'text', text }], ...fields } as MessageInput & {
    id: string;
  };
}

/** The text parts of a message joined by newlines (`content` when it was sent that way). */
export function textOf(message: Pick<Message, 'parts'> | MessageInput): string {
  const parts: readonly Part[] = message.parts ?? [];
  const texts = parts.filter((p): p is Extract<Part, { type: 'text' }> => p.type === 'text').map((p) => p.text);
  if (!texts.length && 'content' in message && typeof message.content === 'string') return message.content;
  return texts.join('\n');
}
