"""What every room of the engine shares.

- `runtime`: the `Runtime`: the resolved settings, the ports, the model router, the token counter, and the few
  helpers every room needs.
- `record_writer`: the one writer of OM records (creation, optimistic versions, leases, new generations). Every write
  of a record goes through it.

May import: the layers below it (`om_lib.config`, `om_lib.prompts`, `om_lib.context`, `om_lib.models`) and the shared
modules; it uses config, models and context today.
"""
