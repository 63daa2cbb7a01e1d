#!/usr/bin/env python
"""What each alignment learns on synthetic tasks with a hidden rotation ``R``.

Two tasks (``--task``):

* ``mean`` -- ``tests/test_ppat.py``'s: ``X`` a cloud around a mean of norm 3, ``Y = X R^T +
  noise``; PPAT's two-timescale setting (identity start, generator SGD 0.002 without
  momentum, MUSE's beta 0.01, small discriminators). Prints ``‖W − R‖/‖R‖``, the mean
  cosine of ``W x_i`` and ``y_i``, and the same on centred rows.
* ``clusters`` (default) -- zero-mean and anisotropic: ``X`` drawn from 6 Gaussian
  clusters (d = 8, m = 512), centred and scaled per axis, ``Y = X R^T + noise``. The mean
  direction gives nothing here; only the shape of the distribution identifies ``R``.
  Methods (``--methods``): ``ppat`` (PPAT without privacy noise, lambda = 100, MUSE's
  recipe: label smoothing 0.1, input dropout 0.1, orthogonalisation; generator SGD 0.01,
  momentum 0.9; ``--epochs``), ``gan`` (a plain MUSE-style GAN with no PATE at all: one
  discriminator on real vs generated rows, 5 discriminator steps per generator step,
  ``--iterations``), ``supervised`` (the supervised DP alignment of
  ``lightning_fedkg/methods/fkge/supervised.py``, plain Procrustes at epsilon 1, 4, 10, 16
  and exact; with ``--epsilon``, plain and whitened at that epsilon with the first-order
  predicted error of each beside the measured one).
  Prints ``‖W − R‖/‖R‖`` from W's start to the end (a random rotation: ~1.41) and, for
  PPAT, the share of teacher votes fooled in the last epoch.

``ppat_module``: PPAT as a LightningModule trained by ``lightning.Trainer``
(:mod:`lightning_fedkg.methods.fkge.ppat_module`), the ``ppat`` settings, ``--set`` as there.
``pate``: what PATE's labels say and cost at T teachers and noise lambda (``--rows`` labels).

Diagnostics of why PPAT does not find ``R`` (clusters task):

* ``feedback`` -- PPAT's game with the student removed: the generator follows the mean over
  teachers of each teacher's gradient of ``-log D(G(x))`` on the batch, each teacher's
  ``[B, d]`` block clipped to norm ``--clip``, plus Gaussian noise of std
  ``z * 2 clip / T`` (one teacher's partition changes one block: sensitivity ``2 clip / T``;
  ``z`` calibrated so the run's releases cost ``--epsilon`` at delta 1e-5; no
  ``--epsilon``: no noise). Teachers see every fake; generator SGD without momentum.
* ``moments`` -- a pair-free start from the host's released moments: the eigenvectors of
  ``sum y y^T`` over its unit rows and the third moment along each, both with Gaussian noise
  (``--epsilon`` split over the two releases); the client matches its own eigenvectors, the
  signs from the third moments.

    python scripts/benchmarks/bench_ppat_synthetic.py --task clusters --seeds 0 1 2 3 4
    python scripts/benchmarks/bench_ppat_synthetic.py --methods supervised --epsilon 10 --rows 512 --seeds 5
    python scripts/benchmarks/bench_ppat_synthetic.py --task mean --seeds 0 1 2 3 4 --lam 100
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch
import torch.nn.functional as F

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def hidden_rotation(seed: int, m: int, d: int) -> torch.Tensor:
    """The ``R`` of ``_rotated_pair(seed)``: the same draws in the same order."""
    g = torch.Generator().manual_seed(seed)
    torch.randn(d, generator=g)
    torch.randn(m, d, generator=g)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    return q * torch.sign(torch.diagonal(r))


def haar(d: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def clusters_task(seed: int, m: int = 512, d: int = 8, k: int = 6):
    """``(X, Y, R)``: zero-mean, anisotropic, clustered ``X``; ``Y = X R^T + 0.05 noise``."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 2.0
    x = centres[torch.randint(0, k, (m,), generator=g)] + 0.3 * torch.randn(m, d, generator=g)
    x = (x - x.mean(0)) * torch.linspace(0.5, 1.5, d)
    rot = haar(d, g)
    return x, x @ rot.T + 0.05 * torch.randn(m, d, generator=g), rot


def error(w: torch.Tensor, rot: torch.Tensor) -> float:
    return float((w - rot).norm() / rot.norm())


def polar(a: torch.Tensor) -> torch.Tensor:
    """The orthogonal factor of ``a`` (nearest orthogonal matrix)."""
    u, _, vh = torch.linalg.svd(a)
    return u @ vh


def start_matrix(seed: int, start: str, rot: torch.Tensor) -> torch.Tensor | None:
    """W0 for ``--start``: ``None`` keeps the client's Haar-random ``orthogonal`` draw;
    ``truth`` is R itself; ``near`` is the nearest rotation to R + 0.12 G (G Gaussian,
    drawn from ``seed + 200``), about 0.3 from R."""
    if start == "orthogonal":
        return None
    if start == "truth":
        return rot.clone()
    if start == "near":
        g = torch.Generator().manual_seed(seed + 200)
        return polar(rot + 0.12 * torch.randn(*rot.shape, generator=g))
    raise ValueError(start)


def run_ppat_clusters(seed: int, epochs: int, start: str = "orthogonal", diagnose: dict | None = None,
                      **options) -> tuple[float, float, float, float]:
    """PPAT on the clusters task: ``(start error, end error, fooled first epoch, fooled last)``.
    ``options`` override the PPAT settings below (the ablations of ``--variant``)."""
    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat

    x, y, rot = clusters_task(seed)
    client_kw = dict(init="orthogonal", lr=0.01, momentum=0.9, orthogonalize=0.01, seed=seed + 100)
    host_kw = dict(hidden=64, lam=100.0, seed=seed, noise_seed=seed, smoothing=0.1, dropout=0.1)
    client_kw.update({k[2:]: v for k, v in options.items() if k.startswith("g_")})
    host_kw.update({k: v for k, v in options.items() if not k.startswith("g_")})
    client = PPATClient(x, **client_kw)
    host = PPATHost(y, **host_kw)
    w0 = start_matrix(seed, start, rot)
    if w0 is not None:
        with torch.no_grad():
            client.w.copy_(w0)
    begin = error(client.w.detach(), rot)
    torch.manual_seed(seed)  # dropout draws from the global generator, which torch seeds from the OS
    out = run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
    if diagnose is not None:
        diagnose.update(teacher_memory(host, client.translate(x)))
    return begin, error(client.w.detach(), rot), out["epochs"][0]["teachers_fooled"], out["epochs"][-1]["teachers_fooled"]


@torch.no_grad()
def teacher_memory(host, fake: torch.Tensor) -> dict:
    """Do the teachers memorise their rows? The share of real rows a teacher calls real among
    its own partition and among the other teachers' rows (never its training data), and the
    share of the final fakes it calls fake; means over teachers."""
    host.teachers.eval()
    own = other = fakes = 0.0
    for i, teacher in enumerate(host.teachers):
        real = torch.sigmoid(teacher(host.y).squeeze(-1)) > 0.5
        mine = host.row_teacher == i
        own += real[mine].float().mean().item()
        other += real[~mine].float().mean().item() if (~mine).any() else float("nan")
        fakes += (torch.sigmoid(teacher(fake).squeeze(-1)) <= 0.5).float().mean().item()
    host.teachers.train()
    t = host.num_teachers
    return {"own": own / t, "other": other / t, "fakes": fakes / t}


def run_ppat_restarts_clusters(seed: int, epochs: int, starts: int, **options) -> str:
    """PPAT from ``starts`` starts in both components of O(d), the restart chosen by the
    host's pair-free fit (:mod:`lightning_fedkg.methods.fkge.restarts`)."""
    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.restarts import restart_start, run_ppat_restarts

    x, y, rot = clusters_task(seed)
    client_kw = dict(lr=0.01, momentum=0.9, orthogonalize=0.01)
    host_kw = dict(hidden=64, lam=100.0, seed=seed, noise_seed=seed, smoothing=0.1, dropout=0.1)
    client_kw.update({k[2:]: v for k, v in options.items() if k.startswith("g_")})
    host_kw.update({k: v for k, v in options.items() if not k.startswith("g_")})
    torch.manual_seed(seed)  # dropout: see run_ppat_clusters
    out = run_ppat_restarts(x, y, starts, Channel(), client_kw, host_kw, epochs=epochs, seed=seed + 100)
    begin = min(error(restart_start(x.shape[1], k, seed + 100), rot) for k in range(starts))
    return (f"restarts: nearest start {begin:.3f}, chosen #{out['chosen']} -> "
            f"{error(out['client'].w.detach(), rot):.3f}")


def run_plain_gan(seed: int, iterations: int, batch: int = 64, steps: int = 5, start: str = "orthogonal") -> tuple[float, float]:
    from lightning_fedkg.methods.fkge.ppat import initial_generator, discriminator

    x, y, rot = clusters_task(seed)
    torch.manual_seed(seed)
    w0 = start_matrix(seed, start, rot)
    w = torch.nn.Parameter(initial_generator(x.shape[1], "orthogonal", seed + 100) if w0 is None else w0)
    disc = discriminator(x.shape[1], 256, dropout=0.1)
    d_opt, g_opt = torch.optim.SGD(disc.parameters(), lr=0.1), torch.optim.SGD([w], lr=0.1)
    g = torch.Generator().manual_seed(seed)
    start = error(w.detach(), rot)
    for _ in range(iterations):
        for _ in range(steps):
            xb = x[torch.randint(0, len(x), (batch,), generator=g)]
            yb = y[torch.randint(0, len(y), (batch,), generator=g)]
            logits = disc(torch.cat([yb, (xb @ w.T).detach()])).squeeze(-1)
            target = torch.cat([torch.full((batch,), 0.9), torch.full((batch,), 0.1)])
            loss = F.binary_cross_entropy_with_logits(logits, target)
            d_opt.zero_grad()
            loss.backward()
            d_opt.step()
        xb = x[torch.randint(0, len(x), (batch,), generator=g)]
        disc.eval()
        loss = F.binary_cross_entropy_with_logits(disc(xb @ w.T).squeeze(-1), torch.ones(batch))
        disc.train()
        g_opt.zero_grad()
        loss.backward()
        g_opt.step()
        with torch.no_grad():
            cur = w.detach().clone()
            w.copy_(1.01 * cur - 0.01 * (cur @ cur.T) @ cur)
    return start, error(w.detach(), rot)


def run_supervised(seed: int, epsilon: float | None, m: int = 512, power: float | None = 0.0) -> dict:
    """The supervised release on the clusters task, the host's release as in a federation
    (:class:`AlignmentHost`, exact calibration, replace-one): the client's rows whitened by
    ``power`` (None: the power with the smallest predicted error) and decoded by
    :func:`decode`. Returns the start and end errors, the power, sigma and the first-order
    predicted error for the actual singular values."""
    from lightning_fedkg.federated.message import Message
    from lightning_fedkg.methods.fkge.supervised import (CROSSCOV, ROWS, AlignmentHost, decode, precondition,
                                                         predicted_error, unit_rows, whitening_power)

    x, y, rot = clusters_task(seed, m=m)
    w0 = haar(x.shape[1], torch.Generator().manual_seed(seed + 100))
    z = unit_rows(x @ w0.T)
    if power is None:
        power = 0.0 if epsilon is None else whitening_power(z)
    sent, b = precondition(z, power)
    host = AlignmentHost(y, epsilon, noise_seed=seed)
    reply = host.on_rows(Message(arrays={ROWS: sent}))
    w = decode(reply.arrays[CROSSCOV], b, power) @ w0
    return {"start": error(w0, rot), "error": error(w, rot), "power": power, "sigma": host.sigma,
            "predicted": predicted_error(b, host.sigma, weighted=power > 0)}


def nn_fit(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    """Pair-free fit of ``W``: mean squared distance from each ``W x_i`` to its nearest
    ``y_j``, plus the same from each ``y_j`` to its nearest ``W x_i`` (a Chamfer distance;
    uses no pairs). Scored by whoever holds ``Y`` and the translated rows: the host."""
    dist = torch.cdist(x @ w.T, y).square()
    return float(dist.min(dim=1).values.mean() + dist.min(dim=0).values.mean())


def refine(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, iterations: int = 10) -> torch.Tensor:
    """MUSE-style refinement (Conneau et al., ICLR 2018) without pairs: mutual nearest
    neighbours of ``W X`` and ``Y``, then orthogonal Procrustes on them, iterated."""
    for _ in range(iterations):
        dist = torch.cdist(x @ w.T, y)
        fwd, back = dist.argmin(dim=1), dist.argmin(dim=0)
        mutual = back[fwd] == torch.arange(len(x))
        if not mutual.any():
            break
        xs, ys = x[mutual], y[fwd[mutual]]
        w = polar(ys.T @ xs)  # argmin_Q ||Q xs - ys|| over O(d)
    return w


def run_refine(seed: int, starts: int) -> str:
    """Findings 2 and 3: the pair-free criterion at R and at random rotations; refinement
    from ``starts`` Haar-random starts (both components of O(d): Haar draws det = -1 half
    the time) and the restart chosen by :func:`nn_fit` alone; and W0's own refinement."""
    x, y, rot = clusters_task(seed)
    g = torch.Generator().manual_seed(seed + 300)
    draws = [haar(x.shape[1], g) for _ in range(starts)]
    random_fit = min(nn_fit(q, x, y) for q in draws)
    refined = [refine(q, x, y) for q in draws]
    errors = [error(w, rot) for w in refined]
    chosen = min(range(starts), key=lambda i: nn_fit(refined[i], x, y))
    w0 = initial_generator_of(seed, x.shape[1])
    return (
        f"det R {torch.linalg.det(rot):+.0f}, det W0 {torch.linalg.det(w0):+.0f}; "
        f"fit at R {nn_fit(rot, x, y):.3f}, best of {starts} random {random_fit:.2f}; "
        f"refined within 0.1 of R: {sum(e < 0.1 for e in errors)}/{starts}; "
        f"chosen by fit {errors[chosen]:.3f}; W0 refined {error(refine(w0, x, y), rot):.3f}"
    )


def initial_generator_of(seed: int, d: int) -> torch.Tensor:
    from lightning_fedkg.methods.fkge.ppat import initial_generator

    return initial_generator(d, "orthogonal", seed + 100)


def run_feedback(seed: int, epochs: int, start: str, epsilon: float | None, teachers: int, clip: float,
                 batch_size: int = 32, lr: float = 0.01) -> str:
    """``--methods feedback``: the generator follows the teachers' clipped, noised mean gradient."""
    import math

    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.federated.message import Message
    from lightning_fedkg.privacy.mechanisms.gaussian import calibrate_gaussian_noise
    from lightning_fedkg.methods.fkge.ppat import FAKE, GRAD, PPATClient, PPATHost, run_ppat

    x, y, rot = clusters_task(seed)
    releases = epochs * math.ceil(len(x) / batch_size)
    z = 0.0 if epsilon is None else calibrate_gaussian_noise(epsilon, 1e-5, steps=releases)

    class TeacherFeedbackHost(PPATHost):
        def on_fake(self, message):
            super().on_fake(message)  # the teachers' step (the student's is unused)
            fake = message.arrays[FAKE].float()
            self.teachers.eval()
            blocks = []
            for teacher in self.teachers:
                f = fake.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(F.softplus(-teacher(f).squeeze(-1)).sum(), f)
                blocks.append(g * min(1.0, clip / max(float(g.norm()), 1e-12)))
            self.teachers.train()
            mean = torch.stack(blocks).mean(0)
            noise = torch.randn(mean.shape, generator=self.noise, dtype=torch.float64).float()
            return Message(arrays={GRAD: (mean + z * 2 * clip / len(blocks) * noise) / len(fake)})

    client = PPATClient(x, init="orthogonal", lr=lr, momentum=0.0, orthogonalize=0.01, seed=seed + 100)
    host = TeacherFeedbackHost(y, num_teachers=teachers, hidden=64, lam=100.0, seed=seed, noise_seed=seed,
                               smoothing=0.1, dropout=0.1, teacher_fakes="all")
    w0 = start_matrix(seed, start, rot)
    if w0 is not None:
        with torch.no_grad():
            client.w.copy_(w0)
    begin = error(client.w.detach(), rot)
    torch.manual_seed(seed)  # dropout: see run_ppat_clusters
    run_ppat(client, host, Channel(), epochs=epochs, batch_size=batch_size, seed=seed)
    eps = "no noise" if epsilon is None else f"epsilon {epsilon:g} (z {z:.2f}, {releases} releases)"
    return f"teacher feedback, {teachers} teachers, {eps}: {begin:.3f} -> {error(client.w.detach(), rot):.3f}"


def run_moments(seed: int, epsilon: float | None, m: int = 512) -> str:
    """``--methods moments``: the pair-free start from the host's noised second and third moments."""
    from lightning_fedkg.privacy.mechanisms.gaussian import calibrate_gaussian_noise

    x, y, rot = clusters_task(seed, m=m)
    # per release: sum of unit rank-ones (replace-one sensitivity sqrt 2) and the vector of
    # third moments along the released eigenvectors (replace-one sensitivity 2)
    z = 0.0 if epsilon is None else calibrate_gaussian_noise(epsilon, 1e-5, steps=2)
    g = torch.Generator().manual_seed(seed + 7)

    def axes(rows, noise2=0.0, noise3=0.0):
        rows = (rows / rows.norm(dim=1, keepdim=True)).double()
        second = rows.T @ rows
        if noise2:
            upper = torch.randn(second.shape, generator=g, dtype=torch.float64).triu()
            second = second + noise2 * (upper + upper.triu(1).T)
        vectors = torch.linalg.eigh(second).eigenvectors.flip(1)
        third = ((rows @ vectors) ** 3).sum(0)
        return vectors, third + noise3 * torch.randn(third.shape, generator=g, dtype=torch.float64)

    uy, ty = axes(y, z * 2 ** 0.5, z * 2.0)
    ux, tx = axes(x)
    w = ((uy * torch.sign(tx) * torch.sign(ty)) @ ux.T).float()
    eps = "no noise" if epsilon is None else f"epsilon {epsilon:g}"
    return f"moments start (m {m}, {eps}): {error(w, rot):.3f}"


def rotated_pair_of_the_tests():
    """``_rotated_pair`` of tests/test_ppat.py (the ``mean`` task's data), loaded from that file."""
    spec = importlib.util.spec_from_file_location("test_ppat", REPO / "tests" / "test_ppat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._rotated_pair
def run_ppat_module(seed: int, epochs: int, start: str = "orthogonal", **options) -> str:
    """PPAT as a LightningModule (:class:`~lightning_fedkg.methods.fkge.ppat_module.PPATModule`)
    trained by a plain ``lightning.Trainer``, the same settings as ``--methods ppat``."""
    from lightning_fedkg.methods.fkge.ppat_module import PPATModule, fit_ppat

    x, y, rot = clusters_task(seed)
    client_kw = dict(init="orthogonal", lr=0.01, momentum=0.9, orthogonalize=0.01, seed=seed + 100)
    host_kw = dict(hidden=64, lam=100.0, seed=seed, noise_seed=seed, smoothing=0.1, dropout=0.1)
    client_kw.update({k[2:]: v for k, v in options.items() if k.startswith("g_")})
    host_kw.update({k: v for k, v in options.items() if not k.startswith("g_")})
    module = PPATModule(x, y, client_kw=client_kw, host_kw=host_kw, seed=seed)
    w0 = start_matrix(seed, start, rot)
    if w0 is not None:
        with torch.no_grad():
            module.w.copy_(w0)
    begin = error(module.w.detach(), rot)
    torch.manual_seed(seed)  # dropout: see run_ppat_clusters
    trainer = fit_ppat(module, epochs)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return (f"PPAT module (lambda {host_kw['lam']:g}, {host_kw.get('num_teachers', 4)} teachers) {begin:.3f} -> "
            f"{error(module.w.detach(), rot):.3f} (last epoch: fooled {m['teachers_fooled']:.2f}, label agreement "
            f"{m.get('agreement', float('nan')):.2f}; epsilon {m['epsilon']:.3g}, data-dependent "
            f"{m['epsilon_data_dependent']:.3g} (not private))")


def pate_table(labels: int = 512, delta: float = 1e-5) -> None:
    """``--methods pate``: what PATE's labels say and cost. For T teachers voting unanimously
    (the best case: vote gap T), the chance that the noisy label ``argmax(n + Lap(1/lambda))``
    is the teachers' plurality, ``1 - (2 + lambda T) / (4 e^{lambda T})`` (PATE's q), and the
    epsilon of ``labels`` such labels: data-independent (the guarantee) and data-dependent
    (PATE Thm 3 at gap T; not itself private)."""
    import math

    from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant

    print(f"{labels} labels (and 30 epochs of them), delta {delta:g}, unanimous teachers (gap T)")
    print(f"{'T':>5} {'lambda':>7} {'T*lambda':>9} {'agreement':>10} {'epsilon':>10} {'data-dependent':>15} "
          f"{'30 epochs':>10}")
    for teachers in (4, 16, 64, 256, 320):
        for lam in (0.01, 0.05, 0.2, 1.0):
            x = lam * teachers
            agree = 1 - min(0.5, (2 + x) / (4 * math.exp(x)))
            acc = PateMomentsAccountant(lam, delta=delta)
            acc.accumulate(torch.full((labels,), teachers))
            epochs = PateMomentsAccountant(lam, delta=delta)
            epochs.accumulate(torch.full((30 * labels,), teachers))
            print(f"{teachers:>5} {lam:>7g} {x:>9.2f} {agree:>10.3f} {acc.epsilon_data_independent():>10.2f} "
                  f"{acc.epsilon():>15.2f} {epochs.epsilon_data_independent():>10.2f}")


def mean_task(seeds, lam: float, epochs: int) -> None:
    _rotated_pair = rotated_pair_of_the_tests()

    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat

    print(f"{'seed':>4}  {'|W-R|/|R|':>17}  {'cosine':>17}  {'centred cosine':>17}")
    for seed in seeds:
        x, y = _rotated_pair(seed)
        rotation = hidden_rotation(seed, *x.shape)
        client = PPATClient(x, init="identity", lr=0.002, momentum=0.0, orthogonalize=0.01, seed=seed)
        host = PPATHost(y, hidden=32, lam=lam, seed=seed, noise_seed=seed)

        def stats():
            w, t = client.w.detach(), client.translate(x)
            centred = F.cosine_similarity(t - t.mean(0), y - y.mean(0), dim=1).mean().item()
            return error(w, rotation), F.cosine_similarity(t, y, dim=1).mean().item(), centred

        before = stats()
        run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
        after = stats()
        print(f"{seed:>4}  " + "  ".join(f"{b:>7.3f} -> {a:>6.3f}" for b, a in zip(before, after)))


def overrides(pairs: list[str]) -> dict:
    """``["num_teachers=1", "g_momentum=0"]`` -> ``{"num_teachers": 1, "g_momentum": 0}``."""
    out = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                pass
        out[key] = {"True": True, "False": False}.get(value, value) if isinstance(value, str) else value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["clusters", "mean"], default="clusters")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                        help="the seeds (two or more), or one number N: seeds 0 .. N-1")
    parser.add_argument("--lam", type=float, default=100.0, help="mean task: PATE noise parameter")
    parser.add_argument("--epochs", type=int, default=None, help="PPAT epochs (mean: 18, clusters: 30)")
    parser.add_argument("--iterations", type=int, default=3000, help="plain GAN generator steps")
    parser.add_argument("--methods", default="ppat,gan,supervised",
                        help="any of ppat,ppat_module,gan,supervised,refine,restarts,feedback,moments,pate; "
                             "teachers (with ppat): memorisation check")
    parser.add_argument("--epsilon", type=float, default=None,
                        help="feedback, moments, supervised: privacy budget (none: no noise; supervised: "
                             "the table at 1, 4, 10, 16 and exact)")
    parser.add_argument("--whiten", type=float, default=None,
                        help="supervised with --epsilon: the whitening power (default: the one with the smallest "
                             "predicted error)")
    parser.add_argument("--teachers", type=int, default=4, help="feedback: teachers")
    parser.add_argument("--clip", type=float, default=1.0, help="feedback: norm bound of each teacher's gradient block")
    parser.add_argument("--rows", type=int, default=512, help="moments, supervised: rows of the task")
    parser.add_argument("--start", choices=["orthogonal", "truth", "near"], default="orthogonal",
                        help="clusters: W0 for PPAT and the GAN (Haar-random, R, or about 0.3 from R)")
    parser.add_argument("--starts", type=int, default=200, help="refine, restarts: random restarts")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="clusters: override a PPATHost argument, or a PPATClient one as g_KEY "
                             "(e.g. num_teachers=1 g_momentum=0)")
    args = parser.parse_args()
    if len(args.seeds) == 1:  # a count
        if args.seeds[0] < 1:
            parser.error("--seeds N needs N >= 1 (or list two or more seeds)")
        args.seeds = list(range(args.seeds[0]))
    torch.set_num_threads(1)
    if args.task == "mean":
        mean_task(args.seeds, args.lam, args.epochs or 18)
        return 0
    methods = args.methods.split(",")
    if "pate" in methods:
        pate_table(args.rows)
        methods.remove("pate")
        if not methods:
            return 0
    for seed in args.seeds:
        parts = []
        if "ppat" in methods:
            memory = {} if "teachers" in methods else None
            start, end, first, fooled = run_ppat_clusters(seed, args.epochs or 30, args.start, memory,
                                                          **overrides(args.set))
            parts.append(f"PPAT {start:.3f} -> {end:.3f} (fooled {first:.2f} -> {fooled:.2f})")
            if memory:
                parts.append(f"teachers call real: own rows {memory['own']:.2f}, other teachers' rows "
                             f"{memory['other']:.2f}; call the final fakes fake {memory['fakes']:.2f}")
        if "ppat_module" in methods:
            parts.append(run_ppat_module(seed, args.epochs or 30, args.start, **overrides(args.set)))
        if "restarts" in methods:
            parts.append(run_ppat_restarts_clusters(seed, args.epochs or 30, args.starts, **overrides(args.set)))
        if "gan" in methods:
            start, end = run_plain_gan(seed, args.iterations, start=args.start)
            parts.append(f"plain GAN {start:.3f} -> {end:.3f}")
        if "supervised" in methods and args.epsilon is None:
            cells = [f"{eps if eps else 'exact'}: {run_supervised(seed, eps, args.rows)['error']:.3f}"
                     for eps in (1.0, 4.0, 10.0, 16.0, None)]
            parts.append("supervised, plain Procrustes " + ", ".join(cells))
        if "feedback" in methods:
            parts.append(run_feedback(seed, args.epochs or 30, args.start, args.epsilon, args.teachers, args.clip))
        if "moments" in methods:
            parts.append(run_moments(seed, args.epsilon, args.rows))
        if "refine" in methods:
            parts.append(run_refine(seed, args.starts))
        if "supervised" in methods and args.epsilon is not None:  # last: the line ends in error=
            plain = run_supervised(seed, args.epsilon, args.rows, power=0.0)
            best = run_supervised(seed, args.epsilon, args.rows, power=args.whiten)
            parts.append(f"supervised, epsilon {args.epsilon:g} (sigma {best['sigma']:.3f}, replace-one, exact "
                         f"accounting), m {args.rows}: plain Procrustes predicted {plain['predicted']:.3f} "
                         f"error {plain['error']:.3f}; whitened (power {best['power']:.2f}) "
                         f"predicted={best['predicted']:.3f} error={best['error']:.3f}")
        print(f"seed {seed}: " + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
