"""Row-sparse training (``train.optimizer: sparse_adam``, lightning_fedkg.models.optimizers).

A sparse step updates exactly the rows its batch read (a brute-force oracle over the batch's
ids), the update is SparseAdam's lazy Adam computed here by hand from the dense gradient, the
default ``adam`` still trains bit for bit as before the option existed (digests recorded from
that code), and a UMLS run learns. The combinations a row-sparse step cannot run are errors.
"""

from __future__ import annotations

import copy
import hashlib
import math

import lightning as L
import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.data import BernoulliSampler, KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.models import MODELS, KGEModule
from lightning_fedkg.models.captured import EagerRecorder
from lightning_fedkg.models.optimizers import RowSparseAdam
from lightning_fedkg.run import fit

from conftest import make_small_config, make_tiny_config, single_thread

pytestmark = pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`",
                                        "ignore:.*does not have many workers")

BUILT_IN = ("complex", "distmult", "rotate", "transd", "transe", "transh", "transr")


@pytest.fixture(scope="module")
def umls():
    return load_kg("umls")


def trainer(**kw):
    defaults = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    defaults.update(kw)
    return L.Trainer(**defaults)


def batches(kg, mode: str, count: int, seed: int = 0, num_negatives: int = 8, corruption: str = "both"):
    """``count`` training batches of ``kg`` (64 positives, ``mode`` negatives)."""
    dm = KGDataModule(kg, UniformSampler(num_negatives, corruption=corruption, mode=mode),
                      LoaderSettings(batch_size=64), seed=seed)
    out = []
    for batch in dm._train_epoch():
        out.append(batch)
        if len(out) == count:
            return out
    raise AssertionError("not enough batches")


def touched(batch: dict) -> tuple[set[int], set[int]]:
    """The oracle: entity and relation ids a batch reads (positives' heads, tails, negatives)."""
    positive = batch["positive"]
    entities = set(positive[:, 0].tolist()) | set(positive[:, 2].tolist())
    entities |= set(batch["negatives"].reshape(-1).tolist())
    return entities, set(positive[:, 1].tolist())


def tables(module: KGEModule) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


def changed_rows(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return set((before != after).reshape(before.shape[0], -1).any(1).nonzero().flatten().tolist())


def step(module: KGEModule, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    loss = module.training_loss(batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


# ---------------------------------------------------------------------- (a) exactly the touched rows
@pytest.mark.parametrize("mode", ["shared", "per_triple"])
@pytest.mark.parametrize("model_name", BUILT_IN)
def test_a_sparse_step_updates_exactly_the_rows_its_batch_reads(umls, model_name, mode):
    assert set(BUILT_IN) <= set(MODELS.names())
    torch.manual_seed(0)
    module = KGEModule(model_name, num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                       lr=0.01, optimizer="sparse_adam")
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, RowSparseAdam)
    names = dict(module.model.named_parameters())
    for batch in batches(umls, mode, 3, num_negatives=4):
        before = tables(module)
        moments = {name: optimizer.state[p]["exp_avg"].clone() if optimizer.state[p] else torch.zeros_like(p)
                   for name, p in names.items()}
        step(module, optimizer, batch)
        after = tables(module)
        entities, relations = touched(batch)
        assert len(entities) < umls.num_entities  # untouched rows exist to be left alone
        for name, p in names.items():
            expected = entities if name.startswith("entity_") else relations
            # Every row read gets its moments updated, and no other row does.
            assert changed_rows(moments[name], optimizer.state[p]["exp_avg"]) == expected, name
            # No other row moves; a row read moves unless its gradient vanishes in fp32 (a
            # negative scored far below the margin gets σ(s) ~ 1e-23, an update ~ 1e-16).
            moved = changed_rows(before[name], after[name])
            assert moved <= expected and len(moved) >= 0.9 * len(expected), name


def test_dense_adam_moves_rows_the_batch_did_not_read_and_sparse_adam_does_not(umls):
    first, second = batches(umls, "shared", 2, num_negatives=4)
    moved = {}
    for optimizer_name in ("adam", "sparse_adam"):
        torch.manual_seed(0)
        module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                           loss="uniform", optimizer=optimizer_name)
        optimizer = module.configure_optimizers()
        step(module, optimizer, first)
        before = tables(module)
        step(module, optimizer, second)
        moved[optimizer_name] = changed_rows(before["entity_emb"], module.model.entity_emb.detach())
    second_rows, _ = touched(second)
    first_rows, _ = touched(first)
    assert moved["sparse_adam"] == second_rows
    # dense Adam's first moment keeps moving the first batch's rows in the second step
    assert moved["adam"] >= second_rows | first_rows and moved["adam"] != second_rows


# ---------------------------------------------------------------------- (c) the update by hand
@pytest.mark.parametrize("model_name,mode", [("transe", "shared"), ("rotate", "per_triple"), ("transr", "shared")])
def test_sparse_adam_is_lazy_adam_of_the_dense_gradient_on_the_touched_rows(umls, model_name, mode):
    torch.manual_seed(0)
    lr, (b1, b2), eps = 0.01, (0.9, 0.999), 1e-8
    sparse = KGEModule(model_name, num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8, lr=lr,
                       optimizer="sparse_adam")
    dense = copy.deepcopy(sparse)  # the dense gradient's reference: same tables, plain indexing
    dense.model.sparse_gradients = False
    optimizer = sparse.configure_optimizers()
    params = {n: p.detach().double().clone() for n, p in sparse.model.named_parameters()}
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    for t, batch in enumerate(batches(umls, mode, 3, num_negatives=4), start=1):
        with torch.no_grad():
            for name, p in dense.model.named_parameters():
                p.copy_(params[name])
        dense.zero_grad()
        dense.training_loss(batch).backward()
        entities, relations = touched(batch)
        for name, p in dense.model.named_parameters():
            rows = torch.tensor(sorted(entities if name.startswith("entity_") else relations))
            g = p.grad.double()[rows]
            m, v = moments[name]
            m[rows] = b1 * m[rows] + (1 - b1) * g
            v[rows] = b2 * v[rows] + (1 - b2) * g * g
            # SparseAdam: the table's step count, eps before v's bias correction
            step_size = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            params[name][rows] -= step_size * m[rows] / (v[rows].sqrt() + eps)
        step(sparse, optimizer, batch)
        for name, p in sparse.model.named_parameters():
            torch.testing.assert_close(p.detach().double(), params[name], rtol=0, atol=2e-6, msg=name)
        assert all(s["step"] == t for s in optimizer.state.values())


# ---------------------------------------------------------------------- (b) the default is unchanged
# SHA-256 of the model's state after 2 epochs of 6 batches (Trainer.fit, one thread), recorded
# with the code before train.optimizer existed (commit 3fa774f) from the same settings.
DENSE_GOLDEN = {
    "transe_shared_filtered": "b918349d963993a576bde6b2f9ecd890d70964a9cb32d93433fa58b6b5302ced",
    "transe_bernoulli_reg": "f3369f44ab3b3ef8c758c2a263b6e18e58338d6493dec8a0407811d0961d517c",
    "rotate_per_triple": "de86ab25e854493bf77d375b943eccdfd84e03c30f81bd0efa7b20926dc7622d",
    "transr_shared": "876cd14f6c174c571a8817953d73d35666cffcc2deb056acee7752dbeac38e18",
    "transd_per_triple": "24810bc51643e7c90b7d0fc76f01fd4d35fa345eba955428491d5db6754c467a",
    "transh_shared": "8129665f2461306525d7e36620dc935f95b28da546194780ccc0e7657803a3da",
    "distmult_subsampling": "90281c5c78f0d158ad69f07e7b96fae47e28e6658ee54dd2f200abd719788907",
    "complex_shared": "6989261e03994d22a373a966499e1d19ae7c51d8e82b75d27ef2790daa857fb7",
}
DENSE_CASES = {
    "transe_shared_filtered": dict(model="transe", mode="shared", filtered=True),
    "transe_bernoulli_reg": dict(model="transe", sampler="bernoulli", regularization=1e-3),
    "rotate_per_triple": dict(model="rotate", mode="per_triple"),
    "transr_shared": dict(model="transr", mode="shared", regularization=1e-3),
    "transd_per_triple": dict(model="transd", mode="per_triple"),
    "transh_shared": dict(model="transh", mode="shared"),
    "distmult_subsampling": dict(model="distmult", mode="per_triple", subsampling=True),
    "complex_shared": dict(model="complex", mode="shared", loss="margin"),
}


def short_run_digest(kg, model, mode="per_triple", filtered=False, sampler="uniform", regularization=0.0,
                     subsampling=False, loss="self_adversarial", **module_options) -> str:
    torch.manual_seed(0)
    common = dict(num_negatives=8, filtered=filtered)
    negatives = (BernoulliSampler(**common) if sampler == "bernoulli"
                 else UniformSampler(corruption="both", mode=mode, **common))
    dm = KGDataModule(kg, sampler=negatives, loader=LoaderSettings(batch_size=128, subsampling=subsampling), seed=1)
    module = KGEModule(model, num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8, lr=0.01,
                       regularization=regularization, loss=loss, **module_options)
    trainer(max_epochs=2, limit_train_batches=6, limit_val_batches=0).fit(module, datamodule=dm)
    h = hashlib.sha256()
    for name, p in sorted(module.model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("case", sorted(DENSE_CASES))
def test_the_default_optimizer_trains_bit_for_bit_as_before(umls, case):
    with single_thread():
        assert short_run_digest(umls, **DENSE_CASES[case]) == DENSE_GOLDEN[case]


def test_naming_the_default_optimizer_changes_nothing(umls):
    case = "transr_shared"
    with single_thread():
        assert short_run_digest(umls, **DENSE_CASES[case], optimizer="adam") == DENSE_GOLDEN[case]


# ---------------------------------------------------------------------- (d) it learns
SPARSE_E2E = {
    # model: (hyperparameters, epochs, MRR bar). The dense test's bars (tests/test_kge_module.py):
    # measured over seeds 0-2, sparse test MRR .705-.729 (TransE) and .790-.800 (RotatE), dense
    # .709-.716 and .787-.810 at the same settings; untrained models score below .15.
    "transe": (dict(dim=64, gamma=8.0, lr=0.01), 10, 0.60),
    "rotate": (dict(dim=32, gamma=8.0, lr=0.02), 10, 0.70),
}


@pytest.mark.slow
@pytest.mark.parametrize("model_name", sorted(SPARSE_E2E))
def test_a_row_sparse_run_learns_umls(umls, model_name):
    hparams, epochs, bar = SPARSE_E2E[model_name]
    L.seed_everything(0, verbose=False)
    module = KGEModule(model_name, num_entities=umls.num_entities, num_relations=umls.num_relations,
                       optimizer="sparse_adam", **hparams)
    dm = KGDataModule(umls, UniformSampler(32, corruption="both"),
                      LoaderSettings(batch_size=512, eval_batch_size=512), seed=0)
    t = trainer(max_epochs=epochs, limit_val_batches=0)
    t.fit(module, datamodule=dm)
    t.test(module, datamodule=dm, verbose=False)
    assert module.last_metrics["test"]["mrr"] >= bar


# ---------------------------------------------------------------------- interplay
def test_a_loss_term_over_a_whole_table_stops_the_step_with_a_clear_error(umls):
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                       optimizer="sparse_adam")
    optimizer = module.configure_optimizers()
    anchor = module.model.entity_emb.detach().clone()
    module.regularizers.append(lambda: 0.05 * (module.model.entity_emb - anchor).pow(2).sum())  # FedProx's shape
    with pytest.raises(RuntimeError, match="model.entity_emb received a dense gradient.*train.optimizer=adam"):
        step(module, optimizer, batches(umls, "shared", 1)[0])


def test_fedprox_with_mu_stops_and_without_it_trains_row_sparse(tmp_path):
    with single_thread(), pytest.raises(RuntimeError, match="dense gradient"):
        fit(make_tiny_config("fedprox", "train.optimizer=sparse_adam", "federated.fedprox.mu=0.1"), tmp_path / "a")
    with single_thread():
        metrics = fit(make_tiny_config("fedprox", "train.optimizer=sparse_adam", "federated.fedprox.mu=0"),
                      tmp_path / "b")
    assert metrics["test"]["mrr"] > 0


def test_the_regulariser_covers_the_batch_rows_with_sparse_adam(umls):
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                       regularization=0.1, optimizer="sparse_adam")
    batch = batches(umls, "shared", 1)[0]
    plain = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                      optimizer="sparse_adam")
    plain.load_state_dict(module.state_dict())
    expected = plain.training_loss(batch) + 0.1 * module.model.regularization_loss(batch["positive"])
    torch.testing.assert_close(module.training_loss(batch), expected)


def test_configs_refuse_what_a_row_sparse_step_cannot_run():
    for key in ("capture", "compile"):
        with pytest.raises(ConfigError, match=f"trainer.{key}=true cannot run train.optimizer=sparse_adam"):
            make_small_config("fede", "train.optimizer=sparse_adam", f"trainer.{key}=true")
    with pytest.raises(ConfigError, match="train.optimizer"):
        make_small_config("fede", "train.optimizer=sgd")
    from lightning_fedkg.registry import STRATEGIES

    with pytest.raises(ConfigError, match="FedLU's learner trains its two sides with Adam"):
        STRATEGIES.get("fedlu").learner(make_small_config("fedlu", "train.optimizer=sparse_adam"))
    with pytest.raises(ValueError, match="optimizer must be one of"):
        KGEModule(num_entities=3, num_relations=1, optimizer="sgd")


def test_a_row_sparse_step_is_never_recorded(umls):
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8)
    module.step_recorder = EagerRecorder()
    assert module.captures()
    sparse = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                       optimizer="sparse_adam")
    sparse.step_recorder = EagerRecorder()
    assert not sparse.captures() and sparse.step_graphs() is None


def test_a_persistent_sparse_optimizer_survives_fits_and_overwritten_rows(umls):
    torch.manual_seed(0)
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                       optimizer="sparse_adam", reset_optimizer=False)
    first, second = batches(umls, "shared", 2)
    optimizer = module.configure_optimizers()
    step(module, optimizer, first)
    # a federated round writes received rows in place: the optimizer stays bound to the table
    group = module.shareable_groups()["entity"]
    group.write({"entity_emb": module.model.entity_emb.detach() * 0.5})
    assert module.configure_optimizers() is optimizer
    saved = copy.deepcopy(module.optimizer_state_dict())
    assert saved["state"][0]["step"] == 1
    twin = copy.deepcopy(module)
    twin.load_optimizer_state_dict(saved)
    step(module, optimizer, second)
    step(twin, twin.configure_optimizers(), second)
    assert torch.equal(module.model.entity_emb, twin.model.entity_emb)


def test_bf16_mixed_trains_row_sparse_in_fp32_tables(umls):
    L.seed_everything(0, verbose=False)
    module = KGEModule("rotate", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=16,
                       optimizer="sparse_adam")
    dm = KGDataModule(umls, UniformSampler(8, corruption="both", mode="shared"), LoaderSettings(batch_size=64),
                      seed=0)
    before = module.model.entity_emb.detach().clone()
    t = trainer(precision="bf16-mixed", limit_train_batches=1, limit_val_batches=0)
    t.fit(module, datamodule=dm)
    assert module.model.entity_emb.dtype == torch.float32
    assert module.model.entity_emb.grad is None or module.model.entity_emb.grad.is_sparse
    moved = changed_rows(before, module.model.entity_emb.detach())
    assert 0 < len(moved) < umls.num_entities and math.isfinite(float(t.callback_metrics["train/loss"]))


# ---------------------------------------------------------------------- on a GPU
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("model_name", ["transe", "rotate", "transr"])
def test_a_cuda_sparse_step_matches_the_cpu_step_on_the_touched_rows(umls, model_name):
    torch.manual_seed(0)
    cpu = KGEModule(model_name, num_entities=umls.num_entities, num_relations=umls.num_relations, dim=8,
                    optimizer="sparse_adam")
    gpu = copy.deepcopy(cpu).cuda()
    cpu_opt, gpu_opt = cpu.configure_optimizers(), gpu.configure_optimizers()
    for batch in batches(umls, "shared", 3, num_negatives=4):
        before = tables(gpu)
        step(cpu, cpu_opt, batch)
        step(gpu, gpu_opt, {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        entities, relations = touched(batch)
        for name, p in gpu.model.named_parameters():
            assert changed_rows(before[name].cpu(), p.detach().cpu()) <= (
                entities if name.startswith("entity_") else relations), name
            torch.testing.assert_close(p.detach().cpu(), getattr(cpu.model, name).detach(), rtol=0, atol=1e-5)


@needs_cuda
def test_a_cuda_fit_runs_the_row_sparse_step_eagerly_at_bf16_mixed(umls):
    L.seed_everything(0, verbose=False)
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=16,
                       optimizer="sparse_adam")
    dm = KGDataModule(umls, UniformSampler(8, corruption="both", mode="shared", filtered=True),
                      LoaderSettings(batch_size=64), seed=0)
    t = trainer(accelerator="gpu", precision="bf16-mixed", limit_train_batches=6, limit_val_batches=0)
    t.fit(module, datamodule=dm)
    assert module.step_graphs() is None and module.__dict__.get("_step_graphs") is None
    assert module.model.entity_emb.dtype == torch.float32 and math.isfinite(float(t.callback_metrics["train/loss"]))
