"""Differential privacy of uploads: clipping, Gaussian noise, and the privacy spent, from
Google's maintained accountant (``dp-accounting``, the ``[dp]`` extra).

The mechanism is DP-FedAvg's (McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018): each selected client clips its update (the trained rows
minus the rows it downloaded) to L2 norm ``C`` and Gaussian noise of standard deviation
``σ·C`` covers what the server can see. Every round is one Gaussian event of noise
multiplier ``σ`` for each client that uploads in it. No amplification by sampling: the
server's selection is seeded from the run's config, so it is public to the server and to
anyone holding ``config.yaml``, and a sample known to the adversary amplifies nothing; a
round in which a client is not selected releases nothing of its data and costs it nothing.

The neighbouring relation (``federated.dp.neighbours``) says what ε is a guarantee about:

* ``add_remove``: the protected unit's data is present or absent (its clipped update is
  there or is zero): L2 sensitivity ``C``, the relation DP-SGD and DP-FedAvg state.
* ``replace`` (default): the unit's data is replaced by any other: the update moves from
  one point of the clip ball to another, L2 sensitivity ``2C``. The server knows who
  participates and which rows each client holds, so "absent" is not a secret it can be
  kept from; what must stay hidden is *which* data produced the update: replace-one.
  The same σ gives a larger ε (ε 4 under add/remove is 9.06 under replace, 100 rounds).

The unit protected (``federated.dp.unit``):

* ``client``: the whole update of a client is clipped together, so ε covers everything
  the client's data did to its upload in a round: client-level DP.
* ``row``: each uploaded row's update is clipped on its own, so ε covers one row (one
  entity's embedding) of one client; a triple changes the rows of its head and tail and,
  through training, possibly others, so this is *not* a guarantee about triples.
"""

from __future__ import annotations

import math

__all__ = ["require", "epsilon", "calibrate_noise_multiplier", "sensitivity", "ORDERS", "NEIGHBOURS"]

#: Integer Rényi orders (fractional ones make dp-accounting's series warn and drop them).
ORDERS = tuple(range(2, 257))

#: The neighbouring relations, and the L2 sensitivity of a clipped update under each, in units of the clip.
NEIGHBOURS = {"add_remove": 1.0, "replace": 2.0}


def sensitivity(neighbours: str) -> float:
    """The L2 sensitivity of an update clipped to 1 under ``neighbours`` (1 or 2)."""
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"unknown neighbouring relation {neighbours!r}; valid: {', '.join(NEIGHBOURS)}")
    return NEIGHBOURS[neighbours]


def require() -> None:
    """Raise ImportError naming the ``[dp]`` extra unless dp-accounting imports."""
    try:
        import dp_accounting  # noqa: F401
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("federated.dp needs the 'dp' extra (dp-accounting): pip install 'lightning-fedkg[dp]'") \
            from err


def _event(q: float, sigma: float):
    import dp_accounting as dpa

    gaussian = dpa.GaussianDpEvent(float(sigma))
    return gaussian if q >= 1.0 else dpa.PoissonSampledDpEvent(float(q), gaussian)


def _accountant(kind: str):
    import dp_accounting as dpa
    from dp_accounting import pld, rdp

    if kind == "rdp":
        return rdp.RdpAccountant(orders=list(ORDERS))
    if kind == "pld":
        return pld.PLDAccountant()
    raise ValueError(f"unknown accountant {kind!r}; valid: rdp, pld")


def epsilon(events: list[tuple[float, float]], delta: float, accountant: str = "rdp",
            neighbours: str = "add_remove") -> float:
    """ε at ``delta`` of the composition of ``events``, each ``(q, σ)``: a Gaussian of noise
    multiplier σ (noise σ·C on an update clipped to C), Poisson-sampled at rate q when q < 1
    (only for ``add_remove``, the relation dp-accounting's sampled Gaussian is stated in).
    Under ``replace`` each σ counts as σ/2 (sensitivity 2C). 0 for no event; inf for σ = 0."""
    if not events:
        return 0.0
    if any(sigma <= 0 for _, sigma in events):
        return math.inf
    scale = sensitivity(neighbours)
    if scale != 1.0:
        if any(q < 1.0 for q, _ in events):
            raise ValueError("a Poisson-sampled event is accounted only under add_remove")
        events = [(q, sigma / scale) for q, sigma in events]
    acc = _accountant(accountant)
    counts: dict[tuple[float, float], int] = {}
    for q, sigma in events:
        counts[(float(q), float(sigma))] = counts.get((float(q), float(sigma)), 0) + 1
    for (q, sigma), count in counts.items():
        acc.compose(_event(q, sigma), count)
    return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(target_epsilon: float, delta: float, q: float, rounds: int,
                               accountant: str = "rdp", neighbours: str = "add_remove") -> float:
    """The smallest σ whose ``rounds`` events at rate ``q`` spend at most ``target_epsilon``
    under ``neighbours`` (``replace``: twice the add/remove σ)."""
    import dp_accounting as dpa

    scale = sensitivity(neighbours)
    if scale != 1.0 and q < 1.0:
        raise ValueError("a Poisson-sampled event is accounted only under add_remove")
    return scale * float(dpa.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda sigma: dpa.SelfComposedDpEvent(_event(q, sigma), int(rounds)),
        float(target_epsilon), float(delta),
        bracket_interval=dpa.LowerEndpointAndGuess(1e-3, 1.0),
    ))
