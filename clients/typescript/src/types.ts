/**
 * The API's bodies, named: aliases of the types generated from the served OpenAPI document
 * (`src/generated/openapi.ts`), with the `data-om-*` parts and tool declarations typed.
 */
import type { components } from './generated/openapi.js';
import type { OmPart } from './parts.js';

type Schemas = components['schemas'];

export type Role = Schemas['MessageIn']['role'];
export type TextPart = Schemas['TextPart'];
export type ImagePart = Schemas['ImagePart'];
export type FilePart = Schemas['FilePart'];
export type ToolCallPart = Schemas['ToolCallPart'];
export type ToolResultPart = Schemas['ToolResultPart'];
export type ReasoningPart = Schemas['ReasoningPart'];
/** A message part. */
export type Part = TextPart | ImagePart | FilePart | ToolCallPart | ToolResultPart | ReasoningPart;

/** A message as sent: `id` and `createdAt` optional (the client assigns the id), `content` is one text part. */
export type MessageInput = Schemas['MessageIn'];
/** A message as stored and answered. */
export type Message = Schemas['MessageOut'];
/** A message in a listing, with whether memory has observed it. */
export type ListedMessage = Schemas['ListedMessageOut'];
/** A message, or plain text (a user message in steps, an assistant message in turns). */
export type MessageLike = MessageInput | string;

/** A function the Actor should expose (`recall`, `updateWorkingMemory`): name, description, JSON Schema. */
export interface ToolDeclaration {
  name: string;
  description?: string;
  parameters?: Record<string, unknown>;
}

/** `POST /threads/{id}/steps`: the memory system message, the unobserved messages to send after it, the tools. */
export type StepResult = Omit<Schemas['StepsOut'], 'parts' | 'tools'> & { parts: OmPart[]; tools: ToolDeclaration[] };
/** `POST /threads/{id}/turns`: the ids saved, and background work scheduled (`data-om-scheduled`). */
export type TurnResult = Omit<Schemas['TurnsOut'], 'parts'> & { parts: OmPart[] };
/** `POST /threads/{id}/chat`: the Actor's reply (null when the Actor failed after the input was saved). */
export type ChatResult = Omit<Schemas['ChatOut'], 'parts'> & { parts: OmPart[] };

/** A message imported into memory with `observe`: `createdAt` (when it was said) is required, it dates the observations. */
export type ImportedMessage = Schemas['ImportedMessageIn'];
/**
 * `POST /threads/{id}/memory/observe | reflect | buffer`: what the operation did and its `data-om-*` parts. `status`:
 * `done`, `nothing_to_do` (a retry, or nothing left), `busy` (another worker held the memory past the request's
 * budget: retry later) or `failed` (the model failed; nothing changed; the parts say why).
 */
export type MemoryOperation = Omit<Schemas['MemoryOperationOut'], 'parts'> & { parts: OmPart[] };

export type MemoryStatus = Schemas['MemoryOut'];
export type MemoryGenerations = Schemas['GenerationsOut'];
export type MessagesPage = Schemas['MessagesPage'];
export type MessagesQueryResult = Schemas['MessagesQueryOut'];
export type Thread = Schemas['ThreadOut'];
export type ThreadsPage = Schemas['ThreadsPage'];
export type CloneResult = Schemas['CloneOut'];
export type WorkingMemory = Schemas['WorkingMemoryOut'];
export type RecallResult = Schemas['RecallOut'];
export type AttachmentUpload = Schemas['AttachmentOut'];
export type Health = Schemas['HealthOut'];
export type DateRange = Schemas['DateRangeIn'];
export type Include = Schemas['IncludeIn'];
export type RecallMode = NonNullable<Schemas['RecallIn']['mode']>;
