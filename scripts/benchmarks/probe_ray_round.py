"""Where a round with clients side by side (``federated.clients: ray``) goes: the driver's
own seconds outside the exchanges, each exchange's wall time and the seconds each worker
spent in it (wall, on the worker). Prints one block per round.

    python scripts/benchmarks/probe_ray_round.py -c configs/fede/fb15k237_fed10_fede.yaml \\
        data.name=../shared/data/FB15k-237-Fed10 model.dim=32
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args()

    import ray

    from lightning_fedkg.backends.ray import clients as clients_ray
    from lightning_fedkg.backends.ray.peer import ray_session
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.federation import FederatedRun
    from lightning_fedkg.run import fit

    exchanges, rounds = [], []
    exchange, train_round = clients_ray.RayClients.exchange, FederatedRun.train_round

    def timed_exchange(self, round, stage, *rest):
        start, get, seen = time.perf_counter(), self.ray.get, {}

        def timed_get(refs, *a, **k):
            out = get(refs, *a, **k)
            seen["worker"] = [answer[2] for answer in out]  # handle()'s (reply, error, seconds)
            return out

        self.ray.get = timed_get
        try:
            return exchange(self, round, stage, *rest)
        finally:
            self.ray.get = get
            exchanges.append((round, stage, time.perf_counter() - start, seen.get("worker", [])))

    def timed_round(self, r):
        start = time.perf_counter()
        try:
            return train_round(self, r)
        finally:
            rounds.append((r, time.perf_counter() - start))

    clients_ray.RayClients.exchange, FederatedRun.train_round = timed_exchange, timed_round
    cfg = load_config(args.config, [f"federated.rounds={args.rounds}", "federated.eval_every=100000",
                                    "federated.patience=100000", *args.overrides, "federated.clients=ray",
                                    "trainer.progress_bar=false"])
    with ray_session(ray, num_cpus=os.cpu_count() or 2), tempfile.TemporaryDirectory() as work:
        fit(cfg, work)
    for r, seconds in rounds:
        mine = [e for e in exchanges if e[0] == r and e[1] != "evaluate"]
        inside = sum(e[2] for e in mine)
        print(f"round {r}: {seconds:.3f} s, exchanges {inside:.3f} s, driver outside them {seconds - inside:.3f} s")
        for _, stage, wall, worker in mine:
            spread = f"max {max(worker):.3f}, sum {sum(worker):.3f} over {len(worker)}" if worker else "-"
            print(f"  {stage:>10s}: wall {wall:.3f} s; workers' seconds {spread}")


if __name__ == "__main__":
    main()
