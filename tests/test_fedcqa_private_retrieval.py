"""Private retrieval (``task.retrieval: private``) and retrieval that never crashes.

The sealing and padding against plain holder-averaging, end-to-end metrics and ``fedkg
query`` answers equal under ``private`` and ``paper`` on the same training, what the
server's payloads hold, and queries no client can route: counted as unanswered in an
evaluation, explained by ``fedkg query``.
"""

from __future__ import annotations

import json

import pytest
import torch

from lightning_fedkg.federated.aggregation import holder_mean
from lightning_fedkg.federated.message import decode
from lightning_fedkg.methods.fedcqa.sealed import (SCORE_BITS, RetrievalRefused, add_words, mask_scores,
                                                    open_states, seal_states, unmask_mean)

from conftest import make_small_config

pytest.importorskip("cryptography")
from cryptography.exceptions import InvalidTag  # noqa: E402

KEY = b"k" * 32
#: ``client_0`` of the small UMLS federation owns interacts_with but not anatomical_structure.
UNROUTABLE = "(e:anatomical_structure, (r:interacts_with))"


# ---------------------------------------------------------------- sealing and padding
def test_sealed_states_open_only_for_their_query_and_node():
    states = torch.randn(4, 2, 8)
    queries = torch.tensor([3, 9, 10, 11])
    sealed = seal_states(KEY, "2p", queries, 1, states)
    assert sealed.dtype == torch.uint8 and sealed.shape == (4, 12 + 2 * 8 * 4 + 16)
    assert torch.equal(open_states(KEY, "2p", queries, 1, sealed, 8), states)
    # a fresh nonce per seal: the same state sealed twice gives other bytes
    again = seal_states(KEY, "2p", queries, 1, states)
    assert not (again[:, :12] == sealed[:, :12]).all(1).any()
    for structure, moved, node in (("2p", queries.flip(0), 1), ("3p", queries, 1), ("2p", queries, 0)):
        with pytest.raises(InvalidTag):  # another query, structure or node: refused
            open_states(KEY, structure, moved, node, sealed, 8)
    tampered = sealed.clone()
    tampered[0, 20] ^= 1
    with pytest.raises(InvalidTag):
        open_states(KEY, "2p", queries, 1, tampered, 8)
    with pytest.raises(InvalidTag):
        open_states(b"x" * 32, "2p", queries, 1, sealed, 8)


def test_padded_tables_sum_to_the_holder_mean_within_fixed_point():
    gen = torch.Generator().manual_seed(0)
    width, b = 50, 6
    columns = [torch.randperm(width, generator=gen)[:n] for n in (30, 45, 20)]
    tables = [(torch.randn(b, len(c), generator=gen) * 20).float() for c in columns]
    tables[0][0, 0] = 1e-12  # below the fixed point's resolution
    padded = [mask_scores(KEY, t, c, width, f"ctx|client_{i}") for i, (t, c) in enumerate(zip(tables, columns))]
    for (words, _), t, c in zip(padded, tables, columns):
        # the pad covers every column and the holder row: nothing of the plain fixed point shows
        plain = torch.zeros(b + 1, width, dtype=torch.int64)
        plain[:b, c] = torch.round(t.double() * 2.0 ** SCORE_BITS).long()
        plain[b, c] = 1
        assert words.shape == (b + 1, width) and (words != plain).float().mean() > 0.99
    total = add_words([w for w, _ in padded])
    seeds = [(s, f"ctx|client_{i}") for i, (_, s) in enumerate(padded)]
    got = unmask_mean(KEY, total, seeds, 3)
    expected = holder_mean(torch.full((width, b), float("-inf"), dtype=torch.float64), columns,
                           [t.double().T for t in tables]).T
    # the holder counts come from the tables' last rows: an entity no one holds scores -inf
    assert torch.equal(torch.isinf(got), torch.isinf(expected)) and torch.isinf(expected).any()
    held = ~torch.isinf(expected)
    assert (got[held] - expected[held]).abs().max() <= 2.0 ** -(SCORE_BITS + 1)
    # float32 scores of magnitude 2^-9 at least (every row but the first) come out exact
    assert min(float(t[1:].abs().min()) for t in tables) >= 2.0 ** -9
    assert torch.equal(got[1:][held[1:]], expected[1:][held[1:]])
    with pytest.raises(InvalidTag):  # a seed bound to another client's place is refused
        unmask_mean(KEY, total, [(s, "ctx|client_0") for _, s in padded], 3)
    # one table alone under its own seed: its counts are 0 or 1, in range, but with another
    # member's seed given too (that member's pad never added) the counts are noise: refused
    assert torch.isfinite(unmask_mean(KEY, padded[1][0], seeds[1:2], 3)).any()
    with pytest.raises(RetrievalRefused, match="holder counts are outside"):
        unmask_mean(KEY, padded[1][0], seeds, 3)
    with pytest.raises(RetrievalRefused, match=r"outside \[0, 2\]"):  # 3 holders of some entity, 2 members
        unmask_mean(KEY, total, seeds, 2)
    with pytest.raises(ValueError, match="not finite"):
        mask_scores(KEY, torch.tensor([[float("nan")]]), torch.tensor([0]), 1, "ctx")


def test_reveal_top_is_a_task_setting_of_at_least_one():
    from lightning_fedkg.config import ConfigError

    assert tiny(None, "queries", "private").task.reveal_top == 10
    assert tiny(None, "queries", "private", task__reveal_top=3).task.reveal_top == 3
    with pytest.raises(ConfigError, match="reveal_top"):
        tiny(None, "queries", "private", task__reveal_top=0)


# ---------------------------------------------------------------- end to end
def tiny(tmp_path, cache, mode: str, **overrides):
    """FedCQA (hidden secure aggregate) on the small UMLS federation: GQE in 16 dimensions,
    one short round, 60 cross-graph queries per type; ``mode`` is ``task.retrieval``."""
    settings = {
        "model.dim": 16, "train.lr": 0.01, "train.batch_size": 64, "train.eval_batch_size": 32,
        "task.encoder": "gqe", "task.steps_per_epoch": 3, "task.train_per_type": 300,
        "task.eval_per_type": 30, "task.cross_per_type": 60, "task.cache_dir": str(cache),
        "task.retrieval": mode, "federated.task": "query_answering", "federated.rounds": 1,
        "federated.federation_key": "private-test-key", "federated.secure_aggregation.enabled": "true",
        "federated.secure_aggregation.hide_aggregate": "true", "federated.record_payloads": "true",
    }
    return make_small_config("fedcqa", **{**settings, **overrides})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{mode: run folder}``: the same one-round FedCQA fit under each retrieval."""
    from lightning_fedkg.run import fit

    base = tmp_path_factory.mktemp("retrieval")
    out = {}
    for mode in ("paper", "private"):
        fit(tiny(base, base / "queries", mode), base / mode)
        out[mode] = base / mode
    return out


@pytest.mark.slow
def test_private_metrics_equal_the_papers_on_the_same_training(runs):
    paper, private = (json.loads((runs[m] / "metrics.json").read_text()) for m in ("paper", "private"))
    assert private["cross_graph"]["unanswered"] == paper["cross_graph"]["unanswered"] == 0
    assert set(private["cross_graph"]["by_type"]) == set(paper["cross_graph"]["by_type"])
    for name, m in paper["cross_graph"]["by_type"].items():
        for key, value in m.items():
            # ranks from the same holder-mean to 2^-33: equal, the same queries counted
            assert private["cross_graph"]["by_type"][name][key] == pytest.approx(value, abs=1e-9), (name, key)
    assert private["in_graph"]["mrr"] == paper["in_graph"]["mrr"]


@pytest.mark.slow
def test_private_payloads_carry_no_float_state_or_score_table(runs):
    """Every retrieval transfer, both ways, holds integers and bytes only: keys, sealed
    states (uint8), padded tables (int64 words), sealed seeds; the one float array is the
    querier's ``metrics`` to the server, ``[rows, len(QUERY_METRICS)]`` per batch. It is no
    model data: each number is a per-query mean of ``1/rank`` or of a hit indicator over
    the query's hard answers, a function of ranks alone (what the evaluation reports,
    per query), never a score, a state or a row."""
    from lightning_fedkg.methods.fedcqa.entries import QUERY_METRICS

    seen, metrics = {}, []
    for path in sorted((runs["private"] / "payloads").glob("r*_cq_step*.safetensors")):
        for name, t in decode(path.read_bytes()).arrays.items():
            if name == "metrics":
                assert "_client_0_to_server_" in path.name, path.name
                metrics.append(t)
                continue
            assert not t.is_floating_point(), (path.name, name, t.dtype)
            seen.setdefault(name.split(":")[-1].rstrip("0123456789"), set()).add(str(t.dtype))
    assert seen["s"] == {"torch.uint8"} and seen["scores"] == {"torch.int64"} and "ranks2" not in seen
    assert metrics and all(m.dtype == torch.float32 and m.shape[1] == len(QUERY_METRICS) for m in metrics)
    values = torch.cat(metrics)
    assert values.shape[0] == 480 and bool(((values >= 0) & (values <= 1)).all())  # 8 types × 60 queries
    # the paper's retrieval, for contrast, sends float states and score tables
    floats = {name for path in (runs["paper"] / "payloads").glob("r*_cq_step*.safetensors")
              for name, t in decode(path.read_bytes()).arrays.items() if t.is_floating_point()}
    assert "scores" in floats and any(n.startswith("s") for n in floats)


@pytest.mark.slow
def test_fedkg_query_answers_alike_under_both_and_explains_an_unroutable_query(runs, capsys):
    from lightning_fedkg.cli import main

    printed = {}
    for mode, folder in runs.items():
        # 12: beyond task.reveal_top's default, so the querier reveals 12 only if --top set it
        for top in (5, 12):
            assert main(["query", "--from", str(folder), "i((e:antibiotic, (r:treats)), (e:virus, (r:causes)))",
                         "--top", str(top)]) == 0
            lines = capsys.readouterr().out.splitlines()[1:]
            printed[mode, top] = [(line.split()[2], float(line.split()[1])) for line in lines]
            assert len(printed[mode, top]) == top and all(s > float("-inf") for _, s in printed[mode, top])
        # issue 36, finding 2: a KeyError and exit 1 before
        assert main(["query", "--from", str(folder), UNROUTABLE]) == 0
        out = capsys.readouterr()
        assert "no answer" in out.out and "Traceback" not in out.err and "failed" not in out.err
        assert "client_0 owns relation r:interacts_with but does not hold entity e:anatomical_structure" in out.out
    for top in (5, 12):
        assert [n for n, _ in printed["private", top]] == [n for n, _ in printed["paper", top]]
        assert [s for _, s in printed["private", top]] == pytest.approx([s for _, s in printed["paper", top]],
                                                                        abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["private", "paper"])
def test_an_unroutable_evaluation_query_is_counted_unanswered(runs, mode):
    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.methods.fedcqa.retrieval import CrossQueries, digest_keys
    from lightning_fedkg.federated.alignment import federation_key, hash_names

    cfg, run = load_run_from(runs[mode])
    run.evaluate("test", 1)
    before = run.server.report()["cross_graph"]
    # 2p query 0 now starts at an entity its first relation's owner does not hold
    key = federation_key(cfg.federated.federation_key, cfg.seed)
    cq = run.server.cross["2p"]
    owner = next(p for p in run.clients if int(cq.keys[0, 1]) in set(
        digest_keys(hash_names(p.names["relation"], key)).tolist()))
    missing = next(e for e in run.fkg.entity_names if e not in owner.names["entity"])
    keys = cq.keys.clone()
    keys[0, 0] = digest_keys(hash_names([missing], key))[0]
    run.server.cross["2p"] = CrossQueries(**{**cq.__dict__, "keys": keys})
    run.evaluate("test", 1)
    after = run.server.report()["cross_graph"]
    assert after["unanswered"] == 1 and not run.failures
    assert after["by_type"]["2p"]["queries"] == before["by_type"]["2p"]["queries"] - 1
    for name, m in before["by_type"].items():
        if name != "2p":
            assert after["by_type"][name] == m
    run.close()


# ---------------------------------------------------------------- a deviating server
#: Batches of one cross-graph test: 8 types of 60 queries, in batches of at most 32.
BATCHES = 16


def isolating_server(run, victim: str, everyone: bool = False) -> tuple[list, dict]:
    """Make ``run``'s server deviate as the review did (finding A): at every reveal it sends
    the querier ``victim``'s padded table alone as the total, with ``victim``'s sealed seed,
    ``contributors=[victim]``, a holder count of 1 on ``victim``'s columns and ``top`` = the
    union's width (``everyone``: with every member named and every member's seed, the
    total still ``victim``'s table alone). Returns ``(replies, truth)``: ``(context, victim's
    union columns, querier reply or None)`` per reveal, and ``{context: victim's plain
    table}`` as its own scoring produced it."""
    from lightning_fedkg.federated.message import Message

    server, half = run.server, run.client_halves[victim]
    replies, truth = [], {}
    score = half._score

    def recording_score(message):
        out = score(message)
        truth[message.config["context"]] = out
        return out

    def isolate(name, start, stop):
        if victim not in server._masked:
            return {}
        table, seed = server._masked[victim]
        columns = server.directory["entity_index"][victim]
        counts = torch.zeros(table.shape[1], dtype=torch.long)
        counts[columns] = 1
        named = list(server._masked) if everyone else [victim]
        return {server.querier: Message(
            arrays={"total": table, "counts": counts, "seeds": torch.stack([server._masked[c][1] for c in named])},
            config={"kind": "reveal", "contributors": named, "context": server._context,
                    "top": int(table.shape[1])})}

    def record(name, start, stop, reply):
        replies.append((server._context, server.directory["entity_index"][victim], reply))

    half._score = recording_score
    server._reveal_messages = isolate
    server._revealed = record
    return replies, truth


def recovered(replies, truth) -> tuple[int, float]:
    """``(score entries of the victim the server got back, their largest error)``."""
    entries, error = 0, 0.0
    for context, columns, reply in replies:
        if reply is None:
            continue
        top = reply.arrays["top"]
        got = torch.full((top.shape[0], int(top.max()) + 1), float("nan"), dtype=torch.float64)
        got.scatter_(1, top, reply.arrays["values"])
        plain = truth[context].double()
        entries += plain.numel()
        error = max(error, float((got[:, columns] - plain).abs().max()))
    return entries, error


def refusals(run) -> list[str]:
    """The errors of the run's failed retrieval steps."""
    return [f["error"] for f in run.failures if f["stage"] == "cq_step"]


@pytest.mark.slow
@pytest.mark.parametrize("everyone", [False, True])
def test_a_server_isolating_one_clients_table_gets_nothing_from_the_querier(runs, everyone):
    """Finding A. Before the querier checked what it was sent, this attack (``everyone``
    False, the review's) got back every score of ``client_1``: 64,800 entries (480 queries ×
    135 union entities), error 0. Now the querier refuses it for naming too few members;
    with every member named it refuses it for its holder counts (the other members' pads
    were never added; before, it returned noise, errors of 2e9)."""
    from lightning_fedkg.federated.entry import load_run_from

    _, run = load_run_from(runs["private"])
    replies, truth = isolating_server(run, "client_1", everyone)
    run.evaluate("test", 1)
    assert len(replies) == BATCHES and truth  # every batch was asked, and client_1 scored it
    assert recovered(replies, truth) == (0, 0.0)
    errors = refusals(run)
    assert len(errors) == BATCHES and all("RetrievalRefused" in e for e in errors)
    reason = "holder counts are outside [0, 3]" if everyone else "lack ['client_0', 'client_2']"
    assert all(reason in e for e in errors), errors[0]
    run.close()


def tampering_server(run, edit) -> list[list]:
    """Make ``run``'s server change each reveal message with ``edit(server, message)``
    before sending it; returns ``[message, querier reply or None]`` per reveal (the server
    records the reply and counts nothing)."""
    server = run.server
    original = server._reveal_messages
    log: list[list] = []

    def send(name, start, stop):
        messages = original(name, start, stop)
        if server.querier in messages:
            edit(server, messages[server.querier])
            log.append([messages[server.querier], None])
        return messages

    def record(name, start, stop, reply):
        log[-1][1] = reply

    server._reveal_messages = send
    server._revealed = record
    return log


def _drop_client_2(server, message):
    kept = ["client_0", "client_1"]
    message.config["contributors"] = kept
    message.arrays["total"] = add_words([server._masked[c][0] for c in kept])
    message.arrays["seeds"] = torch.stack([server._masked[c][1] for c in kept])


def _shift(row: int, by: int):
    """An edit adding ``by`` to the word at ``(row, 0)`` of the padded sum."""
    def edit(server, message):
        message.arrays["total"][row, 0] += by
    return edit


@pytest.mark.slow
@pytest.mark.parametrize("edit, reason", [
    (_drop_client_2, "lack ['client_2']"),
    (_shift(-1, 4), "1 of 135 holder counts are outside [0, 3]"),
    (_shift(-1, -4), "1 of 135 holder counts are outside [0, 3]"),
    (_shift(0, 1 << 40), None),
])
def test_the_querier_refuses_a_subset_of_contributors_and_counts_out_of_range(runs, edit, reason):
    """The sum of two members' tables, and one holder count moved above the number of
    members or below 0: refused, every batch (before: the server sent the counts and
    named the contributors, and the querier used both). A score shifted by a constant
    (``reason`` None) is not detected: the sum is linear, so a server can spoil answers
    (never read a table)."""
    from lightning_fedkg.federated.entry import load_run_from

    _, run = load_run_from(runs["private"])
    log = tampering_server(run, edit)
    run.evaluate("test", 1)
    assert len(log) == BATCHES
    errors = refusals(run)
    if reason is None:
        assert not errors and all(reply is not None for _, reply in log)
    else:
        assert all(reply is None for _, reply in log)
        assert len(errors) == BATCHES and all(reason in e for e in errors), errors[0]
    run.close()


@pytest.mark.slow
def test_a_server_listing_every_column_as_a_hard_answer_gets_four_numbers_per_query(runs):
    """Each row's hard answers made every union column (none easy): before, the querier
    returned a rank per listed answer, the full ranking of every query (64,800 ranks for
    480 queries); now len(QUERY_METRICS) numbers per query whatever the server lists."""
    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.methods.fedcqa.entries import QUERY_METRICS

    def every_column(server, message):
        rows, width = int(message.arrays["total"].shape[0]) - 1, int(message.arrays["total"].shape[1])
        message.arrays["hard_rows"] = torch.arange(rows).repeat_interleave(width)
        message.arrays["hard_cols"] = torch.arange(width).repeat(rows)
        message.arrays["easy_rows"] = message.arrays["easy_cols"] = torch.zeros(0, dtype=torch.long)

    _, run = load_run_from(runs["private"])
    log = tampering_server(run, every_column)
    run.evaluate("test", 1)
    queries = sum(int(m.arrays["total"].shape[0]) - 1 for m, _ in log)
    numbers = sum(t.numel() for _, reply in log for t in reply.arrays.values())
    assert queries == 480 and numbers == len(QUERY_METRICS) * queries
    run.close()


@pytest.mark.slow
def test_the_querier_reveals_a_batch_once_and_a_restore_does_not_roll_that_back(runs):
    from lightning_fedkg.federated.entry import load_run_from

    _, run = load_run_from(runs["private"])
    log = tampering_server(run, lambda server, message: None)
    run.evaluate("test", 1)
    assert len(log) == BATCHES and all(reply is not None for _, reply in log)
    querier = run.client_halves["client_0"]
    assert sorted(querier.spent_state()["revealed_contexts"]) == sorted(m.config["context"] for m, _ in log)
    # a new evaluation is new batches (the server names them afresh): revealed again
    run.evaluate("test", 1)
    assert len(log) == 2 * BATCHES and all(reply is not None for _, reply in log)
    spent = querier.spent_state()
    assert sorted(spent["revealed_contexts"]) == sorted(m.config["context"] for m, _ in log)
    with pytest.raises(RetrievalRefused, match="revealed once already"):
        querier.on_cq_step(log[0][0], 1)
    with pytest.raises(RetrievalRefused, match="the querier is client_0"):  # nor by another client
        run.client_halves["client_1"].on_cq_step(log[1][0], 1)
    # a later process of the querier: it reveals a batch it never saw, then takes back the
    # ledger; restoring its state (a Flower restore) rolls nothing back
    _, later = load_run_from(runs["private"])
    again = later.client_halves["client_0"]
    assert "metrics" in again.on_cq_step(log[-1][0], 1).arrays
    again.load_spent_state(spent)
    again.load_state_dict(again.state_dict())
    again.load_spent_state({})
    assert set(again.spent_state()["revealed_contexts"]) == set(spent["revealed_contexts"])
    for message, _ in log:
        with pytest.raises(RetrievalRefused, match="revealed once already"):
            again.on_cq_step(message, 1)
    later.close()
    run.close()


@pytest.mark.slow
def test_the_querier_takes_the_members_from_its_roster_where_it_has_one(runs, tmp_path):
    """A Flower client's config comes from the server: one that says 2 clients would have
    the querier accept a sum without client_2. Where the querier holds an identity roster
    (as secure aggregation's clients do) the members are the roster's."""
    import copy

    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.privacy.identities import write_identities

    _, run = load_run_from(runs["private"])
    querier = run.parties["client_0"]
    querier.cfg = copy.deepcopy(querier.cfg)
    querier.cfg.data.num_clients = 2  # the server's word
    log = tampering_server(run, lambda server, message: None)
    run.evaluate("test", 1)
    errors = refusals(run)
    assert len(errors) == BATCHES and all("name non-members ['client_2']" in e for e in errors), errors[0]
    write_identities(tmp_path / "identities", ["client_0", "client_1", "client_2"], 2)
    querier.identities = tmp_path / "identities"
    run.evaluate("test", 1)
    assert len(refusals(run)) == BATCHES and all(reply is not None for _, reply in log[BATCHES:])
    run.close()


@pytest.mark.slow
def test_a_scorer_refuses_a_batch_that_names_one_query_twice(runs):
    """A query copied into a second row would get the querier's per-query reveal twice in
    one batch (with other hard answers each time): every scorer refuses the batch."""
    from lightning_fedkg.federated.entry import load_run_from

    _, run = load_run_from(runs["private"])
    server = run.server
    original = server._score_messages

    def duplicate_row_0(round, name, start, root):
        messages = original(round, name, start, root)
        for message in messages.values():
            for key in [k for k in message.arrays if k == "q" or k.startswith("s")]:
                message.arrays[key] = torch.cat([message.arrays[key], message.arrays[key][:1]])
        return messages

    server._score_messages = duplicate_row_0
    run.evaluate("test", 1)
    errors = refusals(run)
    assert len(errors) == 3 * BATCHES and all("names a query in more than one row" in e for e in errors), errors[0]
    assert run.server.report()["cross_graph"]["unanswered"] == 480
    run.close()


@pytest.mark.slow
def test_the_querier_reveals_its_own_reveal_top_whatever_the_server_asks(runs):
    """A typed query (``fedkg query``) with the server asking for every column: the querier
    reveals its own ``task.reveal_top`` (3 here), no more (before: the server's ``top``)."""
    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.methods.fedcqa.query_text import answer_query

    cfg, run = load_run_from(runs["private"])

    def ask_everything(server, message):
        message.config["top"] = int(message.arrays["total"].shape[1])

    server = run.server
    original = server._reveal_messages

    def send(name, start, stop):
        messages = original(name, start, stop)
        ask_everything(server, messages[server.querier])
        return messages

    server._reveal_messages = send
    run.parties["client_0"].cfg.task.reveal_top = 3
    _, answers = answer_query(cfg, run, "i((e:antibiotic, (r:treats)), (e:virus, (r:causes)))", top=20)
    assert sum(score > float("-inf") for _, score in answers) == 3
    run.close()
