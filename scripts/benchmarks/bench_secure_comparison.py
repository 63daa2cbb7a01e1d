"""What a secure comparison costs: the price of private retrieval where the querier would
get ranks without anyone seeing the scores (docs/privacy.md, "Private retrieval").

Ranking a hard answer among N entities without revealing the holder-mean scores takes N
secure comparisons of the summed fixed-point scores (``1 + #{e : s(e) > s(v)}``). This
times ``--comparisons`` of them under MPyC (Shamir secret sharing, honest majority), the
clients' tables input by every party and summed inside the computation, and prints the
seconds and bytes per comparison. MPyC is no dependency of the package::

    pip install mpyc
    python scripts/benchmarks/bench_secure_comparison.py -M3 --comparisons 2000 --bits 64

``-M3`` runs three parties as local processes (MPyC's own option).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

try:
    from mpyc.runtime import mpc
except ImportError:  # said before MPyC's runtime parses the command line
    sys.exit("scripts/benchmarks/bench_secure_comparison.py needs MPyC: pip install mpyc")


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparisons", type=int, default=2000, help="secure comparisons to time (default 2000)")
    parser.add_argument("--bits", type=int, default=64,
                        help="bit length of the secret integers; 64 holds private retrieval's fixed point")
    args, _ = parser.parse_known_args()  # MPyC's own options (-M3, ...) are its runtime's
    return args


def bytes_sent() -> int:
    """What this party has sent to the others so far."""
    return sum(peer.protocol.nbytes_sent for peer in mpc.parties if peer.pid != mpc.pid)


async def main() -> None:
    args = options()
    secint = mpc.SecInt(args.bits)
    await mpc.start()
    rng = np.random.default_rng(mpc.pid)
    bound = 1 << (args.bits - 4)  # room for the sum over the parties
    tables = mpc.input(secint.array(rng.integers(-bound, bound, size=args.comparisons, dtype=np.int64)))
    total = tables[0]
    for table in tables[1:]:
        total = total + table
    target = mpc.input(secint.array(rng.integers(-bound, bound, size=args.comparisons, dtype=np.int64)),
                       senders=[0])[0]
    before = bytes_sent()
    started = time.perf_counter()
    rank = await mpc.output(mpc.np_sum(total > target))  # one rank's worth of comparisons
    seconds = time.perf_counter() - started
    sent = bytes_sent() - before
    if mpc.pid == 0:
        print(f"parties={len(mpc.parties)} bits={args.bits} comparisons={args.comparisons} "
              f"seconds={seconds:.3f} ms_per_comparison={1e3 * seconds / args.comparisons:.2f} "
              f"bytes_sent_per_comparison={sent / args.comparisons:.0f} (party 0) count={int(rank)}")
    await mpc.shutdown()


if __name__ == "__main__":
    mpc.run(main())
