"""Differential privacy of uploads: clipping, Gaussian noise, and the privacy spent, from
Google's maintained accountant (``dp-accounting``, the ``[dp]`` extra).

The mechanism is DP-FedAvg's (McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018): each selected client clips its update (the trained rows
minus the rows it downloaded) to L2 norm ``C`` and Gaussian noise of standard deviation
``σ·C`` covers what the server can see. Every round is one Gaussian event of noise
multiplier ``σ``; with ``federated.fraction`` ``q < 1`` a Poisson-sampled one (our
selection draws a fixed number of clients without replacement; the Poisson event is the
standard approximation, as in DP-FedAvg, and says so in ``metrics.json``).

The unit protected (``federated.dp.unit``):

* ``client``: the whole update of a client is clipped together, so ε covers everything
  the client's data did to its upload in a round: client-level DP.
* ``row``: each uploaded row's update is clipped on its own, so ε covers one row (one
  entity's embedding) of one client; a triple changes the rows of its head and tail and,
  through training, possibly others, so this is *not* a guarantee about triples.
"""

from __future__ import annotations

import math

__all__ = ["require", "epsilon", "calibrate_noise_multiplier", "ORDERS"]

#: Integer Rényi orders (fractional ones make dp-accounting's series warn and drop them).
ORDERS = tuple(range(2, 257))


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


def epsilon(events: list[tuple[float, float]], delta: float, accountant: str = "rdp") -> float:
    """ε at ``delta`` of the composition of ``events``, each ``(q, σ)``: a Gaussian of noise
    multiplier σ, Poisson-sampled at rate q when q < 1. 0 for no event; inf for σ = 0."""
    if not events:
        return 0.0
    if any(sigma <= 0 for _, sigma in events):
        return math.inf
    acc = _accountant(accountant)
    counts: dict[tuple[float, float], int] = {}
    for q, sigma in events:
        counts[(float(q), float(sigma))] = counts.get((float(q), float(sigma)), 0) + 1
    for (q, sigma), count in counts.items():
        acc.compose(_event(q, sigma), count)
    return float(acc.get_epsilon(delta))


def calibrate_noise_multiplier(target_epsilon: float, delta: float, q: float, rounds: int,
                               accountant: str = "rdp") -> float:
    """The smallest σ whose ``rounds`` events at rate ``q`` spend at most ``target_epsilon``."""
    import dp_accounting as dpa

    return float(dpa.calibrate_dp_mechanism(
        lambda: _accountant(accountant),
        lambda sigma: dpa.SelfComposedDpEvent(_event(q, sigma), int(rounds)),
        float(target_epsilon), float(delta),
        bracket_interval=dpa.LowerEndpointAndGuess(1e-3, 1.0),
    ))
