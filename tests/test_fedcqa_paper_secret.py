"""FedCQA with the paper's own masking (``federated.fedcqa.secret: paper``, Hu et al. §4.1,
Eq. 2–4): it trains exactly as plain averaging, the server sees masked rows only, one
colluding client unmasks everyone (which secure aggregation prevents), and the config
refuses what cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.aggregation import holder_sums, mean_from_sums
from lightning_fedkg.federated.alignment import federation_key
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.message import decode
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.privacy.secure.protocol import _bytes as secagg_bytes, _offset
from lightning_fedkg.federated.strategy import ClientHalf
from lightning_fedkg.methods.fedcqa import FedCQA
from lightning_fedkg.methods.fedcqa.paper_secret import paper_mask
from lightning_fedkg.privacy.mechanisms import secagg

from test_fedcqa import KEY, cqa_config

pytest.importorskip("cryptography")
#: Many small tensor ops beside other jobs on a small CPU: intra-op threads would mostly wait.
pytestmark = pytest.mark.usefixtures("one_thread")

ENTITY = "entity_emb"
#: Small query sets, sampled once for the module (the federation and its clients are the same throughout).
SMALL = {"task__train_per_type": 150, "task__eval_per_type": 15, "task__cross_per_type": 20, "task__steps_per_epoch": 5}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("paper_secret")


def config(cache, **overrides):
    return cqa_config(cache, **{**SMALL, "federated__strategy": "fedcqa", **overrides})


def paper(cache, **overrides):
    return config(cache, federated__fedcqa__secret="paper", **overrides)


def recording(cfg, where: Path) -> FederatedRun:
    """A run whose Channel keeps every payload under ``where/payloads``."""
    run = FederatedRun(cfg, None)
    where.mkdir(parents=True, exist_ok=True)
    run.channel.open_log(where / "channel_log.jsonl", where / "payloads")
    return run


def uploads(where: Path, round: int) -> dict[str, dict[str, torch.Tensor]]:
    """``{client: arrays}`` of the training uploads of ``round`` the server received."""
    out = {}
    for path in sorted((where / "payloads").glob(f"r{round:04d}_*_to_server_upload.safetensors")):
        sender = path.name.split("_to_server")[0].split("_", 2)[2]
        out[sender] = decode(path.read_bytes()).arrays
    return out


def shared(party) -> dict[str, torch.Tensor]:
    groups = party.module.shareable_groups()
    return {f"{g}/{n}": t.detach().clone() for g in ("entity", "operators") for n, t in groups[g].tensors.items()}


@pytest.mark.slow
def test_paper_secret_trains_as_plain_averaging(cache, monkeypatch):
    """The paper's masking against plain averaging of FedCQA's groups (a plain
    HolderMeanServer), same seed, two of three clients per round (so contributor sets
    differ between rounds and a client evaluates rows others updated).

    Round 1 end to end: every client holds the same rows and operators as the plain run.
    Round 2: the same holds against the plain holder-mean of the very rows the clients
    trained. (The two runs' round-2 fits start from rows that differ by float32 rounding,
    ~1e-7, and a fresh AdamW's first step, lr·g/|g|, turns that into up to lr where a
    gradient is near zero; so two runs are compared one aggregation apart.)"""
    masked = FederatedRun(paper(cache, federated__fraction=0.67), None)
    monkeypatch.setattr(FedCQA, "Server", HolderMeanServer)
    monkeypatch.setattr(FedCQA, "Client", ClientHalf)
    plain = FederatedRun(config(cache, federated__fraction=0.67), None)
    for run in (masked, plain):
        run.train_round(1)
        run.load_evaluation_state(1)
    for a, b in zip(masked.clients, plain.clients):
        got, want = shared(a), shared(b)
        assert got.keys() == want.keys() and f"entity/{ENTITY}" in got
        for name in want:
            assert torch.allclose(got[name], want[name], atol=1e-5, rtol=0), (a.name, name)
    plain.close()

    # round 2, against the plain aggregation of what the selected clients trained
    align = masked.server.alignment
    table = torch.zeros_like(masked.server.table[ENTITY])
    for party in masked.clients:  # the unmasked union as the clients hold it after round 1
        table[align.index[party.name]] = party.module.encoder.entity_emb.detach()
    masked.train_round(2)
    selected = [r.sender for r in masked.channel.records(round=2, receiver="server", name="upload")]
    assert len(selected) == 2
    chosen = [p for p in masked.clients if p.name in selected]
    trained = [shared(p) for p in chosen]
    sums, counts = holder_sums(table.shape[0], [align.index[p.name] for p in chosen],
                               [t[f"entity/{ENTITY}"] for t in trained])
    expected = mean_from_sums(table, sums, counts)
    operators = {n: torch.stack([t[n] for t in trained]).double().mean(0).float()
                 for n in trained[0] if n.startswith("operators/")}
    assert torch.equal(masked.server.contributors[ENTITY].sum(dim=1)[counts > 0], counts[counts > 0])
    masked.load_evaluation_state(2)
    for party in masked.clients:
        got = shared(party)
        assert torch.allclose(got[f"entity/{ENTITY}"], expected[align.index[party.name]], atol=1e-5, rtol=0)
        for name, value in operators.items():
            assert torch.allclose(got[name], value, atol=1e-6), (party.name, name)
    masked.close()


def test_the_server_receives_and_holds_masked_rows_only(cache, tmp_path):
    run = recording(paper(cache, federated__record_payloads="true"), tmp_path)
    run.train_round(1)
    received = uploads(tmp_path, 1)
    assert set(received) == {p.name for p in run.clients}
    key = federation_key(KEY, 0)
    align = run.server.alignment
    trained, indices = [], []
    for party in run.clients:
        rows = party.module.encoder.entity_emb.detach()  # what the local fit left, before any download
        up = received[party.name]
        # the upload is the trained rows plus the client's mask, not the rows
        mask = paper_mask(key, party.name, ENTITY, align.digests[align.index[party.name]], rows.shape[1])
        assert (up[ENTITY] - rows).abs().mean() > 0.3
        assert torch.allclose(up[ENTITY].double() - rows.double(), mask, atol=1e-6)
        # the operators cross in clear, as in the paper
        ops = party.module.shareable_groups()["operators"].tensors
        assert all(torch.equal(up[n], t.detach()) for n, t in ops.items())
        trained.append(rows)
        indices.append(align.index[party.name])
    # the server's table is the plain holder-mean plus the mean of the contributors' masks
    table = run.server.table[ENTITY]
    sums, counts = holder_sums(table.shape[0], indices, trained)
    plain = mean_from_sums(table, sums, counts)
    assert (table - plain).abs().mean() > 0.3
    contributors = run.server.contributors[ENTITY]
    assert torch.equal(contributors.sum(dim=1), counts)
    run.close()


@pytest.mark.slow
def test_one_colluding_client_unmasks_everyone_but_not_under_secure_aggregation(cache, tmp_path):
    """The server, given the federation key by one client, recomputes every client's mask from
    the digests it got at alignment and reads every upload in clear; under secure
    aggregation the same key leaves it 32-bit words masked by secrets it does not hold."""
    run = recording(paper(cache, federated__record_payloads="true"), tmp_path / "paper")
    run.train_round(1)
    stolen = federation_key(KEY, 0)  # what one client hands over
    align = run.server.alignment  # the server's own knowledge: digests, index maps, client names
    for party in run.clients:
        up = uploads(tmp_path / "paper", 1)[party.name][ENTITY]
        mask = paper_mask(stolen, party.name, ENTITY, align.digests[align.index[party.name]], up.shape[1])
        recovered = up.double() - mask
        truth = party.module.encoder.entity_emb.detach().double()
        assert (recovered - truth).abs().max() < 1e-6, party.name  # float32 rounding of the upload only
    run.close()

    secure = recording(config(cache, federated__record_payloads="true",
                              federated__secure_aggregation__enabled="true",
                              federated__secure_aggregation__hide_aggregate="true"), tmp_path / "secure")
    secure.train_round(1)
    bits = secure.cfg.federated.secure_aggregation.fractional_bits
    for party in secure.clients:
        up = uploads(tmp_path / "secure", 1)[party.name]
        assert {t.dtype for t in up.values()} == {torch.int32}  # masked words, no float crosses
        # the same attempt: the stolen key gives the hide_aggregate offset; remove it and read
        # the words as fixed point. The self and pairwise masks (secrets of this round, from
        # the OS) remain, so what is left is noise, not the rows.
        (down,) = (tmp_path / "secure" / "payloads").glob(f"r0001_*_server_to_{party.name}_download.safetensors")
        download = decode(down.read_bytes())
        gidx = download.arrays[f"sa.gidx.{ENTITY}"].long()
        truth = party.module.encoder.entity_emb.detach().double()
        # the offset is keyed by the client's own round key too, which the server saw advertised
        (advert,) = [a for a in (decode(p.read_bytes()).arrays for p in (tmp_path / "secure" / "payloads").glob(
            f"r0001_*_{party.name}_to_server_*.safetensors")) if "s_pk" in a]
        offset = _offset(stolen, 1, "train", ENTITY, party.name, secagg_bytes(advert["s_pk"]), int(gidx.max()) + 1,
                         truth.shape[1])[gidx]
        words = secagg.from_wire(up[ENTITY])[:, :-1]  # the last column: the upload indicator
        guess = secagg.signed(words - offset).double() / 2 ** bits
        assert (guess - truth).abs().mean() > 1.0
    secure.close()


@pytest.mark.slow
def test_paper_secret_config_errors(cache):
    with pytest.raises(ConfigError, match="secure_aggregation.enabled=false"):
        FederatedRun(paper(cache, federated__secure_aggregation__enabled="true"), None)
    with pytest.raises(ConfigError, match=r"federated\.fedcqa\.secret.*'secure', 'paper'"):
        config(cache, federated__fedcqa__secret="pairwise")
    with pytest.raises(ConfigError, match="selected_holders"):
        FederatedRun(paper(cache, federated__aggregation="all_holders"), None)
    with pytest.raises(ConfigError, match="federation_key"):
        FederatedRun(paper(cache, federated__federation_key=""), None)
    # secure (the default) keeps its requirement
    with pytest.raises(ConfigError, match="hide_aggregate"):
        FederatedRun(config(cache), None)
