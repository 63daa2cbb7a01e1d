"""A server that deviates in any field of any message: the harness that covers the class.

Every field a client receives has a declared stance (:mod:`lightning_fedkg.federated.stances`):
pinned by its policy, checked against what it holds, or harmless. Two tests hold that:

* **coverage**: honest runs of the configurations below record every field each client half
  receives; one without a declared stance fails (a new field must say what the client does
  with it), and so does a declaration no run exercises (a stance of a field that is gone);
* **deviations**: under secure aggregation with ``active`` and distributed DP, each field
  the victim receives is sent, one at a time, a deviating value (another round's, another
  run's, another client's, scaled, dropped), and the round runs on. Either the victim
  refuses, or its guarantee still holds: the server, rebuilding what it can from every share
  it got and the masking positions it sent, reads none of the victim's uploaded rows, and
  the victim's ledger charged its upload at its own σ. A pinned or checked field must be
  refused by at least one deviation (its check is real).

The attacks of issue 57's review (``active`` switched off, σ and holder counts from the
server, a release never charged, replayed signatures, the querier's reveal) and the holder
sets found while writing this are their own tests (test_client_policy, test_dp_threats,
test_adversarial_server, test_fedcqa_private_retrieval); here every field gets its turn.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from lightning_fedkg.privacy.secure import protocol as sa
from lightning_fedkg.federated.clients import LocalClients
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.federated.message import Message
from lightning_fedkg.privacy.secure import SecureClient
from lightning_fedkg.federated.stances import receives
from lightning_fedkg.federated.strategy import RetryRound
from lightning_fedkg.privacy.mechanisms import secagg

from test_protocol import umls_config

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

VICTIM, T, BITS = "client_1", "entity_emb", 16
SA_ON = {"federated__secure_aggregation__enabled": True}
#: Secure aggregation against a deviating server, with distributed DP: what the deviations attack.
GUARDED = {**SA_ON, "federated__secure_aggregation__active": True, "federated__secure_aggregation__threshold": 2,
           "federated__dp__enabled": True, "federated__dp__noise_multiplier": 1.0,
           "federated__dp__placement": "distributed"}
HIDDEN = {"federated__secure_aggregation__hide_aggregate": True, "federated__federation_key": "k" * 24}


# ---------------------------------------------------------------- fields
def _tokens(name: str, run) -> str:
    """``name`` with what varies written as the declarations write it."""
    peers = set(run.pool.names)
    groups = set(getattr(run.server, "groups", ()))
    # a tensor's name may hold dots (``attention.0.bias``): whole names first, the longest first
    for tensor in sorted(getattr(run.server, "table", {}), key=len, reverse=True):
        name = re.sub(rf"(?<![\w]){re.escape(tensor)}(?![\w])", "{tensor}", name)
    out = []
    for token in re.split(r"([.@:])", name):
        if token in peers:
            token = "{peer}"
        elif token in groups:
            token = "{group}"
        elif token in ("train", "upload") and out and out[0] == "arrays" and "okey" in out:
            token = "{stage}"
        elif token.isdigit():
            token = "{n}"
        elif re.fullmatch(r"[a-z]\d+", token):
            token = token[0] + "{n}"
        out.append(token)
    return "".join(out)


def _flat(config: dict, prefix: str = "config") -> dict[str, object]:
    out = {}
    for key, value in config.items():
        path = f"{prefix}.{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, path))
        else:
            out[path] = value
    return out


def fields_of(message: Message, run) -> dict[str, list[str]]:
    """``{declared form: [concrete paths]}`` of every field of ``message``."""
    out: dict[str, list[str]] = {}
    for path in [f"arrays.{k}" for k in message.arrays] + list(_flat(message.config)) + \
            [f"metrics.{k}" for k in message.metrics]:
        out.setdefault(_tokens(path, run), []).append(path)
    return out


def record_fields(monkeypatch) -> dict[tuple[type, str], set[str]]:
    """Spy on the in-process pool: ``{(client half class, stage): {declared form}}``."""
    seen: dict[tuple[type, str], set[str]] = {}
    exchange, deliver = LocalClients.exchange, LocalClients.deliver

    def note(pool, stage, name, message):
        run = pool._run
        seen.setdefault((type(pool.halves[name]), stage), set()).update(fields_of(message, run))

    def spy_exchange(self, round, stage, messages, wire, channel, timeout):
        for name, message in messages.items():
            note(self, stage, name, message)
        return exchange(self, round, stage, messages, wire, channel, timeout)

    def spy_deliver(self, round, name, message, down, channel):
        note(self, "deliver", name, message)
        return deliver(self, round, name, message, down, channel)

    monkeypatch.setattr(LocalClients, "exchange", spy_exchange)
    monkeypatch.setattr(LocalClients, "deliver", spy_deliver)
    return seen


def honest_run(cfg, rounds=2, upload=False):
    run = FederatedRun(cfg, run_dir=None)
    run.pool._run = run
    run.align()
    for r in range(1, rounds + 1):
        run.train_round(r)
    if upload:  # a phase's masked upload outside the round schedule (FedLU's unlearning)
        run.stage(rounds + 1, "upload")
    run.evaluate("val", rounds)
    run.load_evaluation_state(rounds, "test")
    run.evaluate("test", rounds)
    run.close()
    return run


def fedcqa_config(tmp_path):
    from test_fedcqa_private_retrieval import tiny

    return tiny(tmp_path, tmp_path / "queries", "private", federated__record_payloads="false",
                federated__secure_aggregation__enabled="false", federated__secure_aggregation__hide_aggregate="false",
                federated__strategy="fedcqa_fede", federated__aggregation="named_rows")


#: The configurations whose honest runs the coverage test records (the FedCQA one is built
#: with a query cache in the test's folder).
COVERAGE = {
    "fede": {},
    "guarded": GUARDED,
    "guarded_hidden": {**GUARDED, **HIDDEN},
    "dense_hidden_local_dp": {**SA_ON, **HIDDEN, "federated__secure_aggregation__mode": "dense",
                              "federated__secure_aggregation__active": True, "federated__dp__enabled": True,
                              "federated__dp__noise_multiplier": 1.0},
    "fedlu_secure": {**SA_ON, **HIDDEN, "federated__strategy": "fedlu"},
}


def test_every_field_a_client_receives_has_a_declared_stance(tmp_path, monkeypatch):
    seen = record_fields(monkeypatch)
    for name, overrides in COVERAGE.items():
        honest_run(umls_config(**overrides), upload=name == "fedlu_secure")
    honest_run(fedcqa_config(tmp_path), rounds=1)
    missing, used = [], set()
    for (cls, stage), forms in sorted(seen.items(), key=lambda kv: (kv[0][0].__name__, kv[0][1])):
        declared = receives(cls).get(stage, {})
        missing += [f"{cls.__name__} {stage}: {form}" for form in sorted(forms) if form not in declared]
        # which declaring class (a mixin or a half) each seen field's stance comes from
        used |= {(base, stage, form) for base in cls.__mro__ for form in forms
                 if form in vars(base).get("RECEIVES", {}).get(stage, {})}
    assert not missing, "fields without a declared stance (declare them in the half's RECEIVES):\n" + \
        "\n".join(missing)
    # and no declaration of a field that no run sends any more
    declaring = {base for base, _, _ in used}
    stale = [f"{base.__name__} {stage}: {form}" for base in declaring
             for stage, forms in vars(base)["RECEIVES"].items() for form in forms if (base, stage, form) not in used]
    assert not stale, "declared stances of fields no honest run sends:\n" + "\n".join(sorted(stale))


# ---------------------------------------------------------------- deviations
DROP = object()


def _get(message: Message, path: str):
    kind, _, rest = path.partition(".")
    if kind == "arrays":
        return message.arrays[rest]
    node = message.config
    for part in rest.split(".")[:-1]:
        node = node[part]
    return node[rest.split(".")[-1]]


def _set(message: Message, path: str, value) -> None:
    kind, _, rest = path.partition(".")
    if kind == "arrays":
        if value is DROP:
            message.arrays.pop(rest, None)
        else:
            message.arrays[rest] = value
        return
    node = message.config
    parts = rest.split(".")
    for part in parts[:-1]:
        node = node[part]
    if value is DROP:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def _scaled(value):
    """A value of the same kind, changed: numbers doubled (and moved off zero), names
    thinned or joined by a stranger, bytes with one flipped, text altered."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 2 * value + 1
    if isinstance(value, str):
        return value[::-1] if len(value) > 1 else value + "x"
    if isinstance(value, list):
        return value[1:] if len(value) > 1 else [*value, "client_9"]
    if torch.is_tensor(value):
        if value.dtype == torch.uint8:
            flipped = value.clone()
            flipped.view(-1)[0] ^= 1
            return flipped
        if value.is_floating_point():
            return value * 2
        return value * 2 + 1
    return value


LABELS = ("dropped", "scaled", "another round's", "another run's", "another client's", "another peer's")


def deviation(label: str, path: str, messages: dict[str, Message], earlier: Message | None,
              elsewhere: Message | None):
    """The victim's field ``path`` deviated as ``label`` says, given this stage's honest
    ``messages``, the victim's message of the round before (``earlier``) and of another
    run (``elsewhere``); ``None`` when the deviation does not apply or changes nothing.
    (:class:`Round` applies ``dropped`` and ``scaled`` to every instance of a field.)"""
    honest = _get(messages[VICTIM], path)
    if label == "dropped":
        return DROP
    if label == "scaled":
        value = _scaled(honest)
    elif label in ("another round's", "another run's"):
        source = earlier if label == "another round's" else elsewhere
        try:
            value = _get(source, path) if source is not None else None
        except (KeyError, TypeError):
            value = None
    elif label == "another client's":
        other = next((m for n, m in messages.items() if n != VICTIM), None)
        try:
            value = _get(other, path) if other is not None else None
        except (KeyError, TypeError):
            value = None
    else:  # another peer's: the value this field carries for another peer of the victim
        peer = re.search(r"client_\d+", path)
        value = None
        if peer and path.startswith("arrays."):
            for name in messages:
                swapped = path.replace(peer.group(0), name)
                if name not in (peer.group(0), VICTIM) and swapped.split(".", 1)[1] in messages[VICTIM].arrays:
                    value = _get(messages[VICTIM], swapped)
                    break
    if value is None or _equal(value, honest):
        return None
    return value.clone() if torch.is_tensor(value) else copy.deepcopy(value)


def _equal(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


class Round:
    """One training round in which the victim's message at ``stage`` has its field ``path``
    deviated as ``label`` says (none: an honest round); the rest of the round runs honestly
    as far as it goes. ``history`` holds the victim's honest messages of the round before,
    by stage, and is updated with this round's; ``elsewhere``, another run's."""

    def __init__(self, run, round, history, elsewhere, stage=None, path=None, label=None):
        self.refused, self.applied = None, stage is None
        self.uploads, self.record, self.unmask, self.sent_train = None, None, {}, None
        server = run.server
        selected = server.select_clients(round)
        earlier = dict(history)
        for step in server.stages:
            messages = getattr(server, f"configure_{step}")(round, selected)
            if VICTIM not in messages:  # the victim refused an earlier stage: left out
                return
            history[step] = copy.deepcopy(messages[VICTIM])
            if step == stage:
                # dropped and scaled hit every instance of the field (every peer's), the others one
                paths = path if label in ("dropped", "scaled") else path[:1]
                values = [deviation(label, p, messages, earlier.get(step), elsewhere.get(step)) for p in paths]
                if any(v is None for v in values):
                    return  # nothing to deviate: the round is abandoned, the next one starts afresh
                for p, v in zip(paths, values):
                    _set(messages[VICTIM], p, v)
                self.applied = True
            if step == "train":
                self.sent_train = messages[VICTIM]
            record = server._round
            replies, failures = run.exchange(round, step, messages)
            if step == stage and VICTIM in failures:
                self.refused = failures[VICTIM]
            if step == "sa_unmask":
                self.unmask = replies
            try:
                getattr(server, f"aggregate_{step}")(round, replies, failures)
            except Exception:  # a round the deviation broke ends here (RetryRound, or worse)
                return
            if step == "train":
                self.uploads, self.record = record.uploads, record

    def read_victim(self):
        """The victim's upload as the server can read it: minus every mask the server can
        rebuild from the shares it got, at the positions it sent; ``None``: it cannot even
        take off the self-mask, or there was no upload."""
        if not self.uploads or VICTIM not in self.uploads:
            return None
        st = self.record
        order = {n: i + 1 for i, n in enumerate(st.parties)}

        def secret(kind: str, owner: str):
            shares = {order[h]: sa._bytes(r.arrays[f"{kind}.{owner}"]) for h, r in self.unmask.items()
                      if f"{kind}.{owner}" in r.arrays and h in order}
            return secagg.combine_secret(shares, st.threshold) if len(shares) >= st.threshold else None

        seed = secret("b", VICTIM)
        if seed is None:
            return None
        y = self.uploads[VICTIM][T].clone()
        y -= sa._words(secagg.derive_key(seed, f"fedkg-sa-self|{st.round}|{st.stage}|{T}"), y.shape)
        mine = secret("s", VICTIM)
        for peer in st.shared:
            if peer == VICTIM or f"sa.pos.{peer}.{T}" not in self.sent_train.arrays:
                continue
            theirs = secret("s", peer)
            if mine is not None:
                shared_key = secagg.agree(mine, st.s_pk[peer])
            elif theirs is not None:
                shared_key = secagg.agree(theirs, st.s_pk[VICTIM])
            else:
                continue  # that pair's mask stays on
            key = secagg.derive_key(shared_key, sa._pair_info(st.round, st.stage, T, VICTIM, peer))
            pos = self.sent_train.arrays[f"sa.pos.{peer}.{T}"].long()
            pos = pos[(pos >= 0) & (pos < y.shape[0])]
            y[pos] -= sa._sign(VICTIM, peer) * sa._words(key, (pos.numel(), y.shape[1]))
        return secagg.signed(torch.remainder(y, secagg.MODULUS))


def guarded_fields(run) -> list[tuple[str, str, list[str]]]:
    """``(stage, declared form, its concrete paths)`` of every field the victim receives in
    an honest guarded round whose stance holds under the run's config."""
    stances, out = receives(type(run.client_halves[VICTIM])), []
    server = run.server
    selected = server.select_clients(90)
    for step in server.stages:
        messages = getattr(server, f"configure_{step}")(90, selected)
        for form, paths in fields_of(messages[VICTIM], run).items():
            if stances[step][form].holds(run.cfg):
                out.append((step, form, paths))
        replies, failures = run.exchange(90, step, messages)
        getattr(server, f"aggregate_{step}")(90, replies, failures)
    return out


def test_a_deviating_value_in_any_field_is_refused_or_the_guarantee_holds(monkeypatch):
    plain: dict[int, torch.Tensor] = {}
    original = SecureClient._mask

    def spy(self, stage, arrays, extra, info):
        if self.party.name == VICTIM:
            x = arrays[T]
            plain[int(info["round"])] = secagg.quantise(x.reshape(x.shape[0], -1), BITS, secagg.MODULUS)
        return original(self, stage, arrays, extra, info)

    monkeypatch.setattr(SecureClient, "_mask", spy)
    run = FederatedRun(umls_config(**GUARDED), run_dir=None)
    run.pool._run = run
    run.align()
    elsewhere: dict = {}
    other = FederatedRun(umls_config(**GUARDED, seed=1), run_dir=None)  # other identities, keys and ids
    other.align()
    Round(other, 1, elsewhere, {})
    other.close()
    cases = guarded_fields(run)
    assert len(cases) >= 25, cases
    victim = run.client_halves[VICTIM]
    stances = receives(type(victim))
    history: dict = {}
    round, results = 100, {}
    for stage, form, path in cases:
        for label in LABELS:
            Round(run, round, history, elsewhere)  # honest: the round before, for "another round's"
            round += 1
            played = Round(run, round, history, elsewhere, stage, path, label)
            if played.applied:
                if not played.refused:
                    read = played.read_victim()
                    if read is not None:
                        leaked = (read[:, :-1] == plain[round]).all(1) & (read[:, -1] == 1)
                        assert not bool(leaked.any()), (stage, form, label, int(leaked.sum()))
                    if played.uploads and VICTIM in played.uploads:  # charged when sent, at its own σ
                        assert any(e[0] == round and e[1] <= victim._sigma for e in victim.events), (stage, form)
                results.setdefault((stage, form), []).append(f"{label}: {'refused' if played.refused else 'held'}")
            round += 1
    unchecked = [f"{stage} {form}: {outcomes}" for (stage, form), outcomes in results.items()
                 if stances[stage][form].kind in ("pinned", "checked")
                 and not any(o.endswith("refused") for o in outcomes)]
    assert not unchecked, "pinned or checked fields no deviation was refused for:\n" + "\n".join(unchecked)
    assert {(stage, form) for stage, form, _ in cases} == set(results)  # every field got a deviation
    run.close()


def test_the_stance_page_is_what_the_declarations_say():
    """docs/stances.md's tables are rendered from the code's declarations, never typed."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "render_stances.py"
    spec = importlib.util.spec_from_file_location("render_stances", path)
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    text = render.PAGE.read_text(encoding="utf-8")
    assert render.rendered(text) == text, "docs/stances.md differs: run python scripts/tools/render_stances.py"
