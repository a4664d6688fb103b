"""``hf-diversed``: the command-line entry point (``main``) and its subcommands."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
