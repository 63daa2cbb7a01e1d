"""Channel: copies on send, a complete log, byte accounting, persistence."""

import json

import pytest
import torch

from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import tensor_bytes


def test_send_returns_detached_clone_and_logs_shape_dtype_bytes():
    ch = Channel()
    w = torch.randn(5, 4, requires_grad=True)
    ids = torch.arange(5)
    got = ch.send("server", "client_0", "download", {"w": w, "ids": ids}, round=3)
    assert not got["w"].requires_grad
    assert torch.equal(got["w"], w.detach())
    got["w"].zero_()  # the receiver's copy is its own
    assert w.abs().sum() > 0
    (rec,) = ch.records()
    assert (rec.round, rec.sender, rec.receiver, rec.name) == (3, "server", "client_0", "download")
    assert rec.shapes == {"w": [5, 4], "ids": [5]}
    assert rec.dtypes == {"w": "float32", "ids": "int64"}
    assert rec.bytes == 5 * 4 * 4 + 5 * 8 == tensor_bytes({"w": w, "ids": ids})


def test_filters_bytes_per_round_and_total():
    ch = Channel()
    ch.send("server", "client_0", "download", {"e": torch.zeros(10, 2)}, round=1)  # 80 B
    ch.send("client_0", "server", "upload", {"e": torch.zeros(10, 2)}, round=1)  # 80 B
    ch.send("client_1", "client_2", "handshake", {"g": torch.zeros(3, dtype=torch.float64)}, round=2)  # 24 B
    assert [r.name for r in ch.records(round=1)] == ["download", "upload"]
    assert [r.receiver for r in ch.records(sender="client_1")] == ["client_2"]
    assert ch.records(receiver="server", name="upload")[0].sender == "client_0"
    assert ch.records(round=7) == []
    assert ch.bytes_per_round() == {1: 160, 2: 24}
    assert ch.total_bytes == 184
    assert len(ch) == 3


def test_rejects_non_tensor_payloads_and_self_sends():
    ch = Channel()
    with pytest.raises(TypeError):
        ch.send("client_0", "server", "upload", {"triples": [[0, 1, 2]]}, round=1)
    with pytest.raises(ValueError):
        ch.send("server", "server", "noop", {"x": torch.zeros(1)}, round=1)
    assert len(ch) == 0


def test_broadcast_common_and_per_receiver_payloads():
    ch = Channel()
    out = ch.broadcast("server", ["client_0", "client_1"], "model", {"w": torch.ones(2)}, round=0)
    assert set(out) == {"client_0", "client_1"} and len(ch) == 2
    per = {"client_0": {"w": torch.zeros(1)}, "client_1": {"w": torch.zeros(3)}}
    out = ch.broadcast("server", ["client_0", "client_1"], "rows", per, round=1)
    assert out["client_1"]["w"].shape == (3,)
    assert [r.bytes for r in ch.records(round=1)] == [4, 12]


def test_jsonl_and_state_dict_roundtrip(tmp_path):
    ch = Channel()
    ch.send("server", "client_0", "download", {"e": torch.zeros(2, 3)}, round=1)
    ch.send("client_0", "server", "upload", {"e": torch.zeros(2, 3)}, round=1)
    path = tmp_path / "log.jsonl"
    ch.to_jsonl(path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["name"] for x in lines] == ["download", "upload"]
    assert lines[0]["shapes"] == {"e": [2, 3]} and lines[0]["bytes"] == 24
    other = Channel()
    other.load_state_dict(ch.state_dict())
    assert other.records() == ch.records() and other.total_bytes == 48


def test_relay_logs_bytes_serialized_elsewhere_as_send_does_and_forwards_them_unchanged(tmp_path):
    from lightning_fedkg.federated.message import Message, encode

    message = Message(arrays={"rows": torch.randn(4, 3), "ids": torch.arange(4)}, metrics={"n": 4},
                      config={"split": "val"})
    sent, relayed = Channel(), Channel()
    sent.send("client_0", "client_1", "rows", message, round=2)
    relayed.open_log(tmp_path / "log.jsonl", tmp_path / "payloads")
    data = encode(message)
    assert relayed.relay("client_0", "client_1", "rows", data, round=2) == data
    assert relayed.records() == sent.records()
    assert [p.read_bytes() for p in (tmp_path / "payloads").iterdir()] == [data]
    with pytest.raises(ValueError, match="itself"):
        relayed.relay("client_0", "client_0", "rows", data, round=2)
    with pytest.raises(Exception):
        relayed.relay("client_0", "client_1", "rows", b"not a message", round=2)
    assert len(relayed) == 1
