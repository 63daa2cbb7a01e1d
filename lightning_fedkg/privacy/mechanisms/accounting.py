"""Differential privacy of uploads: clipping, Gaussian noise, and the privacy spent, from
Google's maintained accountant (``dp-accounting``, the ``[dp]`` extra).

DP-FedAvg's mechanism (McMahan et al., ICLR 2018): each selected client clips its update to
L2 norm ``C`` and Gaussian noise of deviation ``σ·C`` covers it; each upload is one Gaussian
event, with no amplification by sampling (the selection is public). ``neighbours``:
``replace`` (default, sensitivity ``2C``) or ``add_remove`` (``C``); ``unit``: ``client`` or
``row`` (one entity's row, not a triple). What each choice guarantees: docs/privacy.md.
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
