"""Rewrite the tables of docs/stances.md from the client halves' declared stances.

    python scripts/tools/render_stances.py            # rewrite the block between the markers
    python scripts/tools/render_stances.py --check    # exit 1 if the page differs (what the tests check)

The tables are :func:`lightning_fedkg.federated.stances.markdown` of :data:`CLASSES`; the
text around the markers is the page's own.
"""

from __future__ import annotations

import argparse
import sys

from lightning_fedkg.measure import repo_root

PAGE = repo_root(__file__) / "docs" / "stances.md"
BEGIN, END = "<!-- stances:begin -->", "<!-- stances:end -->"


def classes() -> dict[str, type]:
    """The client halves and mixins whose declarations the page shows, in its order."""
    from lightning_fedkg.privacy.secure import SecureClient
    from lightning_fedkg.federated.strategy import ClientHalf
    from lightning_fedkg.methods.fedcqa.retrieval_client import RetrievalClient
    from lightning_fedkg.methods.fedlu.strategy import FedLUClient

    return {"Every client half (`ClientHalf`)": ClientHalf, "Secure aggregation (`SecureClient`)": SecureClient,
            "FedLU (`FedLUClient`)": FedLUClient, "FedCQA's retrieval (`RetrievalClient`)": RetrievalClient}


def rendered(text: str) -> str:
    """``text`` (the page) with the block between the markers rendered afresh."""
    from lightning_fedkg.federated.stances import markdown

    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{markdown(classes())}{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if the page differs")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    new = rendered(text)
    if args.check:
        if new != text:
            print(f"{PAGE} differs from the declarations: run python scripts/tools/render_stances.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    print(f"rewrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
