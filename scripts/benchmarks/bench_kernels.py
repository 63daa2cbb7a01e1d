"""Microseconds of the pieces of a shared-negative TransE step (GPU, or ``--cpu``), each in candidate forms.

A recorded FedLU step on an H100 is GPU-bound (``bench_step.py``: replays of cached batches
take as long as Party.fit's batches), so its time is the sum of its kernels. This script
times, at the step's own shapes, the pieces a profile names, each recorded as a CUDA graph
and replayed (so launch overhead is out of the figure):

- the L1 distance of ``B`` queries to ``n`` shared candidates, forward and backward:
  ``torch.cdist`` (today), the same function through ``torch.compile`` (fused kernels that
  never materialise ``[B, n, dim]``), and with ``--cpu`` cdist's forward with only the
  backward compiled (whether its gradients equal cdist's bit for bit is printed), and the
  library's own kernel (``trainer.native_l1``);
- one Adam update of a ``[entities, dim]`` table: capturable ``foreach`` (today) and
  ``fused``.

Prints microseconds per call and each candidate's largest difference from today's form.
``--cpu`` times the same pieces on the CPU instead (``--threads`` threads, eager calls in a
loop; Adam's ``fused`` is then the CPU's fused kernel).

    python scripts/benchmarks/bench_kernels.py                  # FB15k-237-R10 client shapes
    python scripts/benchmarks/bench_kernels.py --entities 12567 # an FB15k-237-Fed3 client
    python scripts/benchmarks/bench_kernels.py --cpu --threads 1 --dim 32 --entities 9796 --replays 50  # a Fed10 client
"""

from __future__ import annotations

import argparse
import sys

from lightning_fedkg.measure import write_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--negatives", type=int, default=256)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--entities", type=int, default=10020)
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--cpu", action="store_true", help="time the pieces on the CPU")
    parser.add_argument("--threads", type=int, default=1, help="with --cpu: torch's intra-op threads")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    import time

    import torch

    if args.cpu:
        torch.set_num_threads(args.threads)
    elif not torch.cuda.is_available():
        print("bench_kernels.py times CUDA kernels; no CUDA device here (--cpu times the CPU's)", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if args.cpu else "cuda")
    gen = torch.Generator(device=dev).manual_seed(0)

    def timed_loop(fn) -> float:
        """Microseconds per call of ``fn`` on the CPU (after three warm-up calls)."""
        for _ in range(3):
            fn()
        start = time.perf_counter()
        for _ in range(args.replays):
            fn()
        return (time.perf_counter() - start) / args.replays * 1e6

    def timed_graph(fn) -> float:
        """Microseconds per replay of ``fn`` recorded as a CUDA graph (after eager warm-up)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.replays * 1000

    timed = timed_loop if args.cpu else timed_graph
    results: dict[str, float] = {}

    # ---- L1 distance to shared candidates, forward + backward
    q = torch.randn(args.batch, args.dim, device=dev, generator=gen, requires_grad=True)
    c = torch.randn(args.negatives, args.dim, device=dev, generator=gen, requires_grad=True)
    g = torch.randn(args.batch, args.negatives, device=dev, generator=gen)

    def cdist_l1(x, y):
        return torch.cdist(x, y, p=1.0, compute_mode="donot_use_mm_for_euclid_dist")

    def broadcast_l1(x, y):
        return (x.unsqueeze(1) - y.unsqueeze(0)).abs().sum(-1)

    forms = {"cdist": cdist_l1, "broadcast": broadcast_l1}
    try:
        forms["compiled"] = torch.compile(broadcast_l1, dynamic=False, fullgraph=True)
        if args.cpu:
            forms["cdist_compiled_backward"] = _cdist_with_compiled_backward(torch)
    except Exception as exc:  # noqa: BLE001 - report and go on with the others
        print(f"torch.compile unavailable: {exc}")
    if args.cpu:  # trainer.native_l1: the library's own kernel (None where it cannot be built)
        from lightning_fedkg.models.kge.native_l1 import kernel_library, native_l1_distances

        if kernel_library() is not None:
            forms["native"] = native_l1_distances
    reference = None
    exact = {}
    for name, fn in forms.items():
        def fwd_bwd(fn=fn):
            q.grad = None
            c.grad = None
            fn(q, c).backward(g)
        try:
            results[f"l1_fwd_bwd_{name}_us"] = timed(fwd_bwd)
            fwd_bwd()
            grads = (q.grad.clone(), c.grad.clone())
            if reference is None:
                reference = grads
            else:
                results[f"l1_{name}_max_grad_diff"] = max(
                    (a - b).abs().max().item() for a, b in zip(grads, reference))
                exact[name] = all(torch.equal(a, b) for a, b in zip(grads, reference))
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: failed: {type(exc).__name__}: {exc}")

    # ---- one Adam update of an entity table and a small relation table
    for impl in ("foreach", "fused"):
        table = torch.nn.Parameter(torch.randn(args.entities, args.dim, device=dev, generator=gen))
        rel = torch.nn.Parameter(torch.randn(240, args.dim, device=dev, generator=gen))
        table.grad = torch.randn_like(table)
        rel.grad = torch.randn_like(rel)
        kwargs = {"capturable": not args.cpu, "foreach": impl == "foreach", "fused": impl == "fused"}
        opt = torch.optim.Adam([table, rel], lr=1e-4, **kwargs)
        try:
            results[f"adam_{impl}_us"] = timed(opt.step)
        except Exception as exc:  # noqa: BLE001
            print(f"adam {impl}: failed: {type(exc).__name__}: {exc}")

    for key, value in results.items():
        print(f"{key:>32}: {value:.4g}")
    for name, same in exact.items():
        print(f"{name} gradients equal cdist's bit for bit: {same}")
    if args.json_out:
        device = f"cpu, {args.threads} thread(s)" if args.cpu else torch.cuda.get_device_name()
        write_json(args.json_out, {"setting": vars(args), "device": device, "results": results})
    return 0


def _cdist_with_compiled_backward(torch):
    """cdist's forward (its values bit for bit) with the backward compiled: each gradient a
    sum of ``grad * sign(difference)`` over the other input's rows, in the order cdist's
    own backward adds them."""
    def grad_first(x, y, g):
        return (torch.sign(x.unsqueeze(1) - y.unsqueeze(0)) * g.unsqueeze(-1)).sum(1)

    compiled = torch.compile(grad_first)

    class CdistL1(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return torch.cdist(x, y, p=1.0)

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            g = g.contiguous()
            return compiled(x, y, g), compiled(y, x, g.t().contiguous())

    return CdistL1.apply


if __name__ == "__main__":
    sys.exit(main())
