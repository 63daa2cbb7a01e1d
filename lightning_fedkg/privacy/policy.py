"""A client's own policy: the settings that decide what it reveals, held by the client.

A client takes what it reveals from what its organisation provisioned, never from a server.
In process one operator runs every party, and each client half reads the config it was built
with. Under Flower the run's config comes from the server at registration, so the
organisation writes ``policy.yaml`` beside its key file (``fedkg flower policy``; ``fedkg
flower up`` on one machine): the client compares the server's config with it before it builds
anything and refuses one that differs on a pinned setting, naming each.

Pinned (:func:`pinned_keys`): the strategy and task (which tables cross), the aggregation
rule, the federation's size, every setting of secure aggregation and of DP, ``federated.rounds``
when σ is calibrated to a target ε over them, and the keys a task declares
(:attr:`~lightning_fedkg.federated.tasks.Task.policy_keys`). Not the federation secret: a Flower client reads it from
its own key file only. Threat model: docs/privacy.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lightning_fedkg.config import ConfigError, DPConfig, ExperimentConfig, SecureAggregationConfig

__all__ = ["POLICY_FILE", "ClientPolicy", "pinned_keys", "read_policy", "write_policy"]

#: The policy's file name, beside a Flower client's key file (and its ``identities/``).
POLICY_FILE = "policy.yaml"

_CORE = (
    "federated.strategy", "federated.task", "federated.aggregation", "data.num_clients",
    *(f"federated.secure_aggregation.{f.name}" for f in dataclasses.fields(SecureAggregationConfig)),
    *(f"federated.dp.{f.name}" for f in dataclasses.fields(DPConfig)),
)
#: ``federated.rounds`` is pinned when σ is calibrated to a target ε over that many uploads.
_SCHEDULE = "federated.rounds"
_MISSING = object()


def _get(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part, _MISSING)
        if node is _MISSING:
            return _MISSING
    return node


def pinned_keys(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The dotted keys of ``cfg`` that a client's policy pins (see the module doc)."""
    keys = list(_CORE)
    if cfg.federated.dp.enabled and cfg.federated.dp.epsilon is not None:
        keys.append(_SCHEDULE)
    task = _task_policy_keys(cfg)
    keys += [f"task.{k}" for k in task]
    return tuple(keys)


def _task_policy_keys(cfg: ExperimentConfig) -> tuple[str, ...]:
    if cfg.federated.strategy == "none" or getattr(cfg, "task", None) is None:
        return ()
    from lightning_fedkg.registry import TASKS

    return tuple(getattr(TASKS.get(cfg.federated.task), "policy_keys", ()))


def _show(value: Any) -> str:
    return "unset" if value is _MISSING else repr(value)


@dataclasses.dataclass(frozen=True)
class ClientPolicy:
    """The pinned settings a client holds (``{dotted key: value}``) and where they came from."""

    values: dict[str, Any]
    source: str

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, source: str = "this client's config") -> "ClientPolicy":
        """The policy ``cfg`` sets (in process: the config the client was built with)."""
        return cls({k: _get(cfg, k) for k in pinned_keys(cfg)}, source)

    def differences(self, cfg: ExperimentConfig) -> list[str]:
        """One line per pinned setting on which ``cfg`` and the policy disagree."""
        lines = []
        for key in dict.fromkeys([*self.values, *pinned_keys(cfg)]):
            mine, theirs = self.values.get(key, _MISSING), _get(cfg, key)
            if mine != theirs:
                lines.append(f"{key}: the run's config has {_show(theirs)}, this client's policy {_show(mine)}")
        return lines

    def check(self, cfg: ExperimentConfig, client: str, what: str) -> None:
        """Raise :class:`ConfigError` naming every pinned setting on which ``cfg`` (``what``:
        where it came from) differs from the policy."""
        lines = self.differences(cfg)
        if lines:
            raise ConfigError(f"{client} refuses {what}: it differs from its policy ({self.source}) on "
                              f"{len(lines)} setting(s) that decide what it reveals:\n  " + "\n  ".join(lines)
                              + "\nChange the run's config, or the organisation's policy if it agrees")

    @property
    def members(self) -> list[str]:
        """The federation's clients as the policy knows them (``data.num_clients``)."""
        from lightning_fedkg.federated.strategy import client_name

        return [client_name(k) for k in range(int(self.values["data.num_clients"]))]


def _nested(values: dict[str, Any]) -> dict:
    out: dict = {}
    for key, value in values.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def write_policy(cfg: ExperimentConfig, path: str | Path) -> Path:
    """Write ``cfg``'s pinned settings to ``path`` (owner-only) as the client's policy."""
    from omegaconf import OmegaConf

    from lightning_fedkg.atomic import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = ClientPolicy.from_config(cfg).values
    text = ("# What this client reveals: a run whose config differs on any of these settings is refused.\n"
            "# Written by lightning_fedkg (docs/privacy.md, 'A client's policy'); edit it to change the policy.\n"
            + OmegaConf.to_yaml(OmegaConf.create(_nested(values))))
    write_atomic(path, lambda f: f.write(text.encode("utf-8")), mode=0o600)
    return path


def read_policy(path: str | Path) -> ClientPolicy:
    """The :class:`ClientPolicy` of a ``policy.yaml``. Its keys are checked against the
    config schema (a misspelled key is an error naming the valid ones) and against the
    pinned settings; a pinned setting it leaves out takes the schema's default. Raises
    :class:`ConfigError` naming the file when it is missing or malformed."""
    from lightning_fedkg.config import build_config, parse_yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no client policy at {path}: a Flower client takes what it reveals (secure aggregation, "
                          f"DP, the strategy) from its organisation's own policy file, never from the server's "
                          f"config. Write one with `fedkg flower policy -c CONFIG --out {path}` "
                          "(docs/deployment.md, 'What an organisation runs on its own machine')")
    layer = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    cfg = build_config([(layer, str(path))])
    from omegaconf import OmegaConf

    given = _flatten(OmegaConf.to_container(layer, resolve=True))
    allowed = set(pinned_keys(cfg)) | {_SCHEDULE}
    extra = sorted(k for k in given if k not in allowed)
    if extra:
        raise ConfigError(f"{path}: {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not a policy setting; "
                          f"a policy pins: {', '.join(sorted(allowed))}")
    values = {k: _get(cfg, k) for k in pinned_keys(cfg)}
    if _SCHEDULE in given and _SCHEDULE not in values:
        values[_SCHEDULE] = _get(cfg, _SCHEDULE)
    return ClientPolicy(values, str(path))


def _flatten(values: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out
