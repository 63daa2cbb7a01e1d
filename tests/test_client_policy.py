"""A client's policy is its own: a server's config that disagrees with it is refused.

A Flower client's run config comes from the server at registration; what it reveals is
decided by its organisation's ``policy.yaml`` beside its key file
(:mod:`lightning_fedkg.privacy.policy`). Each test plays a server that sends a config
lowering a guarantee, and says what it did on the code before the policy existed.
"""

from __future__ import annotations

import pytest

from lightning_fedkg.config import ConfigError
from lightning_fedkg.privacy.secure import protocol as sa
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.privacy.policy import POLICY_FILE, ClientPolicy, pinned_keys, read_policy, write_policy

from test_adversarial_server import secure
from test_protocol import umls_config

pytestmark = pytest.mark.usefixtures("one_thread")

ACTIVE = {"federated__secure_aggregation__active": True}


def _registered(tmp_path, registered_cfg, provisioned_cfg):
    """A Flower client whose organisation provisioned ``provisioned_cfg`` (identities and
    policy beside its key file), registered by the server with ``registered_cfg``."""
    from lightning_fedkg.backends.flower.backend import client_config_text, provision_beside_key, write_key_file
    from lightning_fedkg.backends.flower.client import ClientRuntime
    from lightning_fedkg.backends.flower.data import write_client_folders

    folders = write_client_folders(provisioned_cfg, tmp_path / "data")
    key = write_key_file("a long federation secret", tmp_path / "org" / "federation.key")
    provision_beside_key(provisioned_cfg, key, folders)
    client = ClientRuntime(folders[1], key, tmp_path / "work", "run1")
    answer, _ = client.handle({"kind": "hello", "config": client_config_text(registered_cfg)}, b"")
    return client, answer["digest"]


def _keys(client, digest, threshold=3):
    message = Message(config={"sa": {"round": 1, "threshold": threshold, "attempt": sa.new_attempt()}})
    head = {"kind": "stage", "stage": sa.SA_KEYS, "round": 1, "digest": digest}
    return decode(client.handle(head, encode(message))[1])


def test_a_flower_server_cannot_switch_active_off(tmp_path):
    """Finding 1 (HIGH): the organisation provisioned ``active`` secure aggregation (its
    roster, t = 3), and the server registered the client with the same config but
    ``active: false``. On the old code the client accepted it (the roster pinned only
    ``enabled`` and t), answered ``sa_keys`` with unsigned keys ({c_pk, s_pk}, no ``sig``)
    and later masked with the peers' mask keys as the server's message gave them: the
    key-substitution attack of test_adversarial_server then reads its exact upload. Now the
    config is refused before the client builds anything, naming the setting."""
    client, digest = _registered(tmp_path, secure(), secure(**ACTIVE))
    with pytest.raises(ConfigError, match=r"federated\.secure_aggregation\.active: the run's config has False, "
                                          r"this client's policy True"):
        _keys(client, digest)
    # the agreed config is answered, with signed keys
    client, digest = _registered(tmp_path / "agreed", secure(**ACTIVE), secure(**ACTIVE))
    assert set(_keys(client, digest).arrays) == {"c_pk", "s_pk", "sig"}


@pytest.mark.parametrize("change", [
    {"federated__dp__enabled": False},
    {"federated__dp__noise_multiplier": 0.01},
    {"federated__dp__placement": "local", "federated__secure_aggregation__enabled": False},
    {"federated__strategy": "fede"},
    {"federated__secure_aggregation__mode": "dense"},
    {"federated__secure_aggregation__hide_aggregate": False},
], ids=["dp_off", "less_noise", "no_secure_aggregation", "fedr_to_fede", "mode", "show_aggregate"])
def test_a_server_config_that_lowers_a_guarantee_is_refused(tmp_path, change):
    """The other settings a server could lower the same way (before the policy they were all
    the server's word): DP switched off or given less noise, secure aggregation off, FedR
    turned into FedE (entity rows cross instead of relation rows), another masking mode, the
    aggregate shown. Each is refused, naming the setting."""
    agreed = dict(federated__strategy="fedr", federated__secure_aggregation__enabled=True,
                  federated__secure_aggregation__hide_aggregate=True, federated__federation_key="k" * 20,
                  federated__dp__enabled=True, federated__dp__noise_multiplier=1.0,
                  federated__dp__placement="distributed")
    client, digest = _registered(tmp_path, umls_config(**{**agreed, **change}), umls_config(**agreed))
    first = next(iter(change)).replace("__", ".")
    with pytest.raises(ConfigError, match=first.replace(".", r"\.")):
        _keys(client, digest, threshold=2)


def test_the_policy_pins_what_decides_a_release_and_nothing_else(tmp_path):
    cfg = secure(federated__dp__enabled=True, federated__dp__epsilon=4.0)
    keys = pinned_keys(cfg)
    assert {"federated.secure_aggregation.active", "federated.dp.epsilon", "federated.rounds",
            "federated.strategy", "data.num_clients"} <= set(keys)
    assert "model.dim" not in keys and "federated.federation_key" not in keys
    assert "federated.rounds" not in pinned_keys(secure(federated__dp__enabled=True,
                                                        federated__dp__noise_multiplier=1.0))
    policy = ClientPolicy.from_config(cfg)
    # a config that differs only in what does not decide a release is accepted
    assert policy.differences(umls_config(**{"federated__secure_aggregation__enabled": True,
                                             "federated__dp__enabled": True, "federated__dp__epsilon": 4.0,
                                             "model__dim": 16, "train__lr": 0.5})) == []
    lines = policy.differences(secure(federated__dp__enabled=True, federated__dp__epsilon=8.0, federated__rounds=3))
    assert [line.split(":")[0] for line in lines] == ["federated.dp.epsilon", "federated.rounds"]


def test_a_policy_file_round_trips_and_its_errors_name_the_file(tmp_path):
    cfg = secure(**ACTIVE, federated__dp__enabled=True, federated__dp__epsilon=4.0)
    path = write_policy(cfg, tmp_path / POLICY_FILE)
    assert (path.stat().st_mode & 0o077) == 0
    assert read_policy(path) == ClientPolicy(ClientPolicy.from_config(cfg).values, str(path))
    # a short policy: what it leaves out takes the defaults
    short = tmp_path / "short.yaml"
    short.write_text("federated: {strategy: fede, secure_aggregation: {enabled: true}}\n")
    policy = read_policy(short)
    assert policy.values["federated.secure_aggregation.active"] is False and policy.values["data.num_clients"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("federated: {strategy: fede}\nmodel: {dim: 8}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: model\.dim is not a policy setting"):
        read_policy(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("federated: {strategy: fede, secure_aggregation: {actve: true}}\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: unknown config key 'federated\.secure_aggregation\.actve'"):
        read_policy(typo)
    with pytest.raises(ConfigError, match=r"no client policy at .*missing\.yaml.*fedkg flower policy"):
        read_policy(tmp_path / "missing.yaml")


def test_fedkg_flower_policy_writes_the_policy_of_a_config(tmp_path, capsys):
    from lightning_fedkg.cli import main

    out = tmp_path / "org" / POLICY_FILE
    assert main(["flower", "policy", "-c", "configs/fede/umls_fede.yaml", "--out", str(out),
                 "federated.secure_aggregation.enabled=true", "federated.secure_aggregation.active=true"]) == 0
    policy = read_policy(out)
    assert policy.values["federated.secure_aggregation.active"] is True
    assert policy.values["federated.strategy"] == "fede"
    assert str(out) in capsys.readouterr().out
