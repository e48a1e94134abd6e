"""Adapters: `om_lib`'s ports on real services, one package per service.

- `aws/`: DynamoDB (`dynamodb/`: the memory store and the vector index), S3 (`s3`), SQS and Step Functions (`work`),
  EventBridge (`eventbridge`), and the one table of AWS SDK errors (`errors`).
- `models/`: `LanguageModel` on Gemini, Bedrock and any OpenAI-compatible endpoint, and what they share.
- `embedders/`: `Embedder` on the same providers, and the offline all-MiniLM-L6-v2 (`local`).
- `memory/`: the in-memory reference implementations (store, vector index, event log).
- `tiktoken_counter`: the o200k tokenizer, offline (its encoding ships in `data/`).

Only adapters import SDKs (boto3, google-genai, openai), each on first use. They implement the ports of
`om_lib.ports`, `om_lib.work` and `om_lib.events`, so they import only the shared modules at the top of `om_lib`
(messages, records, ports, errors, ...), never the domain's packages; and the domain never imports them.
"""
