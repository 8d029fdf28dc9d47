"""Config validation against config/schema.yaml, with errors that name the key and the fix."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from eagle3_pipeline.servers import config_problems
from eagle3_pipeline.settings import Settings, build_settings
from eagle3_pipeline.target_shape import AUTO_MIN_LAYERS, AuxLayerError, TargetShape, aux_layers


class ConfigError(ValueError):
    """A config value the pipeline cannot run with; the message names the key and the fix."""


def load_schema(schema_path: str | Path) -> dict[str, Any]:
    return yaml.safe_load(Path(schema_path).read_text())


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def _sub_schema(schema: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    node = schema
    for part in path:
        node = node.get("properties", {}).get(str(part), {})
    return node


def _describe(error: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    key = _key_path(error)
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        where = f"under '{key}'" if error.absolute_path else "at the top level"
        return f"unknown key(s) {extra} {where}; allowed keys are {known} (see config/schema.yaml)"
    if error.validator == "required":
        return f"{error.message} in '{key}'; add it (see config/schema.yaml)"
    description = _sub_schema(schema, list(error.absolute_path)).get("description", "")
    hint = f" ({description})" if description else ""
    if error.validator in ("pattern", "maxLength"):  # the regex says less than the description
        return f"'{key}': {error.instance!r} is not allowed{hint}"
    return f"'{key}': {error.message}{hint}"


def _set_defaults(document: dict[str, Any], schema: dict[str, Any]) -> None:
    """Fill absent keys from the schema's defaults, recursing into objects."""
    for name, sub in schema.get("properties", {}).items():
        if name not in document and "default" in sub:
            document[name] = yaml.safe_load(yaml.safe_dump(sub["default"]))  # a copy
        if isinstance(document.get(name), dict) and sub.get("type") == "object":
            _set_defaults(document[name], sub)


def check_config(raw: dict[str, Any], schema_path: str | Path) -> dict[str, Any]:
    """Validate the user's config document in place (defaults filled in) and check what a schema
    cannot express, on the typed settings. The one place the untyped document is read: everything
    after takes `settings.build_settings(raw)`.

    Raises ConfigError listing every problem, each naming its key and how to fix it.
    """
    schema = load_schema(schema_path)
    _set_defaults(raw, schema)
    validator = jsonschema.Draft202012Validator(schema)
    problems = [_describe(e, schema) for e in sorted(validator.iter_errors(raw), key=str)]
    if not problems:
        problems = _semantic_problems(build_settings(raw))
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return raw


def _semantic_problems(settings: Settings) -> list[str]:
    problems = config_problems(settings.server)
    path = settings.dataset.path
    if "://" not in path and not Path(path).exists():
        problems.append(
            f"'dataset.path': {path!r} does not exist; point it at a .jsonl, a .parquet, a folder of "
            "parquet files or hf://datasets/ORG/NAME"
        )
    problem = _layer_problem(settings.hidden_states.layers, Path(settings.target.model))
    if problem:
        problems.append(problem)
    if settings.draft.norm_before_fc and settings.draft.fc_norm:
        # vLLM (llama_eagle3.py) would apply both norms, speculators refuses the pair: nothing serves it
        problems.append(
            "'draft.norm_before_fc' and 'draft.fc_norm' are both true: they are exclusive (one norm over "
            "the concatenated auxiliary states, or one per state); set one of them to false"
        )
    batch_tokens, max_seq_len = settings.train.batch_tokens, settings.hidden_states.max_seq_len
    if batch_tokens < max_seq_len:
        # a batch holds whole samples: a sample longer than the batch would be cut, and its tail (the
        # end of the completion, extracted at a cost) never trained on
        problems.append(
            f"'train.batch_tokens' ({batch_tokens}) is below 'hidden_states.max_seq_len' ({max_seq_len}): "
            "the longest extracted samples would be cut in training; raise train.batch_tokens to at "
            f"least {max_seq_len} or lower hidden_states.max_seq_len to {batch_tokens}"
        )
    return problems


def target_num_layers(target: Path) -> int | None:
    """The target's decoder layer count from its config.json (a VL wrapper's text_config), when it is
    there to read: the demo's target is built by a rule, so at parse time it may not exist yet."""
    try:
        return TargetShape.load(target).num_layers
    except (OSError, ValueError):
        return None


def _layer_problem(layers: str | tuple[int, ...], target: Path) -> str | None:
    """hidden_states.layers against the target's depth, by the rule the job applies (target_shape)."""
    if isinstance(layers, tuple) and len(set(layers)) != len(layers):
        return f"'hidden_states.layers': {list(layers)} repeats a layer; give three distinct 0-indexed layers"
    num_layers = target_num_layers(target)
    if num_layers is None:
        return None
    try:
        aux_layers(layers, num_layers)
    except AuxLayerError:
        if layers == "auto":
            return (
                f"'hidden_states.layers': auto needs >= {AUTO_MIN_LAYERS} decoder layers, {target} has "
                f"{num_layers}; give three distinct layers in [0, {num_layers})"
            )
        return (
            f"'hidden_states.layers': {list(layers)} out of range for {target} "
            f"({num_layers} decoder layers): each must be in [0, {num_layers - 1}] (0-indexed decoder-layer "
            "outputs), or use auto"
        )
    return None


# The trace splits, in the order every rule lists their files (split_traces, extract_hidden_states).
SPLITS = ("train", "validation")


def shard_ids(num_samples: int, shard_size: int) -> list[str]:
    """Shard names for `num_samples` questions: fixed by config so that dry runs see every job."""
    return [f"{k:05d}" for k in range(math.ceil(num_samples / shard_size))]
