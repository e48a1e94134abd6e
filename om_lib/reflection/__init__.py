"""Keeping the observation log small.

- `reflection`: the one reflection path: draft through the Reflector's compression ladder, then commit a new
  generation, or stage the draft for the reflection workflow and async buffering.
- `archive`: when reflection cannot keep the log small, its oldest units move to the record's archive, without a
  model call.

May import: `om_lib.observation` and everything below it.
"""
