"""Entry point of the `om` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a subcommand."""
    parser = argparse.ArgumentParser(prog='om', description='Observational Memory: local tools')
    sub = parser.add_subparsers(dest='command', required=True)
    demo = sub.add_parser('demo', help='replay a bundled multi-session conversation and show the memory over time')
    demo.add_argument('--config', help='configuration JSON file (default: small demo thresholds)')
    args = parser.parse_args(argv)

    if args.command == 'demo':
        from om_cli.demo import run_demo

        config = None
        if args.config:
            from om_lib.config import load_config

            config = load_config(path=args.config).to_json_dict()
        run_demo(config=config)
        return 0
    parser.error(f'unknown command {args.command}')  # pragma: no cover - argparse already refused it
    return 2


if __name__ == '__main__':
    sys.exit(main())
