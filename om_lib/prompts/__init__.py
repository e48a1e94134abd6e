"""What the two memory roles are asked and how their answers are read, pure (no I/O, no model call).

- `observer`: the Observer's prompts, the transcript it reads, request text, parsing and context budgeting.
- `reflector`: the Reflector's prompts, parsing and the compression ladder.
- `log_check`: the check every Observer and Reflector answer passes before it may become memory.

May import: the layers below it (`om_lib.context`, `om_lib.models`) and the shared modules; it uses context only
today, and stays free of I/O either way. Both paths call into it (`om_lib.observation`,
`om_lib.reflection`), and each uses the other role's half (buffering slices the log as the Reflector does; the
Reflector's prompt carries the Observer's instructions), so the two cores sit here, under both paths.
"""
