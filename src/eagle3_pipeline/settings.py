"""The validated config as typed, frozen sections: one dataclass per section of config/schema.yaml.

Built once, by `build_settings`, from the config `check_config` validated (its defaults filled in from
the schema). A default is written once, in the schema: `schema_defaults` gives each field here the
schema's default when the module is imported (a section built in code takes the same values as a
config), and refuses a default written in this file; tests/unit/test_settings.py fails when a key or a
field of the two is missing from the other.

Each field also declares, beside its default, which jobs it reruns (`setting`): `reruns` names the jobs
that record it as a param (a rerun trigger), `later` marks a key recorded only while set (added after
jobs were recorded without it, which keep their outputs), and a key a job does not record reaches it at
run time only (`runtime_only`). The rules' params derive from these declarations (`rerun_params`,
`runtime_params`); tests/workflow/test_planned_jobs_settings_roles.py compares them with the planned jobs.

The package sees only these objects: the rules read `SETTINGS` and pass plain params and run-time values;
each script turns them back into its whole sections (`whole`, `RuntimeOnly.whole`), or into a narrow
section holding exactly the keys its rule records (`TraceFilters`, `Lengths`, `Batching`, `QuestionOrder`),
and hands those to one package call, whose functions take `*Settings`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def setting(*, reruns: str | tuple[str, ...] = (), later: bool = False) -> Any:
    """A field's rerun role (its default is the schema's: `schema_defaults`).

    reruns: the jobs (rule names; "preflight" for both preflight rules) that record the key as a param:
        changing it reruns them. Any other job receiving the section gets the key at run time only.
    later: recorded only while set (not its default; null and "" alike): a key added after jobs were
        recorded without it, so that upgrading the pipeline reruns none of them.
    A key no job records is run-time only, or read when the workflow is planned (which jobs exist).
    """
    roles = {"reruns": (reruns,) if isinstance(reruns, str) else tuple(reruns), "later": later}
    return field(metadata=roles)


SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


@functools.cache
def _schema() -> dict[str, Any]:
    return yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _schema_node(path: str) -> dict[str, Any]:
    """The schema of section `path` ("" the whole config, "server.ssh", "server.replicas[]" an item)."""
    node = _schema()
    for part in filter(None, path.split(".")):
        node = node["properties"][part.removesuffix("[]")]
        node = node["items"] if part.endswith("[]") else node
    return node


def schema_defaults(path: str) -> Any:
    """Class decorator, under @dataclass: each field of the class's own annotations takes the default
    of key `path`.NAME in config/schema.yaml (a list as a tuple, a mapping or a section built afresh per
    instance); a key without one is required. A default written in the class is refused: it would be a
    second copy of the schema's."""

    def fill(cls: type[T]) -> type[T]:
        hints = typing.get_type_hints(cls)
        properties = _schema_node(path)["properties"]
        for name in cls.__dict__.get("__annotations__", {}):
            declared = cls.__dict__.get(name, field())
            if not isinstance(declared, dataclasses.Field) or declared.default is not MISSING:
                raise TypeError(f"{cls.__name__}.{name}: its default belongs in config/schema.yaml only")
            if name not in properties:
                raise TypeError(f"{cls.__name__}.{name}: no key {path}.{name} in config/schema.yaml")
            if "default" in properties[name]:
                _give_default(declared, hints[name], properties[name]["default"])
            setattr(cls, name, declared)
        return cls

    return fill


def _give_default(declared: dataclasses.Field, hint: Any, default: Any) -> None:
    if dataclasses.is_dataclass(hint):
        declared.default_factory = lambda: section(hint, default)  # type: ignore[misc]
    elif isinstance(default, dict):
        declared.default_factory = functools.partial(copy.deepcopy, default)  # type: ignore[misc]
    elif isinstance(default, list):
        declared.default = tuple(default)
    else:
        declared.default = default


@dataclass(frozen=True)
@schema_defaults("demo")
class DemoSettings:
    enabled: bool
    # llama: the tiny Llama target; kimi: the Kimi-K2.5 family in miniature (the Llama demo's target
    # was built before kimi existed: recorded only when not llama)
    family: str = setting(reruns="build_demo_target", later=True)
    port: int = setting(reruns="build_demo_target")
    fit_seconds: float = setting(reruns="build_demo_target")
    seed: int = setting(reruns="build_demo_target")


@dataclass(frozen=True)
@schema_defaults("server.ssh")
class SshSettings:
    known_hosts: str
    known_hosts_file: str
    connect_timeout_s: float
    command_timeout_s: float
    keepalive_s: int
    sudo: bool


@dataclass(frozen=True)
@schema_defaults("server.replicas[]")
class ReplicaSettings:
    """One of server.replicas: where it is; a null key takes the primary's value."""

    name: str  # required
    host: str | None
    unit: str | None
    unit_file: str | None
    base_url: str | None
    tunnel: bool | None
    max_shard_jobs: int | None


@dataclass(frozen=True)
@schema_defaults("server")
class ServerSettings:
    host: str = setting(reruns="snapshot_server")
    unit: str = setting(reruns="snapshot_server")
    unit_file: str | None = setting(reruns="snapshot_server")
    manage: bool = setting(reruns="stop_server")
    stop_after_generation: bool = setting(reruns="stop_server")
    stop_foreign: bool = setting(reruns="stop_server")
    stop_timeout_s: float
    host_state_dir: str
    check_lease_s: float
    base_url: str | None = setting(reruns="snapshot_server")
    api_key_env: str
    api_key_file: str | None
    start_timeout_s: float
    ca_bundle: str | None
    tunnel: bool
    name: str
    max_shard_jobs: int | None
    replicas: tuple[ReplicaSettings, ...]
    ssh: SshSettings

    @property
    def local_unit_file(self) -> str | None:
        """unit_file when it is on this machine (host: local): the snapshot reads the unit there, not
        through `systemctl cat`, and where there is no systemd the pipeline runs its ExecStart itself."""
        return self.unit_file if self.host == "local" else None


@dataclass(frozen=True)
@schema_defaults("dataset")
class DatasetSettings:
    path: str = setting(reruns="prepare_prompts")  # required: no default
    num_samples: int
    shard_size: int
    seed: int = setting(reruns="prepare_prompts")
    turns: str = setting(reruns="prepare_prompts")


# the jobs whose requests generation.*'s sampling shapes
SAMPLING = ("preflight", "generate_shard", "serve_check")


@dataclass(frozen=True)
@schema_defaults("generation")
class GenerationSettings:
    # the recorded keys in config/config.yaml's order (seed after top_p): Snakemake compares a param by
    # its repr, and the first runs recorded the section as that file wrote it
    max_tokens: int = setting(reruns=SAMPLING)
    temperature: float | None = setting(reruns=SAMPLING)
    top_p: float | None = setting(reruns=SAMPLING)
    seed: int | None = setting(reruns=SAMPLING)
    top_k: int | None = setting(reruns=SAMPLING, later=True)
    min_p: float | None = setting(reruns=SAMPLING, later=True)
    presence_penalty: float | None = setting(reruns=SAMPLING, later=True)
    frequency_penalty: float | None = setting(reruns=SAMPLING, later=True)
    repetition_penalty: float | None = setting(reruns=SAMPLING, later=True)
    extra_body: Mapping[str, Any] = setting(reruns=SAMPLING, later=True)
    # pacing: run-time only, but the serve check's tokens/s depend on its concurrency
    concurrency: int = setting(reruns="serve_check")
    global_concurrency: int
    chat_template_kwargs: Mapping[str, Any] = setting(reruns=SAMPLING)
    retries: int
    request_timeout_s: float
    history: str = setting(reruns=("prepare_prompts", "generate_shard"), later=True)


@dataclass(frozen=True)
@schema_defaults("traces")
class TraceFilters:
    """traces.*: which rows are kept and on which side of the split they land; what filter_traces
    records and receives (a narrow section: the rest of traces.* is the merge's)."""

    drop_truncated: bool = setting(reruns=("filter_traces", "merge_traces"))
    drop_empty: bool = setting(reruns=("filter_traces", "merge_traces"))
    drop_duplicates: bool = setting(reruns=("filter_traces", "merge_traces"))
    validation_fraction: float = setting(reruns=("filter_traces", "merge_traces"))


@dataclass(frozen=True)
@schema_defaults("traces")
class TracesSettings(TraceFilters):
    # a threshold the merge checks, not a property of its outputs: raising it after a refused merge
    # reruns no shard's filter (and so no extraction downstream)
    max_failed_fraction: float


@dataclass(frozen=True)
@schema_defaults("target")
class TargetSettings:
    model: str  # required: no default
    hidden_size: int | None
    hub_id: str | None = setting(reruns="export_draft", later=True)


@dataclass(frozen=True)
@schema_defaults("hidden_states.vllm")
class VllmEngineSettings:
    python: str | None
    tensor_parallel_size: int | None = setting(reruns="extract_hidden_states")
    dtype: str | None = setting(reruns="extract_hidden_states")
    quantization: str | None = setting(reruns="extract_hidden_states")
    max_model_len: int | None
    trust_remote_code: bool | None = setting(reruns="extract_hidden_states")
    enforce_eager: bool | None
    gpu_memory_utilization: float | None
    enable_expert_parallel: bool | None = setting(reruns="extract_hidden_states")
    max_num_batched_tokens: int | None
    cuda_graphs: bool
    connector: str
    staging_dir: str | None
    max_in_flight_tokens: int | None
    max_clients: int
    idle_timeout_s: float
    allow_untested_version: bool
    # what an engine scope's time limit on a cluster is planned at (hidden_states/allocation.py)
    expected_tokens_per_s: float
    expected_start_s: float


@dataclass(frozen=True)
@schema_defaults("hidden_states")
class HiddenStatesSettings:
    backend: str = setting(reruns="extract_hidden_states")
    vllm: VllmEngineSettings
    layers: str | tuple[int, ...] = setting(reruns="extract_hidden_states")
    max_seq_len: int = setting(reruns=("extract_hidden_states", "vocab_map", "plan_windows"))
    overlong: str = setting(reruns=("extract_hidden_states", "vocab_map", "plan_windows"))
    dtype: str = setting(reruns="extract_hidden_states")
    batch_tokens: int = setting(reruns="extract_hidden_states")
    compute_dtype: str = setting(reruns="extract_hidden_states")
    device_map: bool
    trust_remote_code: bool = setting(reruns="extract_hidden_states")
    max_disk_gb: float | None
    pack_slots: int  # shards packing at once (hidden_states/packing.pack_slot)


@dataclass(frozen=True)
@schema_defaults("draft")
class DraftSettings:
    draft_vocab_size: int = setting(reruns=("train_draft", "vocab_map"))
    ttt_steps: int = setting(reruns="train_draft")
    step_weight_decay: float = setting(reruns="train_draft")
    head_dim: int | None = setting(reruns="train_draft")
    num_attention_heads: int | None = setting(reruns="train_draft")
    num_key_value_heads: int | None = setting(reruns="train_draft")
    norm_before_fc: bool = setting(reruns="train_draft", later=True)
    fc_norm: bool = setting(reruns="train_draft", later=True)
    norm_output: bool = setting(reruns="train_draft", later=True)
    # auto, llama or deepseek_mla (draft_config.py: auto is MLA for DeepSeek/Kimi)
    architecture: str = setting(reruns="train_draft")
    # a draft folder to start training from (draft/init_from.py)
    init_from: str | None = setting(reruns="train_draft", later=True)


# draft.*: the attention's shape (None: derived from the target) and EAGLE-3.1's norms (false: off),
# what draft_config.draft_config_from_target takes. The norms are recorded (rule params: `later`; the
# resume fingerprint, draft/job.py) only when on: a draft without them keeps the jobs it had before.
DRAFT_ATTENTION_KEYS = ("head_dim", "num_attention_heads", "num_key_value_heads")
DRAFT_NORM_KEYS = ("norm_before_fc", "fc_norm", "norm_output")


@dataclass(frozen=True)
@schema_defaults("train")
class TrainSettings:
    epochs: int = setting(reruns=("train_draft", "plan_windows"))
    lr: float = setting(reruns="train_draft")
    warmup_ratio: float = setting(reruns="train_draft")
    weight_decay: float = setting(reruns="train_draft")
    grad_clip: float = setting(reruns="train_draft")
    batch_tokens: int = setting(reruns=("train_draft", "plan_windows"))
    seed: int = setting(reruns=("train_draft", "plan_windows"))
    # not properties of the weights (how often a resume point is saved, recompute instead of keep,
    # shard instead of replicate: the same numbers): run-time only, changing them reruns nothing
    save_every_steps: int
    activation_checkpointing: bool
    fsdp: bool


@dataclass(frozen=True)
@schema_defaults("validate")
class ValidateSettings:
    serve_check: bool
    num_speculative_tokens: int = setting(reruns="serve_check")
    baseline: bool
    max_questions: int = setting(reruns="serve_check")
    max_tokens: int | None = setting(reruns="serve_check")
    temperature: float | None = setting(reruns="serve_check")
    enforce_eager: bool = setting(reruns="serve_check")
    remote_dir: str | None  # where a remote check runs: run-time only
    served_offline_tolerance: float | None = setting(reruns="serve_check")
    by_k_max: int = setting(reruns="serve_check", later=True)
    speedup: bool = setting(reruns="serve_check")
    speedup_repeats: int
    select_every_epochs: int
    learning_curve: tuple[float, ...]
    context_buckets: tuple[int, ...]


@dataclass(frozen=True)
@schema_defaults("")
class Settings:
    """The whole config, one typed section per schema section."""

    dataset: DatasetSettings
    target: TargetSettings
    run: str
    demo: DemoSettings
    server: ServerSettings
    generation: GenerationSettings
    traces: TracesSettings
    hidden_states: HiddenStatesSettings
    draft: DraftSettings
    train: TrainSettings
    validate: ValidateSettings


def section(cls: type[T], values: Mapping[str, Any] | None) -> T:
    """A typed section from a mapping: nested sections typed too, lists as tuples, mappings copied (the
    section is frozen, a mapping in it is a plain dict); absent keys take the field's default (the
    schema's): for a config, whose defaults check_config filled in. Unknown keys raise TypeError."""
    kwargs: dict[str, Any] = {}
    types = typing.get_type_hints(cls)
    for key, value in (values or {}).items():
        if key not in types:
            raise TypeError(f"{cls.__name__} has no field {key!r} (see config/schema.yaml)")
        item = _item_section(types[key])
        if dataclasses.is_dataclass(types[key]):
            value = section(types[key], value)
        elif item is not None and isinstance(value, list):
            value = tuple(section(item, v) for v in value)  # a list of sections (server.replicas)
        elif isinstance(value, Mapping):
            value = dict(value)  # a copy: the section's fields are never reassigned, nor this mutated
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


def _item_section(hint: Any) -> type | None:
    """X for a `tuple[X, ...]` field whose X is a section, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def build_settings(validated: Mapping[str, Any]) -> Settings:
    """The typed settings of a config document that check_config validated (defaults filled in)."""
    return section(Settings, validated)


def as_params(settings: Any, *keys: str) -> dict[str, Any]:
    """Some fields of a section as plain builtins (dicts, lists), the form Snakemake records as params
    and compares on the next run: a value here is a rerun trigger of the rule that passes it."""
    plain = _plain(settings)
    return {key: plain[key] for key in keys} if keys else plain


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@functools.cache
def rerun_keys(cls: type, job: str) -> tuple[str, ...]:
    """The keys of section `cls` that jobs of rule `job` record as params (declared `reruns`), in field
    order; a nested section (hidden_states.vllm) when the job records any key of its own."""
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if (
            rerun_keys(nested, job)
            if (nested := _nested(cls, f.name))
            else job in f.metadata.get("reruns", ())
        )
    )


@functools.cache
def runtime_keys(cls: type, job: str) -> tuple[str, ...]:
    """The keys of section `cls` that jobs of rule `job` do not record: what reaches them at run time
    only, when they receive the section; a nested section when any key of its own does."""
    return tuple(
        f.name
        for f in dataclasses.fields(cls)
        if (
            runtime_keys(nested, job)
            if (nested := _nested(cls, f.name))
            else f.name not in rerun_keys(cls, job)
        )
    )


def later_values(cls: type) -> dict[str, Any]:
    """The keys of section `cls` recorded only while set (declared `later`), with their unset value."""
    return {f.name: field_default(cls, f.name) for f in dataclasses.fields(cls) if f.metadata.get("later")}


def rerun_params(settings: Any, job: str) -> dict[str, Any]:
    """The rerun triggers of rule `job` in section `settings`: its `rerun_keys` as plain builtins (the
    form Snakemake records, as_params), a `later` key left out while unset (its default; null and ""
    alike)."""
    later = later_values(type(settings))
    params: dict[str, Any] = {}
    for key in rerun_keys(type(settings), job):
        value = getattr(settings, key)
        if dataclasses.is_dataclass(value):
            params[key] = rerun_params(value, job)
        elif key not in later or not _unset(value, later[key]):
            params[key] = _plain(value)
    return params


def runtime_params(settings: Any, job: str) -> dict[str, Any]:
    """The rest of section `settings` for rule `job` (its `runtime_keys`), as plain builtins: what the
    rule passes through runtime_only, so that the job receives the section whole."""
    return {
        key: runtime_params(value, job)
        if dataclasses.is_dataclass(value := getattr(settings, key))
        else _plain(value)
        for key in runtime_keys(type(settings), job)
    }


def _unset(value: Any, default: Any) -> bool:
    return bool(value == default or (default is None and value == ""))


def _nested(cls: type, name: str) -> type | None:
    """The section type of field `name` of `cls` when it is a section of its own, else None."""
    hint = typing.get_type_hints(cls)[name]
    return hint if dataclasses.is_dataclass(hint) else None


def whole(cls: type[T], values: Mapping[str, Any]) -> T:
    """Section `cls` from every one of its keys, as a job received them (recorded, run-time), a `later`
    key left out while unset taking that value. A key given by none raises TypeError: a job never works
    from a section whose missing keys silently took the schema's default instead of the user's value."""
    return section(cls, _complete(cls, values, cls.__name__))


def _complete(cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    complete = {**later_values(cls), **values}
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in complete]
    if missing:
        raise TypeError(f"{where} lacks {missing}: pass the whole section (params and runtime_only)")
    for f in dataclasses.fields(cls):
        if (nested := _nested(cls, f.name)) is not None:
            complete[f.name] = _complete(nested, complete[f.name], f"{where}.{f.name}")
    return complete


# Narrow sections: exactly the keys a rule records of a section (tests/unit/test_settings_roles.py), for
# a job that needs no other; built with `whole`.
@dataclass(frozen=True)
class Lengths:
    """hidden_states.max_seq_len and overlong: how long a stored sequence is (vocab_map, plan_windows)."""

    max_seq_len: int
    overlong: str


@dataclass(frozen=True)
class Batching:
    """train.epochs, batch_tokens and seed: how a draft's epochs are cut into batches (plan_windows)."""

    epochs: int
    batch_tokens: int
    seed: int


@dataclass(frozen=True)
class QuestionOrder:
    """dataset.path, seed and turns: what the questions' order depends on (prepare_prompts)."""

    path: str
    seed: int
    turns: str


@dataclass(frozen=True)
class RuntimeOnly:
    """Values a job reads at run time that do not shape its output (timeouts, pacing, where to connect
    when the server's identity is an input), by config section.

    Passed to a rule as one params entry of this type: Snakemake records (and compares, as a rerun
    trigger) only params of builtin types and skips any other object as unrepresentable
    (snakemake.persistence, `_serialize_param`), so changing these values reruns nothing, yet the
    script still receives them through `snakemake.params`. tests/workflow/test_rerun_triggers.py
    proves both on a recorded run.
    """

    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def section(self, name: str, recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Section `name` whole again: the values recorded as params with these run-time ones added; a
        nested section split between the two (hidden_states.vllm) is merged key by key."""
        whole = dict(recorded or {})
        for key, value in self.sections.get(name, {}).items():
            nested = isinstance(whole.get(key), Mapping) and isinstance(value, Mapping)
            whole[key] = {**whole[key], **value} if nested else value
        return whole

    def whole(self, cls: type[T], name: str, recorded: Mapping[str, Any] | None = None) -> T:
        """Section `name` whole (`cls`): the recorded params with these run-time values added, every key
        given by one of them (see `whole`). What a script hands the package."""
        return whole(cls, self.section(name, recorded))


# train.* that do not shape the weights: run-time only in the rules, left out of the resume fingerprint
TRAIN_RUNTIME_KEYS = runtime_keys(TrainSettings, "train_draft")


@dataclass(frozen=True)
class RuntimeWord:
    """One shell word a job reads at run time, as a param Snakemake does not record (RuntimeOnly's
    reason): `{params.NAME:q}` in a shell command formats it as its text."""

    text: str

    def __str__(self) -> str:
        return self.text


def runtime_only(**sections: Mapping[str, Any]) -> RuntimeOnly:
    """Run-time values by section, e.g. runtime_only(server=as_params(settings.server)): see RuntimeOnly."""
    return RuntimeOnly({name: dict(values) for name, values in sections.items()})


def field_default(cls: type, name: str) -> Any:
    """The default of one field of a section (the schema's), for a section with required fields."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def served_max_tokens(generation: GenerationSettings, validate: ValidateSettings) -> int:
    """max_tokens of the serve check's requests, and of its run replayed offline: generation.max_tokens,
    capped by validate.max_tokens (the one rule both sides take it from)."""
    cap = generation.max_tokens
    return min(cap, validate.max_tokens or cap)
