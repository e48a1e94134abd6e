"""`LanguageModel` on each provider.

- `gemini`: Google's Gemini API through the google-genai client.
- `bedrock`: Amazon Bedrock's Converse API through boto3.
- `openai`: any OpenAI-compatible Chat Completions endpoint through the `openai` client.
- What they share: `provider_calls` (the client kept per API key, "later" errors, embedding batches within one
  deadline), `retry_after` (a provider's `Retry-After`), `chat_turns` (pairing tool calls and results for the
  chat-style APIs).

Each adapter makes exactly one attempt per call; retries, fallbacks and deadlines are `om_lib.models.model_router`'s.
May import: the shared modules of `om_lib`.
"""
