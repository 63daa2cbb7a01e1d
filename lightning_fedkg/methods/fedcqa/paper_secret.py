"""FedCQA's own masking of the entity rows (``federated.fedcqa.secret: paper``), for comparison.

Hu et al., "FedCQA: Answering Complex Queries on Multi-Source Knowledge Graphs via
Federated Learning", §4.1, Eq. 2–4. Each client adds one static N(0, 1) mask to its entity
rows, which every other client can compute (here from keyed per-row seeds); the server
holder-averages the masked rows and keeps, per row, which clients contributed last, and
the clients subtract the mean of those masks. It protects much less than the default
``secret: secure``; how it is modelled and what it leaks: docs/methods/fedcqa.md.
"""

from __future__ import annotations

import hashlib
import hmac
import math

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.alignment import hash_names
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import ClientHalf
from lightning_fedkg.seeding import key_from_digest, keyed_uniform

__all__ = ["PaperSecretServer", "PaperSecretClient", "paper_mask", "mask_seeds", "mask_from_seeds",
           "check_paper_config", "CONTRIBUTORS", "CLIENTS"]

#: Suffix of a download's per-row contributor sets (``bool [n_c, K]``) of a masked tensor.
CONTRIBUTORS = "@contributors"
#: The download's column names of the contributor sets (UTF-8, one name a line, as uint8):
#: ``receive`` sees only a message's arrays (``load_evaluation_state`` passes no config).
CLIENTS = "fedcqa@clients"
_DOMAIN = b"lightning_fedkg/fedcqa-paper-mask\x00"


def mask_seeds(key: bytes, client: str, tensor: str, digests: Tensor) -> Tensor:
    """``uint8 [n, 8]``: the per-row seeds of client ``client``'s mask of ``tensor`` on the
    rows whose alignment digests are ``digests`` (one keyed hash per row: the only part of a
    mask that is not tensor code, so callers keep the seeds and redraw masks from them)."""
    prefix = _DOMAIN + client.encode() + b"\x00" + tensor.encode() + b"\x00"
    seeds = bytearray()
    for row in digests.to(torch.uint8).cpu().numpy():
        seeds += hmac.new(key, prefix + row.tobytes(), hashlib.sha256).digest()[:8]
    return torch.frombuffer(seeds, dtype=torch.uint8).reshape(-1, 8) if seeds else torch.zeros(0, 8, dtype=torch.uint8)


def mask_from_seeds(seeds: Tensor, width: int) -> Tensor:
    """``float64 [n, width]`` standard-normal mask rows from :func:`mask_seeds`."""
    if seeds.shape[0] == 0:
        return torch.zeros(0, width, dtype=torch.float64)
    u = keyed_uniform(key_from_digest(seeds), 2 * width)
    # Box–Muller; 1 - u lies in (0, 1], so the logarithm is finite.
    radius = torch.sqrt(-2.0 * torch.log1p(-u[:, :width]))
    return radius * torch.cos(2.0 * math.pi * u[:, width:])


def paper_mask(key: bytes, client: str, tensor: str, digests: Tensor, width: int) -> Tensor:
    """``float64 [n, width]``: client ``client``'s static mask ``E_r`` of tensor ``tensor`` on
    the rows whose alignment digests are ``digests`` (``uint8 [n, 32]``), standard normal.

    Row ``r`` depends only on the federation key, the client's name, the tensor and
    ``digests[r]``, so every holder of the key computes the same mask for any client's
    rows, in any order."""
    return mask_from_seeds(mask_seeds(key, client, tensor, digests), width)


def check_paper_config(cfg) -> None:
    """Raise :class:`ConfigError` unless ``federated.fedcqa.secret=paper`` can run under ``cfg``."""
    fc = cfg.federated
    if fc.secure_aggregation.enabled:
        raise ConfigError("federated.fedcqa.secret=paper is the paper's own masking in place of secure aggregation: "
                          "set federated.secure_aggregation.enabled=false, or federated.fedcqa.secret=secure to "
                          "keep secure aggregation")
    if fc.dp.enabled:
        raise ConfigError("federated.fedcqa.secret=paper does not compose with federated.dp: DP clips the upload "
                          "against the download, and the paper's upload carries the mask")
    if fc.aggregation != "selected_holders":
        raise ConfigError("federated.fedcqa.secret=paper needs federated.aggregation=selected_holders: the damped "
                          "mean mixes rows masked by different sets of clients, which no client can unmask")
    if not fc.federation_key:
        raise ConfigError("federated.fedcqa.secret=paper needs federated.federation_key: the masks come from it, "
                          "and the default key derives from the seed, which the server knows")


def _encode_names(names: list[str]) -> Tensor:
    return torch.tensor(list("\n".join(names).encode("utf-8")), dtype=torch.uint8)


def _decode_names(data: Tensor) -> list[str]:
    return bytes(data.to(torch.uint8).tolist()).decode("utf-8").split("\n")


class PaperSecretServer(HolderMeanServer):
    """Holder-mean of masked entity rows (FedCQA Eq. 2), with each row's contributor set.

    The aggregation itself is :class:`~lightning_fedkg.federated.holder_mean.HolderMeanServer`'s:
    the masked uploads ``E^i + E_r^i`` are averaged over the holders that answered, which
    is linear, so the table holds ``mean(E) + mean(E_r)`` over each row's last contributors.
    Tensors shared whole (the operators) arrive in clear and are FedAvg'd as they are.

    Attributes:
        contributors: ``{tensor: bool [N, K]}`` for every row-indexed tensor: which of
            :attr:`clients` (columns, in order) contributed to the row's last update; a row
            never updated has none (it is the server's initial row, unmasked).
        paper_secret: whether the masking is on (a subclass may run without it).
    """

    paper_secret: bool = True

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.contributors: dict[str, Tensor] = {}

    def masked_tensors(self) -> list[str]:
        """The row-indexed tensors: those the clients mask (the entity rows)."""
        return [t for t in self.table if self.alignments[self.group_of[t]] is not None]

    def aggregate_align(self, replies, failures) -> None:
        super().aggregate_align(replies, failures)
        if self.paper_secret:
            k = len(self.clients)
            self.contributors = {t: torch.zeros(self.table[t].shape[0], k, dtype=torch.bool)
                                 for t in self.masked_tensors()}

    def aggregate_train(self, round, replies, failures) -> None:
        """Eq. 2 on the masked rows, then each updated row's contributors: the holders of
        it that answered. Rows none of them holds keep their value and their set."""
        super().aggregate_train(round, replies, failures)
        if not self.paper_secret:
            return
        for t, current in self.contributors.items():
            now = torch.zeros_like(current)
            for col, name in enumerate(self.clients):
                if name in replies and name in self.holders_of[t]:
                    now[self.client_index(t, name), col] = True
            updated = now.any(dim=1)
            current[updated] = now[updated]

    def rows(self, name: str) -> dict[str, Tensor]:
        """``Ẽ[idx_c]`` as the plain server sends it, plus, per masked tensor, the contributor
        set of each of the client's rows and the names of the columns (every download)."""
        out = super().rows(name)
        if not self.paper_secret:
            return out
        for t in [t for t in out if t in self.contributors]:
            out[f"{t}{CONTRIBUTORS}"] = self.contributors[t][self.client_index(t, name)].clone()
        if any(k.endswith(CONTRIBUTORS) for k in out):
            out[CLIENTS] = _encode_names(self.clients)
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["paper_secret"] = {"contributors": {t: c.clone() for t, c in self.contributors.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        stored = (state.get("paper_secret") or {}).get("contributors", {})
        self.contributors = {t: c.clone() for t, c in stored.items()}


class PaperSecretClient(ClientHalf):
    """Masks its row-indexed uploads with its static ``E_r^i`` and unmasks downloads (FedCQA Eq. 4).

    Upload (training and the ``upload`` stage): ``E^i + E_r^i`` for every row-indexed shared
    tensor, the others (operators) as they are. Download: for each row with contributors
    ``S``, ``Ẽ_row − (1/|S|) Σ_{j∈S} E_r^j[row]`` in float64, which is the plain holder-mean
    of the contributors' rows; a row without contributors is taken as it is.

    Attributes:
        paper_secret: whether the masking is on (a subclass may run without it).
    """

    paper_secret: bool = True

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self._digests: dict[str, Tensor] = {}
        self._own_masks: dict[str, Tensor] = {}  # static: drawn once per tensor
        self._seeds: dict[tuple[str, str], Tensor] = {}  # (peer, tensor): its mask seeds on my rows

    def _row_indexed(self) -> dict[str, str]:
        """``{tensor: index kind}`` of the shared tensors with a row index."""
        return {t: g.index for g in self.shared().values() if g.index is not None for t in g.tensors}

    def _digests_of(self, index: str) -> Tensor:
        if index not in self._digests:
            self._digests[index] = hash_names(self.party.names[index], self._key)
        return self._digests[index]

    def mask(self, client: str, tensor: str, width: int, rows: Tensor | None = None) -> Tensor:
        """``E_r`` of ``client`` for ``tensor`` on this client's rows (``rows``: a bool
        selection of them), ``float64 [n, width]``."""
        index = self._row_indexed()[tensor]
        if client == self.party.name:
            own = self._own_masks.get(tensor)
            if own is None or own.shape[1] != width:
                own = self._own_masks[tensor] = paper_mask(self._key, client, tensor, self._digests_of(index), width)
            return own if rows is None else own[rows]
        if (client, tensor) not in self._seeds:
            self._seeds[client, tensor] = mask_seeds(self._key, client, tensor, self._digests_of(index))
        seeds = self._seeds[client, tensor]
        return mask_from_seeds(seeds if rows is None else seeds[rows], width)

    def _masked(self, reply: Message) -> Message:
        if not self.paper_secret:
            return reply
        arrays = dict(reply.arrays)
        for t in self._row_indexed():
            if t in arrays:
                x = arrays[t]
                flat = x.reshape(x.shape[0], -1)
                masked = flat.to(torch.float64) + self.mask(self.party.name, t, flat.shape[1])
                arrays[t] = masked.to(x.dtype).view(x.shape)
        return Message(arrays=arrays, metrics=reply.metrics, config=reply.config)

    def on_train(self, message: Message, round: int) -> Message:
        return self._masked(super().on_train(message, round))

    def on_upload(self, message: Message, round: int) -> Message:
        return self._masked(super().on_upload(message, round))

    def receive(self, arrays) -> None:
        """Apply a download after removing, row by row, the mean mask of its contributors (Eq. 4)."""
        arrays = dict(arrays)
        names = _decode_names(arrays.pop(CLIENTS)) if CLIENTS in arrays else None
        for key in [k for k in arrays if k.endswith(CONTRIBUTORS)]:
            t, contributors = key[: -len(CONTRIBUTORS)], arrays.pop(key).to(torch.bool)
            if names is None or contributors.shape[1] != len(names):
                raise ValueError(f"{self.party.name}: contributor sets of {t!r} without their client names")
            x = arrays[t]
            value = x.reshape(x.shape[0], -1).to(torch.float64)
            total = torch.zeros_like(value)
            for col in contributors.any(dim=0).nonzero().flatten().tolist():
                rows = contributors[:, col]
                total[rows] += self.mask(names[col], t, value.shape[1], rows)
            counts = contributors.sum(dim=1)
            held = counts > 0
            value[held] -= total[held] / counts[held, None].to(torch.float64)
            arrays[t] = value.to(x.dtype).view(x.shape)
        super().receive(arrays)
