"""The `om` command: local stack, demo, chat and invoke. Lives outside om_lib, which never imports it."""
