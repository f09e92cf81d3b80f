"""The `rpeg` command: `app` builds the parser and maps errors to exit codes; `common` holds what
the commands share; `graph`, `perf`, `plan` and `train` hold the commands (they import `common`,
never each other)."""

from rpeg.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
