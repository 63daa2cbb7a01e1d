"""``fedkg query``: answer a typed logical query with a finished FedCQA run, as a ``fedkg``
sub-command.

Light at import (``fedkg`` imports it to build its parser): the work is imported in
:meth:`Query.run`.
"""

from __future__ import annotations

import argparse
import logging

from lightning_fedkg.commands import Command
from lightning_fedkg.config import ConfigError

__all__ = ["Query"]


class Query(Command):
    """``fedkg query``: answer a typed query with a finished query-answering run."""

    help = "answer a typed logical query with a finished query-answering run"
    description = ("Answer a query by distributed retrieval. Syntax: (e:NAME, (r:REL, r-:REL)) for a chain (r- is "
                   "the inverse), i(Q, Q, ...) and u(Q, Q, ...) for intersections and unions; quote names with "
                   "spaces or commas.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--from", dest="from_run", metavar="RUN_DIR", required=True, help="a finished run folder")
        parser.add_argument("query", help='e.g. "(e:aspirin, (r:treats, r:causes))"')
        parser.add_argument("--top", type=int, default=10, help="how many answers to print (default 10)")

    @classmethod
    def run(cls, args: argparse.Namespace) -> int:
        if args.top < 1:  # checked before torch and the run are loaded: --top 0 would print an empty list
            raise ConfigError(f"--top: {args.top} answers; give a whole number of at least 1 (default 10)")
        from lightning_fedkg.federated.entry import load_run_from
        from lightning_fedkg.federated.strategy import client_name

        from .query_text import QuerySyntaxError, answer_query
        from .retrieval import UnroutableQuery, explain_lacks

        # Loading a run rebuilds its parties (query sets from the cache): not news to a person asking.
        logging.getLogger("lightning_fedkg").setLevel(logging.WARNING)
        cfg, run = load_run_from(args.from_run)
        if cfg.federated.task != "query_answering":
            raise ConfigError(f"{args.from_run} is a {cfg.federated.task!r} run, not a query_answering one")
        # The querier (the first client, in this process) reveals this many answers to the
        # server, no more (task.retrieval: private): set on its own config, not the server's.
        run.parties[client_name(0)].cfg.task.reveal_top = args.top
        try:
            structure, answers = answer_query(cfg, run, args.query, top=args.top)
        except QuerySyntaxError as err:
            raise ConfigError(str(err)) from None
        except UnroutableQuery as err:
            # a well-formed query the federation cannot answer: say who lacked what
            print("no answer: no client can route the query:")
            for line in explain_lacks(cfg, run.fkg, err.lacks):
                print(f"  {line}")
            return 0
        finally:
            run.close()
        print(f"{structure} query, top {len(answers)} of the federation's entities by holder-averaged score:")
        for rank, (name, score) in enumerate(answers, 1):
            print(f"{rank:4d}  {score:10.4f}  {name}")
        return 0
