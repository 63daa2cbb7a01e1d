"""Sub-commands a method adds to ``fedkg`` (``fedkg unlearn``, ``fedkg query``).

A :class:`Command` is registered as an entry point of the ``lightning_fedkg.commands``
group (:data:`~lightning_fedkg.registry.COMMANDS`), named as it is typed. ``fedkg`` imports
every command's module to build its parser, on every call (``fedkg --help`` included), so
a command module stays light: it imports torch and its method's other modules inside
:meth:`Command.run`, not at the top.
"""

from __future__ import annotations

import argparse

__all__ = ["Command"]


class Command:
    """One ``fedkg <name>`` sub-command: its arguments and the work it does.

    Attributes:
        help: the one line ``fedkg --help`` shows beside the name.
        description: the longer text of ``fedkg <name> --help``, or None.
    """

    help: str = ""
    description: str | None = None

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the command's arguments to its sub-parser (default: none)."""

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        """Do the command's work; returns the exit status. Bad input is raised as
        :class:`~lightning_fedkg.config.ConfigError` (or ``FileNotFoundError``), which
        ``fedkg`` prints as ``fedkg: error: ...`` with exit status 2."""
        raise NotImplementedError

    @classmethod
    def add_to(cls, subparsers, name: str) -> argparse.ArgumentParser:
        """Add the command to ``fedkg``'s sub-parsers as ``name``; returns its parser."""
        parser = subparsers.add_parser(name, help=cls.help, description=cls.description)
        cls.add_arguments(parser)
        parser.set_defaults(func=cls.run)
        return parser
