"""The models the domain calls, behind the `LanguageModel` and `Embedder` ports of `om_lib.ports`.

- `model_spec`: which model a role calls (one model, one chosen by input size, or a fallback list).
- `model_router`: runs a `ModelSpec` against the providers: tiers, retries with backoff, fallbacks, one deadline and a
  circuit breaker per model.
- `offline_model`: the built-in deterministic language model (no network, no credentials).
- `embedders`: the built-in hashing embedder and the choice of embedding model.

May import: the shared modules only. The providers' adapters are in `om_lib/adapters/models/` and
`om_lib/adapters/embedders/`.
"""
