"""Loading a configuration: YAML files, their ``base:`` composition, ``key=value``
overrides, and where a moved config now lives.

Loading merges the structured defaults, the YAML file (over the files it builds on), then
``key=value`` overrides; an unknown key is an error listing the valid keys of its section.
Entry point: :func:`load_config`.
"""

from __future__ import annotations

import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import IO, Any, Sequence

import yaml  # omegaconf's own YAML parser (PyYAML), already loaded with it
from omegaconf import DictConfig, OmegaConf

from .schema import LOSSES, REBUILD, ConfigError, ExperimentConfig, FederatedConfig, ModelConfig, TrainerConfig
from .sections import experiment_class, section_classes
from .validation import YamlSource, at_position, merge_layer, validate_names, validate_ranges

def build_config(layers: Sequence[tuple[DictConfig, str]], sections: Sequence[str] = (),
                 strict: bool = False) -> ExperimentConfig:
    """Merge ``(layer, source)`` pairs, in order, over the defaults of the sections their
    names resolve to (:func:`section_classes`, ``strict`` as there); check ranges and names.

    Raises :class:`ConfigError` naming the source and the key (with the valid keys). The
    core sections are checked first (:func:`core_config`), before a name is resolved,
    so that their mistakes are reported without importing torch.
    """
    core_config(layers)
    raw = OmegaConf.create({})
    for layer, _ in layers:
        raw = OmegaConf.merge(raw, layer)
    cfg = OmegaConf.structured(experiment_class(*section_classes(raw, sections, strict)))
    for layer, source in layers:
        cfg = merge_layer(cfg, layer, source)
    return validate_names(validate_ranges(OmegaConf.to_object(cfg)))


def _last_set(layers: Sequence[tuple[DictConfig, str]], section: str, key: str, default: Any) -> Any:
    """``section.key`` as the last layer that sets it gives it (unresolved), else ``default``."""
    value = default
    for layer, _ in layers:
        node = layer.get(section) if isinstance(layer, DictConfig) else None
        if isinstance(node, DictConfig) and key in node:
            value = node.get(key)
    return value


def _is_builtin_model(name: Any) -> bool:
    """Whether ``model.name`` names one of this package's KGE models (from its entry point's
    target, without importing it)."""
    from lightning_fedkg.registry import MODELS

    if not isinstance(name, str) or ":" in name:
        return False
    ep = MODELS._declared().get(name.lower())
    return ep is not None and ep.value.startswith("lightning_fedkg.models.")


def core_config(layers: Sequence[tuple[DictConfig, str]]) -> ExperimentConfig:
    """The core sections of ``layers`` (keys, types and ranges checked), without the
    sections a name adds: nothing is imported, so this is fast. A method section is a
    mapping that is not a core field (under ``federated``, or at the top level); a
    misspelled one is reported by :func:`build_config`, once the names are resolved."""
    federated_core = {f.name for f in fields(FederatedConfig)}
    top_core = {f.name for f in fields(ExperimentConfig)}
    model_core = {f.name for f in fields(ModelConfig)}
    # A user model's own options are known once it is resolved (an import); the built-in
    # models take no option ModelConfig lacks, so with one of them a misspelled model key
    # (the commonest slip, model.dimm=...) is reported here, before torch is imported.
    builtin_model = _is_builtin_model(_last_set(layers, "model", "name", default="transe"))
    from lightning_fedkg.registry import MODELS, PHASES, STRATEGIES, TASKS, RegistryError

    # A method's section given as a value (federated.fede: 3) is left to build_config too,
    # whose schema has the section and says it must be a mapping (not "unknown key").
    federated_methods, top_methods = set(STRATEGIES.names()), {"task", *PHASES.names()}

    def strip(layer: DictConfig) -> DictConfig:
        values = OmegaConf.to_container(layer, resolve=False)
        fed = values.get("federated")
        if isinstance(fed, dict):
            values["federated"] = {k: v for k, v in fed.items()
                                   if k in federated_core or not (isinstance(v, dict) or k in federated_methods)}
        model = values.get("model")
        if isinstance(model, dict) and not builtin_model:
            values["model"] = {k: v for k, v in model.items() if k in model_core}
        return OmegaConf.create({k: v for k, v in values.items()
                                 if k in top_core or not (isinstance(v, dict) or k in top_methods)})

    cfg = OmegaConf.structured(ExperimentConfig)
    for layer, source in layers:
        cfg = merge_layer(cfg, strip(layer), source)
    core = validate_ranges(OmegaConf.to_object(cfg))
    # Unknown names are errors the registries give from their entry points alone (a known
    # name is resolved, and its options checked, by build_config).
    for key, registry, name in (("model.name", MODELS, core.model.name),
                                ("federated.strategy", STRATEGIES, core.federated.strategy),
                                ("federated.task", TASKS, core.federated.task)):
        if name != "none" and ":" not in name and name.lower() not in registry.names():
            try:
                registry.get(name)
            except RegistryError as err:
                raise ConfigError(f"{key}: {err}") from None
    if core.train.loss not in LOSSES:
        raise ConfigError(f"train.loss: unknown loss {core.train.loss!r}; valid: {', '.join(LOSSES)}")
    return core


_NODE_KINDS = {yaml.SequenceNode: "list", yaml.ScalarNode: "single value"}


def parse_yaml(text: str, source: str) -> DictConfig:
    """``text`` (a config file's content) as an omegaconf mapping, before any checks of keys.

    A YAML syntax error, or a top level that is not a mapping of sections, raises
    :class:`ConfigError` as ``source:line:column: reason`` (1-based, where the parser
    stopped), the form editors and compilers use, instead of PyYAML's multi-line report.
    """
    try:
        # Composing first (no values built) finds syntax errors and gives the top-level
        # node with its position, which omegaconf's result no longer has.
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None and not isinstance(root, yaml.MappingNode):
            kind = _NODE_KINDS.get(type(root), "value")
            raise ConfigError(at_position(source, root.start_mark, "the top level must be a mapping of sections "
                                                           f"(data:, model:, train:, ...), not a {kind}"))
        return OmegaConf.create(text) if root is not None else OmegaConf.create()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        if mark is None:  # e.g. a reader error (a control character): no position to show
            raise ConfigError(f"{source}: {str(err).splitlines()[0]}") from None
        reason = err.problem or "invalid YAML"
        lines = text.splitlines()
        # PyYAML's word for a tab is "character that cannot start any token".
        if mark.line < len(lines) and lines[mark.line][mark.column:mark.column + 1] == "\t":
            reason += " (a tab: indent YAML with spaces)"
        context = getattr(err, "context_mark", None)
        if err.context and context is not None and (context.line, context.column) != (mark.line, mark.column):
            reason += f" ({err.context} that starts at line {context.line + 1}, column {context.column + 1})"
        raise ConfigError(at_position(source, mark, reason)) from None


#: The key a config file names the files it builds on with (:func:`file_layers`).
BASE_KEY = "base"


def file_layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[DictConfig, Any]]:
    """``(layer, source)`` of a config file and of the files it builds on, in merge order.

    A file may start from others: ``base: ../base/umls.yaml`` (or a list of paths, merged in
    order), relative to the file, each of which may name bases of its own; the file's own
    keys are merged last, so a shipped config is a short delta over what its siblings share.
    A plain list of files rather than Hydra's ``defaults`` groups: nothing to learn beyond
    "merged in order", and omegaconf does the merging. Errors name the file and the line."""
    if path.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path.resolve()))
        raise ConfigError(f"{path}: config bases form a cycle: {cycle}")
    text = path.read_text(encoding="utf-8")
    layer = parse_yaml(text, str(path))
    # A file with nothing in it (or only comments) would silently run every default: far
    # more likely a wrong or truncated file than an intent. `{}` says "defaults" on purpose.
    if yaml.compose(text, Loader=yaml.SafeLoader) is None:
        raise ConfigError(f"{path}: the config file is empty (no sections); give the sections to run "
                          f"(data:, model:, train:, ...), or write {{}} to run every default")
    out: list[tuple[DictConfig, Any]] = []
    bases = layer.get(BASE_KEY) if BASE_KEY in layer else None
    if bases is not None:
        names = [bases] if isinstance(bases, str) else list(bases) if OmegaConf.is_list(bases) else None
        if not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: '{BASE_KEY}' names the config files this one builds on: a path or a list "
                              f"of paths, relative to {path.parent}, got {OmegaConf.to_container(layer)[BASE_KEY]!r}")
        for name in names:
            base = (path.parent / name)
            if not base.is_file():
                raise ConfigError(f"{path}: its base {name} is not a file (looked for {base})")
            out += file_layers(base, (*chain, path.resolve()))
        layer = OmegaConf.create({k: v for k, v in layer.items() if k != BASE_KEY})
    out.append((layer, YamlSource(str(path), text)))
    return out


def moved_hint(path: Path) -> str:
    """Where a config that moved now lives (``configs/MOVED.txt``: ``old<TAB>new`` lines), as
    a sentence to add to "not found", or ''."""
    moved = Path(__file__).resolve().parents[2] / "configs" / "MOVED.txt"
    if not moved.is_file():
        return ""
    wanted = path.as_posix().lstrip("./")
    for line in moved.read_text(encoding="utf-8").splitlines():
        old, _, new = line.partition("\t")
        if new and (wanted == old or wanted.endswith("/" + old)):
            return f" (it moved to {new})"
    return ""


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                sections: Sequence[str] = (), core_only: bool = False) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from a YAML file and ``key=value`` overrides.

    ``sections`` names phase sections to include even when neither source sets them.
    ``core_only`` checks and returns the core sections only (:func:`core_config`: fast,
    nothing imported; what a command needs to find its run directory).
    Raises :class:`ConfigError` naming the offending key and listing the valid keys, or the
    file, line and column of a YAML syntax error (see :func:`parse_yaml`).
    """
    layers = []
    if path is not None:
        path = Path(path)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))
            hint = (f"; the YAML files in it: {', '.join(found[:10])}{', ...' if len(found) > 10 else ''}"
                    if found else "; it holds no .yaml file")
            raise ConfigError(f"config {path} is a directory, not a YAML file{hint}")
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}{moved_hint(path)}")
        layers += file_layers(path)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key=value, got: {' '.join(bad)}")
    if overrides:
        layers.append((OmegaConf.from_dotlist(list(overrides)), "command line"))
    return core_config(layers) if core_only else build_config(layers, sections, strict=True)


def config_from_container(values: dict) -> ExperimentConfig:
    """A config from plain nested values (what ``OmegaConf.to_container`` gives)."""
    return build_config([(OmegaConf.create(values), "config values")])


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the fully resolved config as YAML (the run directory's ``config.yaml``).

    Written to a temporary file beside ``path`` and moved into place with ``os.replace``:
    an interrupted write leaves the previous file, never half of one.
    """
    path = Path(path)
    from lightning_fedkg.atomic import write_atomic

    text = OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def config_from_yaml_text(text: str, sections: Sequence[str] = (), source: str = "config.yaml") -> ExperimentConfig:
    """Parse a resolved ``config.yaml`` back (used when resuming a run directory).

    ``source`` names the text in errors (the file's path where there is one).
    """
    return build_config([(parse_yaml(text, source), YamlSource(source, text))], sections)


REBUILD["from_values"] = config_from_container


def show_progress_bar(trainer: TrainerConfig, stream: IO | None = None) -> bool:
    """Whether to draw progress bars: ``trainer.progress_bar``, or when it is ``None``
    (the default), only if ``stream`` (``sys.stdout``, where tqdm and Lightning draw) is a
    terminal — redrawn bars in a log file are hundreds of kilobytes of noise."""
    if trainer.progress_bar is not None:
        return bool(trainer.progress_bar)
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


def resolve_auto_settings(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with ``trainer.progress_bar: null`` (auto) decided for this process's stdout.

    The saved ``config.yaml`` keeps ``null``; the runners get a plain bool (the federated
    round loop reads the field as one).
    """
    return replace(cfg, trainer=replace(cfg.trainer, progress_bar=show_progress_bar(cfg.trainer)))
