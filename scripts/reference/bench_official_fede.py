#!/usr/bin/env python
"""Time the official FedE code (AnselCmy/FedE) on FB15k-237-Fed3, on CPU, unmodified.

This is the reference side of ``docs/results/fede.md``. It contains none of the official code:
``--fede-dir`` names a checkout of https://github.com/AnselCmy/FedE (the figures in
docs/results/fede.md are for commit 46f5993), whose ``fede.py`` / ``dataloader.py`` /
``kge_model.py`` are imported from that folder. The harness builds the official ``FedE``
learner exactly as its ``main.py`` does for ``--setting FedE`` (seeds first, then the pickle,
then ``FedE(args, all_data)``), and drives its rounds through the official methods
(``send_emb``, ``Client.client_update``, ``Server.aggregation``, ``FedE.evaluate``), timing
each call. ``FedE.train`` itself is not called: it validates every 5 rounds, writes
checkpoints and TensorBoard logs, and cannot stop after R rounds without an evaluation.

Hyperparameters (FedE's, as in docs/results/fede.md): TransE, dim 256, 256 negatives, batch 512,
Adam lr 1e-3, gamma 10, epsilon 2, adversarial temperature alpha 1, E = 3 local epochs,
fraction F = 1 (all 3 clients each round), test batch 16, seed 12345.

Data: the official code reads a pickle (one dict per client). It is regenerated with
``../shared/tools/make_fed_splits.py --pkl-out`` from the raw FB15k-237 files into
``--work-dir`` (default a temporary folder, removed afterwards), and the plain split the
tool writes beside it is checked, file by file, to be byte-identical to
``../shared/data/FB15k-237-Fed3`` (the split our own ``bench_fede.py`` trains on).
``--pkl`` uses an existing pickle instead.

Runtime shims (the official code was written for numpy 1.x / torch 1.x on a GPU); nothing in
its files is edited:
  * ``numpy.in1d`` (removed in numpy 2.4; ``TrainDataset.__getitem__`` calls it) is set to
    ``numpy.isin``, which takes the same arguments and returns the same mask;
  * ``args.gpu`` is ``torch.device(--device)`` (default ``cpu``; ``main.py`` would build
    ``cuda:<gpu>``, which ``--device cuda`` gives);
  * ``args`` is an ``argparse.Namespace`` built here, because ``main.py``'s parser cannot
    express the run: ``--hidden_dim`` is ``type=float`` (``torch.zeros(n, 256.0)`` fails),
    ``--lr`` is ``type=int`` (``--lr 0.001`` is rejected; only its default is usable) and
    ``--local_epoch`` has no type (a string once given on the command line);
  * torch's "where received a uint8 condition tensor" deprecation warning
    (``Client.client_eval`` passes ``labels.byte()``) is silenced; the result is unchanged.

Modes
  * ``--mode bounded --batches N``: one round in which each client trains only N batches
    (its DataLoader is wrapped so that it yields N batches and ``local_epoch`` is 1 for that
    round), each batch timed (loading + sampling + step). A full round is extrapolated per
    client as ``mean s/batch x batches per round`` (``ceil(train / 512) x E``), plus the
    measured ``send_emb`` and aggregation; the same from the median over batches 2..N.
  * ``--mode full --rounds R``: R complete official rounds (E local epochs per client).
  * ``--eval-limit K`` (default 10; 0 = off): after training, time K test batches per client
    with ``Client.client_eval`` and extrapolate the complete test evaluation.
  * ``--eval-full``: after the last round, the complete official test evaluation
    (``FedE.evaluate(istest=True)``: tail-only, batches of 16, non-client entities masked),
    timed per client, with per-client and weighted MRR / Hits@{1,5,10}.

The process's peak RSS and its CPU seconds are printed too; ``--json-out`` writes it all.

    python scripts/reference/bench_official_fede.py --fede-dir PATH/TO/FedE --mode bounded --batches 20 \\
        --eval-limit 0 --threads 2
    python scripts/reference/bench_official_fede.py --fede-dir PATH/TO/FedE --mode bounded --batches 20 --eval-limit 0 --eval-full --threads 2
    python scripts/reference/bench_official_fede.py --fede-dir PATH/TO/FedE --mode full --rounds 1 --eval-full \\
        --threads 2
"""

from __future__ import annotations

import argparse
import filecmp
import os
import pickle
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from lightning_fedkg.measure import git_blob_id, peak_rss_mib, write_json

# Git blob ids of the official files at AnselCmy/FedE commit 46f59931b689a2d0bffad67ae027bf59da048578
# (identifiers only, used to report whether --fede-dir holds that version unmodified).
OFFICIAL_BLOBS_46F5993 = {
    "fede.py": "684c92bf9c4c791a78d7b35c4876b999a84b9a17",
    "dataloader.py": "e8c974552bc30e86ec4ffd6b6cb987d6e575b6b4",
    "kge_model.py": "42ddb475d90afc2a4c46e76966243811487013ee",
}

DEFAULT_RAW = "../shared/data/FB15k-237/raw"
DEFAULT_FED = "../shared/data/FB15k-237-Fed3"
DEFAULT_TOOL = "../shared/tools/make_fed_splits.py"
SPLIT_NAME = "FB15k-237-Fed3"


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fede-dir", required=True, help="folder of the official FedE code (holds fede.py)")
    p.add_argument("--mode", choices=["bounded", "full"], default="bounded")
    p.add_argument("--batches", type=int, default=20, metavar="N", help="bounded: training batches per client")
    p.add_argument("--rounds", type=int, default=1, metavar="R", help="full: complete rounds (default 1)")
    p.add_argument("--eval-limit", type=int, default=10, metavar="K",
                   help="time K test batches per client and extrapolate the full evaluation (0 = off)")
    p.add_argument("--eval-full", action="store_true", help="complete official test evaluation after the last round")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch's default)")
    p.add_argument("--device", default="cpu", help="the official code's args.gpu: cpu (default) or cuda")
    p.add_argument("--dim", type=int, default=256, help="embedding dim (FedE: 256); smaller only for smoke tests")
    p.add_argument("--local-epochs", type=int, default=3, help="E (FedE: 3)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--work-dir", default=None, help="where the pickle is written (default: a temporary folder)")
    p.add_argument("--pkl", default=None, help="use this official-format pickle instead of regenerating it")
    p.add_argument("--raw-dir", default=DEFAULT_RAW, help="raw FB15k-237 {train,valid,test}.txt (default: %(default)s)")
    p.add_argument("--fed-data", default=DEFAULT_FED,
                   help="plain FB15k-237-Fed3 split the regenerated one must equal (default: %(default)s)")
    p.add_argument("--splits-tool", default=DEFAULT_TOOL, help="make_fed_splits.py (default: %(default)s)")
    p.add_argument("--json-out", default=None, help="write all records and the summary here")
    args = p.parse_args(argv)
    if args.batches < 1 or args.rounds < 1 or args.eval_limit < 0:
        p.error("--batches and --rounds must be >= 1, --eval-limit >= 0")
    return args


# ----------------------------------------------------------------------------- data


def make_pickle(args: argparse.Namespace, work: Path) -> Path:
    """Regenerate the official-format pickle and check its plain twin equals --fed-data."""
    pkl = work / "FB15k237-Fed3.pkl"
    plain = work / "plain"
    if not pkl.exists():
        cmd = [sys.executable, args.splits_tool, "--format", "pyg-raw", "--input-dir", args.raw_dir,
               "--num-clients", "3", "--seed", "12345", "--name", SPLIT_NAME,
               "--plain-root", str(plain), "--pkl-out", str(pkl)]
        print("regenerating the pickle:", " ".join(cmd), flush=True)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"  done in {time.perf_counter() - t:.1f} s", flush=True)
    for k in range(3):
        for split in ("train", "valid", "test"):
            mine = plain / SPLIT_NAME / f"client_{k}" / f"{split}.tsv"
            ref = Path(args.fed_data) / f"client_{k}" / f"{split}.tsv"
            if not filecmp.cmp(mine, ref, shallow=False):
                sys.exit(f"regenerated {mine} differs from {ref}: not the FB15k-237-Fed3 split")
    print(f"  plain split byte-identical to {args.fed_data} (3 clients x train/valid/test)", flush=True)
    return pkl


# ----------------------------------------------------------------------------- official code


def import_official(fede_dir: Path):
    import numpy as np

    if not (fede_dir / "fede.py").is_file():
        sys.exit(f"{fede_dir} has no fede.py: --fede-dir must be a checkout of AnselCmy/FedE")
    if not hasattr(np, "in1d"):  # shim: removed in numpy 2.4, same semantics as isin
        np.in1d = np.isin
    warnings.filterwarnings("ignore", message="where received a uint8 condition tensor")
    # The official code is imported from its own unmodified checkout, the only way to run it
    # in this process without copying it: its folder goes first on the module path.
    sys.path.insert(0, str(fede_dir))
    import fede  # noqa: E402  (the official module)

    if Path(fede.__file__).resolve().parent != fede_dir.resolve():
        sys.exit(f"imported fede from {fede.__file__}, not from {fede_dir}")
    status = {}
    for name, blob in OFFICIAL_BLOBS_46F5993.items():
        status[name] = git_blob_id(fede_dir / name) == blob
    same = all(status.values())
    print(f"official code: {fede_dir.resolve()} "
          + ("(fede.py, dataloader.py, kge_model.py identical to commit 46f5993)" if same else
             f"(WARNING: differs from commit 46f5993: {[n for n, ok in status.items() if not ok]})"),
          flush=True)
    return fede, same


def official_args(a: argparse.Namespace, device) -> argparse.Namespace:
    """The Namespace main.py would produce for ``--setting FedE --model TransE`` (typed as it needs)."""
    return argparse.Namespace(
        setting="FedE", mode="train", model="TransE", name="fb15k237_fed3_transe_fede",
        batch_size=512, test_batch_size=16, num_neg=256, lr=0.001,
        max_round=a.rounds, local_epoch=a.local_epochs, fraction=1.0,
        log_per_round=1, check_per_round=5, early_stop_patience=15,
        gamma=10.0, epsilon=2.0, hidden_dim=a.dim, adversarial_temperature=1.0,
        seed=a.seed, gpu=device, num_cpu=10, num_client=None,
    )


class BoundedLoader:
    """Yields the first ``n`` batches of ``loader`` (re-iterating it if needed), timing each one.

    ``times[i]`` is the wall time from asking for batch i until the consumer asks for batch i+1
    (loading/sampling batch i + its training step); ``load[i]`` the loading part alone."""

    def __init__(self, loader, n: int):
        self.loader, self.n = loader, n
        self.times: list[float] = []
        self.load: list[float] = []
        self.dataset = loader.dataset

    def __len__(self):
        return self.n

    def __iter__(self):
        produced = 0
        while produced < self.n:
            it = iter(self.loader)
            while produced < self.n:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                self.load.append(time.perf_counter() - t0)
                yield batch
                self.times.append(time.perf_counter() - t0)
                produced += 1


def fmt3(xs) -> str:
    return " / ".join(f"{x:.3f}" for x in xs)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    a = parse_args(argv)
    import numpy as np
    import torch

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    fede, unmodified = import_official(Path(a.fede_dir))

    tmp = None
    if a.pkl:
        pkl = Path(a.pkl)
    else:
        if a.work_dir:
            work = Path(a.work_dir)
            work.mkdir(parents=True, exist_ok=True)
        else:
            tmp = tempfile.mkdtemp(prefix="bench_official_fede_")
            work = Path(tmp)
        pkl = make_pickle(a, work)

    print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
          f"{torch.get_num_threads()} threads, {os.cpu_count()} cores, mode {a.mode}", flush=True)

    # main.py's order: seeds, pickle, FedE(args, all_data)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    with open(pkl, "rb") as f:
        all_data = pickle.load(f)
    oargs = official_args(a, torch.device(a.device))
    oargs.num_client = len(all_data)
    t = time.perf_counter()
    learner = fede.FedE(oargs, all_data)
    setup_s = time.perf_counter() - t
    clients = learner.clients
    n_train = [len(c.train_dataloader.dataset) for c in clients]
    n_test = [len(c.test_dataloader.dataset) for c in clients]
    bpe = [len(c.train_dataloader) for c in clients]
    tbatches = [len(c.test_dataloader) for c in clients]
    print(f"setup (datasets, dataloaders, tables): {setup_s:.1f} s; entities {learner.args.nentity}; "
          f"train {n_train}; test {n_test}; batches/epoch {bpe}", flush=True)

    records: dict = {"mode": a.mode, "rounds": [], "setup_s": setup_s, "unmodified_46f5993": unmodified,
                     "threads": torch.get_num_threads(), "dim": a.dim, "local_epochs": a.local_epochs}
    n_rounds = 1 if a.mode == "bounded" else a.rounds
    for r in range(n_rounds):
        # the round of FedE.train: sample clients, send_emb, client_update each, aggregation
        cpu0, w0 = cpu_seconds(), time.perf_counter()
        n_sample = max(round(oargs.fraction * learner.num_clients), 1)
        sample_set = np.random.choice(learner.num_clients, n_sample, replace=False)
        t = time.perf_counter()
        learner.send_emb()
        send_s = time.perf_counter() - t
        per_client, losses, bounded = {}, {}, {}
        if a.mode == "bounded":
            saved_epochs = oargs.local_epoch
            oargs.local_epoch = 1
        for k in sample_set.tolist():
            c = clients[k]
            if a.mode == "bounded":
                real = c.train_dataloader
                c.train_dataloader = bounded[k] = BoundedLoader(real, a.batches)
            t = time.perf_counter()
            try:
                losses[k] = float(c.client_update())
            finally:
                if a.mode == "bounded":
                    c.train_dataloader = real
            per_client[k] = time.perf_counter() - t
            if a.mode == "full":
                print(f"  round {r}, client {k}: {per_client[k]:.1f} s, loss {losses[k]:.4f}", flush=True)
        if a.mode == "bounded":
            oargs.local_epoch = saved_epochs
        t = time.perf_counter()
        learner.server.aggregation(clients, learner.ent_freq_mat)
        agg_s = time.perf_counter() - t
        wall, cpu = time.perf_counter() - w0, cpu_seconds() - cpu0
        rec = {"round": r, "clients_s": [per_client[k] for k in range(3)], "send_s": send_s,
               "aggregation_s": agg_s, "wall_s": wall, "cpu_s": cpu,
               "loss": float(np.mean(list(losses.values()))), "order": sample_set.tolist()}
        if a.mode == "full":
            print(f"round {r}: clients {fmt3(rec['clients_s'])} s, send_emb {send_s:.3f} s, "
                  f"aggregation {agg_s:.3f} s, round {wall:.1f} s ({cpu:.1f} s process CPU), "
                  f"loss {rec['loss']:.4f}, peak RSS {peak_rss_mib():.0f} MiB", flush=True)
        else:
            means, meds, loads, extra_mean, extra_med = [], [], [], 0.0, 0.0
            for k in range(3):
                b = bounded[k]
                per_round = bpe[k] * a.local_epochs
                mean = statistics.fmean(b.times)
                med = statistics.median(b.times[1:] if len(b.times) > 1 else b.times)
                means.append(mean)
                meds.append(med)
                loads.append(statistics.fmean(b.load))
                extra_mean += mean * per_round
                extra_med += med * per_round
            rec.update(mean_s_per_batch=means, median_s_per_batch_2_to_N=meds, load_s_per_batch=loads,
                       batches_per_round=[b * a.local_epochs for b in bpe],
                       extrapolated_round_s=extra_mean + send_s + agg_s,
                       extrapolated_round_s_from_medians=extra_med + send_s + agg_s)
            print(f"bounded round: {a.batches} batches per client (clients 0 / 1 / 2)", flush=True)
            print(f"  mean s/batch:               {fmt3(means)}", flush=True)
            print(f"  median s/batch (2..N):      {fmt3(meds)}", flush=True)
            print(f"  of which loading/sampling:  {fmt3(loads)}", flush=True)
            print(f"  send_emb {send_s:.3f} s, aggregation {agg_s:.3f} s", flush=True)
            print(f"  batches per full round:     {' / '.join(str(b * a.local_epochs) for b in bpe)}", flush=True)
            print(f"  extrapolated full round:    {rec['extrapolated_round_s']:.1f} s "
                  f"({rec['extrapolated_round_s_from_medians']:.1f} s from the medians)", flush=True)
        records["rounds"].append(rec)

    if a.eval_limit > 0:
        learner.send_emb()
        per_batch, extrap = [], 0.0
        for k, c in enumerate(clients):
            real = c.test_dataloader
            c.test_dataloader = BoundedLoader(real, min(a.eval_limit, tbatches[k]))
            t = time.perf_counter()
            try:
                c.client_eval(istest=True)
            finally:
                c.test_dataloader = real
            s = (time.perf_counter() - t) / min(a.eval_limit, tbatches[k])
            per_batch.append(s)
            extrap += s * tbatches[k]
        records["eval_limited"] = {"batches": a.eval_limit, "s_per_batch": per_batch,
                                   "test_batches": tbatches, "extrapolated_s": extrap}
        print(f"test eval, {a.eval_limit} batches of 16 per client: {fmt3(per_batch)} s/batch; "
              f"{' / '.join(map(str, tbatches))} batches -> extrapolated full test eval {extrap:.1f} s",
              flush=True)

    if a.eval_full:
        ev_times, ev_res = {}, {}
        for k, c in enumerate(clients):  # time FedE.evaluate's per-client calls
            def timed(istest=False, _c=c, _k=k, _orig=c.client_eval):
                t0 = time.perf_counter()
                res = _orig(istest)
                ev_times[_k] = time.perf_counter() - t0
                ev_res[_k] = dict(res)
                return res
            c.client_eval = timed
        cpu0, t = cpu_seconds(), time.perf_counter()
        res = learner.evaluate(istest=True)
        eval_s, eval_cpu = time.perf_counter() - t, cpu_seconds() - cpu0
        for c in clients:
            del c.client_eval
        res = {k: float(v) for k, v in res.items()}
        records["eval_full"] = {"s": eval_s, "cpu_s": eval_cpu, "clients_s": [ev_times[k] for k in range(3)],
                                "clients": [ev_res[k] for k in range(3)], "weighted": res}
        print(f"full official test eval: {eval_s:.1f} s ({eval_cpu:.1f} s process CPU), "
              f"clients {' / '.join(f'{ev_times[k]:.1f}' for k in range(3))} s", flush=True)
        mrrs = " / ".join(f"{ev_res[k]['mrr']:.4f}" for k in range(3))
        print(f"  test MRR {mrrs}, weighted {res['mrr']:.4f}; "
              f"weighted H@1 {res['hits@1']:.4f}, H@5 {res['hits@5']:.4f}, H@10 {res['hits@10']:.4f}", flush=True)

    records["peak_rss_mib"] = peak_rss_mib()
    records["cpu_s_total"] = cpu_seconds()
    print(f"peak RSS {records['peak_rss_mib']:.0f} MiB; process CPU {records['cpu_s_total']:.1f} s", flush=True)
    if a.json_out:
        write_json(a.json_out, records)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
