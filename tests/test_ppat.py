"""PPAT (lightning_fedkg.methods.fkge.ppat): what crosses the wire, the generator's gradient, the
PATE labels, the accountant, and that the game moves ``W`` toward a hidden rotation.

Tiny sizes (d = 8, m = 64; m = 256 for the rotation task), small discriminators, one
CPU thread: every test runs in about a second.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import decode
from lightning_fedkg.methods.fkge import PPATClient, PPATHost, run_ppat
from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant

D, M, HIDDEN = 8, 64, 12


def _pair(seed: int = 0, m: int = M, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d, generator=g), torch.randn(m, d, generator=g) + 0.5


def _one_batch(client: PPATClient, host: PPATHost, channel: Channel, rows: torch.Tensor):
    """One PPAT step by hand; returns the delivered fake and gradient messages."""
    fake = channel.send("client", "host", "ppat_fake", client.fake_message(rows), 0)
    grad = channel.send("host", "client", "ppat_grad", host.on_fake(fake), 0)
    client.on_grad(grad)
    return fake, grad


# ----------------------------------------------------------------------------- (1) wire


def test_wire_log_carries_only_generated_batches_and_their_gradients(tmp_path):
    x, y = _pair()
    client = PPATClient(x, seed=1)
    host = PPATHost(y, hidden=HIDDEN, seed=2)
    channel = Channel()
    channel.open_log(tmp_path / "log.jsonl", payload_dir=tmp_path / "payloads")
    out = run_ppat(client, host, channel, epochs=2, batch_size=24)
    channel.close()

    records = channel.records()
    sizes = [24, 24, 16] * 2
    assert out["batches"] == len(sizes) and len(records) == 2 * len(sizes)
    discriminator_shapes = {(HIDDEN, D), (HIDDEN,), (1, HIDDEN), (1,)}
    for i, size in enumerate(sizes):
        up, down = records[2 * i], records[2 * i + 1]
        assert (up.sender, up.receiver, up.name) == ("client", "host", "ppat_fake")
        assert up.shapes == {"ppat_fake": [size, D]} and up.dtypes == {"ppat_fake": "float32"}
        assert up.config == ("rows",) and up.metrics == ()
        assert (down.sender, down.receiver, down.name) == ("host", "client", "ppat_grad")
        assert down.shapes == {"ppat_grad": [size, D]} and down.metrics == () and down.config == ()
        for r in (up, down):  # never a whole table (X, Y: [m, d]) nor a discriminator tensor
            assert all(tuple(s) != (M, D) and tuple(s) not in discriminator_shapes for s in r.shapes.values())
    assert out["bytes"] == sum(2 * s * D * 4 for s in sizes) == channel.total_bytes
    assert out["queries"] == 2 * M

    # Content: no transmitted row is a raw row of X (the default W is a random rotation)
    # or a row of Y.
    payloads = sorted((tmp_path / "payloads").iterdir())
    assert len(payloads) == len(records)
    for path in payloads:
        for rows in decode(path.read_bytes()).arrays.values():
            assert torch.cdist(rows, x).min() > 1e-3 and torch.cdist(rows, y).min() > 1e-3


def test_identity_start_would_send_raw_rows():
    """Why the default start is a random rotation: from W = I (MUSE) the first batch the
    host receives is exactly the client's embeddings."""
    x, y = _pair()
    channel = Channel()
    rows = torch.arange(32)
    fake, _ = _one_batch(PPATClient(x, init="identity"), PPATHost(y, hidden=HIDDEN), channel, rows)
    assert torch.equal(fake.arrays["ppat_fake"], x[rows])
    fake, _ = _one_batch(PPATClient(x, init="orthogonal"), PPATHost(y, hidden=HIDDEN), channel, rows)
    assert not torch.allclose(fake.arrays["ppat_fake"], x[rows], atol=1e-2)


# ----------------------------------------------------------------------------- (2) gradient


@pytest.mark.parametrize("saturating", [False, True])
def test_client_gradient_equals_end_to_end_autograd(saturating):
    """The client's dL_G/dW from the host's [B, d] gradient == autograd through
    student(X_b W^T) in one process, with the student as it was when the host answered."""
    x, y = _pair(3)
    client = PPATClient(x, seed=4)
    host = PPATHost(y, hidden=HIDDEN, seed=5, saturating=saturating)
    channel = Channel()
    for _ in range(3):  # a few steps first, so momentum and a trained student are involved
        _one_batch(client, host, channel, torch.randperm(M)[:32])

    rows = torch.randperm(M, generator=torch.Generator().manual_seed(6))[:32]
    w_before = client.w.detach().clone()
    fake = channel.send("client", "host", "ppat_fake", client.fake_message(rows), 0)
    reply = host.on_fake(fake)
    student = copy.deepcopy(host.student)  # the state the host's gradient came from
    client.on_grad(channel.send("host", "client", "ppat_grad", reply, 0))

    w = w_before.clone().requires_grad_(True)
    logits = student(x[rows] @ w.T).squeeze(-1)
    if saturating:
        loss = torch.log1p(-torch.sigmoid(logits)).mean()  # (1/B) sum log(1 - S(G(x)))
    else:
        loss = -F.logsigmoid(logits).mean()  # (1/B) sum -log S(G(x))
    loss.backward()
    assert torch.allclose(client.w.grad, w.grad, rtol=1e-5, atol=1e-7)
    # ... and it is sum_b grad_b x_b^T of what crossed the wire
    g = reply.arrays["ppat_grad"]
    assert torch.allclose(client.w.grad, g.T @ x[rows], rtol=1e-5, atol=1e-7)
    assert loss.item() == pytest.approx(host.last["loss_generator"], rel=1e-5)


# ----------------------------------------------------------------------------- (3) labels


def test_noise_seed_changes_student_labels_and_parameters_not_teachers():
    """The noisy PATE labels are the student's only supervision: another noise seed gives
    other labels and another student, while the teachers (which never see the noise) and
    the first generated batch are identical."""
    x, y = _pair(7)
    rows = torch.arange(32)
    runs = []
    for noise_seed in (0, 1):
        client = PPATClient(x, seed=8)
        host = PPATHost(y, hidden=HIDDEN, lam=0.05, seed=9, noise_seed=noise_seed)
        fake, grad = _one_batch(client, host, Channel(), rows)
        runs.append((host, fake.arrays["ppat_fake"], grad.arrays["ppat_grad"]))
    (a, fake_a, grad_a), (b, fake_b, grad_b) = runs
    assert torch.equal(fake_a, fake_b)
    assert all(torch.equal(p, q) for p, q in zip(a.teachers.parameters(), b.teachers.parameters()))
    assert torch.equal(a.last["votes"], b.last["votes"])
    assert not torch.equal(a.last["labels"], b.last["labels"])
    assert any(not torch.equal(p, q) for p, q in zip(a.student.parameters(), b.student.parameters()))
    assert not torch.allclose(grad_a, grad_b)


def test_without_noise_labels_are_the_teachers_plurality():
    """lambda = 100 (noise Lap(0.01) on integer votes) and 5 teachers (no ties): every label
    is the plurality of the hard votes, which are recomputed here from the teachers."""
    x, y = _pair(10)
    client = PPATClient(x, seed=11)
    host = PPATHost(y, num_teachers=5, hidden=HIDDEN, lam=100.0, seed=12)
    channel = Channel()
    order = torch.Generator().manual_seed(13)
    for _ in range(3):
        for rows in torch.randperm(M, generator=order).split(32):
            fake = channel.send("client", "host", "ppat_fake", client.fake_message(rows), 0)
            reply = host.on_fake(fake)
            with torch.no_grad():  # teachers as they voted (the student/generator step leaves them)
                real = torch.stack([t(fake.arrays["ppat_fake"]).squeeze(-1) > 0 for t in host.teachers])
            votes = torch.stack([(~real).sum(0), real.sum(0)], dim=1)
            assert torch.equal(host.last["votes"], votes)
            assert torch.equal(host.last["labels"], votes.argmax(dim=1))
            client.on_grad(channel.send("host", "client", "ppat_grad", reply, 0))


# ----------------------------------------------------------------------------- (4) rotation


def _rotated_pair(seed: int, m: int = 256, d: int = D):
    """X: a cloud around a mean of norm 3 (spread 0.7 per coordinate); Y = X R^T + noise
    (0.05) for a Haar-random orthogonal R."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=g)
    x = 3.0 * mu / mu.norm() + 0.7 * torch.randn(m, d, generator=g)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g))
    rot = q * torch.sign(torch.diagonal(r))
    return x, x @ rot.T + 0.05 * torch.randn(m, d, generator=g)


def _aligned_cosine(client: PPATClient, x: torch.Tensor, y: torch.Tensor) -> float:
    return F.cosine_similarity(client.translate(x), y, dim=1).mean().item()


def _rotation_run(seed: int, lam: float, epochs: int = 18) -> tuple[float, float]:
    x, y = _rotated_pair(seed)
    # two-timescale: the generator 10x slower than the discriminators, no momentum;
    # MUSE's identity start and orthogonalisation (see the module docstring)
    client = PPATClient(x, init="identity", lr=0.002, momentum=0.0, orthogonalize=0.01, seed=seed)
    host = PPATHost(y, hidden=32, lam=lam, seed=seed)
    before = _aligned_cosine(client, x, y)
    run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
    return before, _aligned_cosine(client, x, y)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.slow
def test_ppat_moves_w_toward_the_clouds_mean_direction(seed):
    """Mean cosine between W x_i and y_i after 18 epochs (144 batches of 32) with nearly
    noiseless labels (lambda = 100). What this shows is only that W follows the cloud's
    mean direction: the rotation itself is not learnt (‖W − R‖/‖R‖ stays near a random
    rotation's 1.41; scripts/benchmarks/bench_ppat_synthetic.py), which issue 22 reopens. Measured rises, seeds 0-4: 0.50, 0.35, 0.77, 0.29,
    0.17 (from 0.01, -0.02, -0.32, 0.20, -0.14); with two other host / batch-order seeds
    per data seed the smallest of the 15 rises was 0.13. The bar is 0.1.

    A GAN, so not monotone: with m = 128 (32 rows per teacher) or more epochs a run can
    rise and then collapse (the module docstring says why); this size and length did not."""
    before, after = _rotation_run(seed, lam=100.0)
    assert after - before > 0.1, (before, after)


def test_paper_noise_level_drowns_the_signal():
    """The same run at the paper's lambda = 0.05 (4 teachers): a label equals the
    plurality with probability <= 0.55 and W does not move (measured |rise| <= 0.007 for
    seeds 0-4)."""
    before, after = _rotation_run(0, lam=0.05)
    assert abs(after - before) < 0.05, (before, after)


# ----------------------------------------------------------------------------- (5) accountant


def test_epsilon_equals_a_fresh_accountant_fed_the_same_gaps():
    """lambda = 0.5 with 10 teachers, so unanimous votes meet PATE Thm 3's condition and
    the data-dependent branch is exercised; one query per labelled sample."""
    x, y = _pair(14)
    client = PPATClient(x, seed=15)
    host = PPATHost(y, num_teachers=10, hidden=HIDDEN, lam=0.5, seed=16)
    gaps = []
    on_fake = host.on_fake

    def spy(message):
        reply = on_fake(message)
        gaps.append(host.last["gaps"].clone())
        return reply

    host.on_fake = spy
    out = run_ppat(client, host, Channel(), epochs=3, batch_size=20)
    all_gaps = torch.cat(gaps)
    assert out["queries"] == host.accountant.queries == all_gaps.numel() == 3 * M
    assert [e["queries"] for e in out["epochs"]] == [M, 2 * M, 3 * M]
    fresh = PateMomentsAccountant(lam=0.5, delta=1e-5)
    fresh.accumulate(all_gaps)
    assert torch.allclose(host.accountant.log_moments, fresh.log_moments, rtol=1e-12, atol=0)
    assert host.epsilon() == pytest.approx(fresh.epsilon(), rel=1e-12)
    assert out["epsilon"] == host.epsilon() == out["epochs"][-1]["epsilon"]
    valid = 1.0 / (math.exp(2 * 0.5) + 1)  # Thm 3's condition on q, checked by hand
    assert any((2 + 0.5 * g) / (4 * math.exp(0.5 * g)) < valid for g in all_gaps.tolist())


def test_default_config_one_epoch_of_507_alignments():
    """The paper's lambda = 0.05, delta = 1e-5, 4 teachers, batch 32, one epoch over 507
    aligned pairs (the Dbpedia-Lexvo size): 507 queries, and since no 4-teacher vote meets
    Thm 3 usefully, alpha(l) = 507 * 0.005 l (l + 1), so
    eps = min_l (2.535 l (l + 1) + ln 1e5) / l = (15.21 + 11.513) / 2 = 13.36 at l = 2
    (the paper reports 2.73, which by our count is 29 queries: one per batch)."""
    x, y = _pair(17, m=507)
    host = PPATHost(y, hidden=HIDDEN, seed=18)
    out = run_ppat(PPATClient(x, seed=19), host, Channel(), epochs=1)
    assert out["queries"] == 507 and out["batches"] == math.ceil(507 / 32)
    by_hand = min((507 * 0.005 * l * (l + 1) + math.log(1e5)) / l for l in range(1, 18))
    assert out["epsilon"] == pytest.approx(by_hand, rel=1e-9) and round(by_hand, 2) == 13.36
    assert host.accountant.best_order() == 2


def test_budget_stops_before_a_batch_that_could_exceed_it():
    x, y = _pair(20)
    host = PPATHost(y, hidden=HIDDEN, seed=21)
    budget = 8.0  # lambda = 0.05, batches of 32: eps(192 queries) = 7.68, eps(224) = 8.32
    out = run_ppat(PPATClient(x, seed=22), host, Channel(), epochs=10, max_epsilon=budget)
    assert out["stopped"] == "budget" and out["queries"] == 192 and len(out["epochs"]) == 3
    assert host.epsilon() == pytest.approx(7.678, abs=1e-3)
    assert host.epsilon() <= budget < host.epsilon_after(32)


# ----------------------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_continues_identically():
    x, y = _pair(23)

    def build():
        return PPATClient(x, seed=24), PPATHost(y, hidden=HIDDEN, lam=0.5, seed=25)

    client, host = build()
    run_ppat(client, host, Channel(), epochs=1, seed=0)
    states = copy.deepcopy((client.state_dict(), host.state_dict()))
    run_ppat(client, host, Channel(), epochs=1, seed=1)

    client2, host2 = build()
    client2.load_state_dict(states[0])
    host2.load_state_dict(states[1])
    run_ppat(client2, host2, Channel(), epochs=1, seed=1)
    assert torch.equal(client.w, client2.w)
    assert all(torch.equal(p, q) for p, q in zip(host.student.parameters(), host2.student.parameters()))
    assert torch.equal(host.accountant.log_moments, host2.accountant.log_moments)
