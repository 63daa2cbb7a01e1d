"""The cost of a DP noise source on one client's upload: seconds to noise a table.

Three sources, float64, for a table of ``rows × dim`` values:

* ``torch.randn``: MT19937 (what the DP of uploads used before), not a cryptographic source;
* ``urandom``: :func:`lightning_fedkg.privacy.mechanisms.noise.snapped_release`, Box-Muller on
  ``os.urandom`` bits and rounding to the release grid (what the DP of uploads, privacy/dp_uploads.py, uses);
* ``opendp``: OpenDP's exact discrete Gaussian (``make_gaussian`` on a float vector,
  cryptographic source), timed on ``--opendp-rows`` rows and scaled to the table.

    python scripts/benchmarks/bench_dp_noise.py --shape 5000 256 --shape 14541 256 --opendp-rows 400
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lightning_fedkg.privacy.mechanisms import noise


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def opendp_seconds(n: int) -> float:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.l2_distance(T=float)
    measurement = dp.m.make_gaussian(*space, scale=1.0, k=-20)
    values = [0.0] * n
    start = time.perf_counter()
    measurement(values)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs=2, type=int, action="append", metavar=("ROWS", "DIM"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--opendp-rows", type=int, default=400, help="rows timed with OpenDP (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for rows, dim in args.shape or [[5000, 256], [14541, 256]]:
        update = torch.rand(rows, dim, dtype=torch.float64) * 0.01
        generator = torch.Generator().manual_seed(0)
        entry = {"rows": rows, "dim": dim,
                 "torch_randn_s": best_of(lambda: torch.randn(rows, dim, generator=generator, dtype=torch.float64),
                                          args.repeats),
                 "urandom_snapped_s": best_of(lambda: noise.snapped_release(update, 0.5, noise.grid(0.1)),
                                              args.repeats)}
        if args.opendp_rows:
            timed = min(rows, args.opendp_rows)
            entry["opendp_s"] = opendp_seconds(timed * dim) * rows / timed
            entry["opendp_rows_timed"] = timed
        results.append(entry)
        print(json.dumps(entry))


if __name__ == "__main__":
    main()
