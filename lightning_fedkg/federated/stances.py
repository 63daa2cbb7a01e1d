"""What a client does with each field a server's message carries: its declared stance.

A client decides what it reveals from its own policy, so each field it receives is
``pinned`` (a setting its policy fixes: another value is refused), ``checked`` (verified
against what the client holds, refused otherwise) or ``harmless`` (it may change what the
client computes, never what it reveals beyond its guarantee), with the reason. A stance may
hold only where ``when`` (a dotted boolean setting, or ``key=value``) holds; elsewhere the
field is relayed as the honest-but-curious threat model allows, which the reason names.
Client halves declare ``RECEIVES = {stage: {field: Stance}}`` (:func:`receives` merges them
over a class's bases); a field is ``config.<key>[.<key>]``, ``arrays.<name>`` or
``metrics.<name>``, its varying parts written ``{peer}``, ``{tensor}``, ``{group}``, ``{n}``.
tests/test_malicious_server.py fails on a field an honest run sends without a stance and
sends each one deviating values; docs/stances.md shows them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stance", "pinned", "checked", "harmless", "receives", "markdown", "ROWS"]


@dataclass(frozen=True)
class Stance:
    """One field's stance (``kind``: pinned, checked or harmless), why, and where it holds."""

    kind: str
    why: str
    when: str | None = None

    def holds(self, cfg) -> bool:
        """Whether the stance applies under ``cfg``: always without ``when``; else when the
        dotted setting ``when`` names is true, or, for ``key=value``, equals ``value``."""
        if self.when is None:
            return True
        key, _, value = self.when.partition("=")
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        return str(node) == value if value else bool(node)


def pinned(why: str, when: str | None = None) -> Stance:
    return Stance("pinned", why, when)


def checked(why: str, when: str | None = None) -> Stance:
    return Stance("checked", why, when)


def harmless(why: str, when: str | None = None) -> Stance:
    return Stance("harmless", why, when)


#: The stance of the model rows a server sends: what the client starts from.
ROWS = harmless("the model rows the client starts from or evaluates: a deviating value changes what it trains "
                "and how well, not which rows cross or how they are protected (DP clips the update relative to "
                "them). Not covered: a crafted model that makes the update itself reveal the client's data "
                "(docs/privacy.md)")


def receives(cls: type) -> dict[str, dict[str, Stance]]:
    """``{stage: {field: Stance}}`` of a client half class: every ``RECEIVES`` on its bases,
    merged from the base up (a mixin's declaration of a field wins over its base's)."""
    out: dict[str, dict[str, Stance]] = {}
    for base in reversed(cls.__mro__):
        for stage, fields in vars(base).get("RECEIVES", {}).items():
            out.setdefault(stage, {}).update(fields)
    return out


def markdown(classes: dict[str, type]) -> str:
    """The declarations of ``classes`` (``{title: class}``; each class's own ``RECEIVES``,
    not its bases') as one markdown table per class: what docs/stances.md shows."""
    blocks = []
    for title, cls in classes.items():
        rows = ["| stage | field | stance | why |", "| --- | --- | --- | --- |"]
        for stage, fields in vars(cls).get("RECEIVES", {}).items():
            for name, stance in fields.items():
                kind = stance.kind + (f" (when `{stance.when}`)" if stance.when else "")
                rows.append(f"| {stage} | `{name}` | {kind} | {stance.why} |")
        blocks.append(f"### {title}\n\n" + "\n".join(rows))
    return "\n\n".join(blocks) + "\n"
