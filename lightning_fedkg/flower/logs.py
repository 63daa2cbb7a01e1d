"""Flower's console log, made readable where it is redirected (imports only flwr)."""

__all__ = ["plain_logs_unless_terminal"]


def plain_logs_unless_terminal() -> None:
    """Turn off the colours of Flower's console log where its stream is not a terminal.

    Flower's ``ConsoleHandler`` wraps every level name in ANSI colour codes, terminal or
    not (flwr 1.x has no setting for it), so a redirected run's log (its deprecation
    warnings, say) holds escape codes. The handler reads ``colored`` at each record:
    setting it once flwr is imported is enough. Call after importing flwr.
    """
    import logging

    from flwr.common.logger import ConsoleHandler

    for handler in logging.getLogger("flwr").handlers:
        if isinstance(handler, ConsoleHandler):
            isatty = getattr(handler.stream, "isatty", None)
            handler.colored = bool(isatty and isatty())
