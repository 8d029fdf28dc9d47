"""The validated config as typed, frozen sections: one dataclass per section of config/schema.yaml.

Built once, by `build_settings`, from the config `check_config` validated (its defaults filled in from
the schema). Each field's default equals the schema's, and tests/unit/test_settings.py fails when a key,
a field or a default drifts: the schema stays the one place a default is written.

The package sees only these objects: the rules read `SETTINGS` and pass plain params (rerun triggers:
`as_params`) and run-time values (`runtime_only`); each script turns them back into its sections
(`section`, `RuntimeOnly.typed`) and hands those to one package call, whose functions take `*Settings`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def _empty() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class DemoSettings:
    enabled: bool = False
    family: str = "llama"  # llama: the tiny Llama target; kimi: the Kimi-K2.5 family in miniature
    port: int = 18431
    fit_seconds: float = 240
    seed: int = 0


@dataclass(frozen=True)
class SshSettings:
    known_hosts: str = "strict"
    known_hosts_file: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 10
    command_timeout_s: float = 60
    keepalive_s: int = 15
    sudo: bool = True


@dataclass(frozen=True)
class ReplicaSettings:
    """One of server.replicas: where it is; a null key takes the primary's value."""

    name: str  # required: no default
    host: str | None = None
    unit: str | None = None
    unit_file: str | None = None
    base_url: str | None = None
    tunnel: bool | None = None
    max_shard_jobs: int | None = None


@dataclass(frozen=True)
class ServerSettings:
    host: str = "local"
    unit: str = "vllm.service"
    unit_file: str | None = None
    manage: bool = True
    stop_after_generation: bool = True
    stop_foreign: bool = False
    stop_timeout_s: float = 600
    host_state_dir: str = "/run/eagle3-pipeline"
    base_url: str | None = None
    api_key_env: str = "VLLM_API_KEY"
    api_key_file: str | None = None
    start_timeout_s: float = 1800
    ca_bundle: str | None = None
    tunnel: bool = False
    name: str = "main"
    max_shard_jobs: int | None = None
    replicas: tuple[ReplicaSettings, ...] = ()
    ssh: SshSettings = field(default_factory=SshSettings)

    @property
    def local_unit_file(self) -> str | None:
        """unit_file when it is on this machine (host: local): the snapshot reads the unit there, not
        through `systemctl cat`, and where there is no systemd the pipeline runs its ExecStart itself."""
        return self.unit_file if self.host == "local" else None


@dataclass(frozen=True)
class DatasetSettings:
    path: str  # required: no default
    num_samples: int = 256
    shard_size: int = 64
    seed: int = 0
    turns: str = "first"


@dataclass(frozen=True)
class GenerationSettings:
    max_tokens: int = 8192
    temperature: float | None = 0.6
    top_p: float | None = 0.95
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    extra_body: Mapping[str, Any] = field(default_factory=_empty)
    seed: int | None = 0
    concurrency: int = 64
    global_concurrency: int = 64
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=_empty)
    retries: int = 5
    request_timeout_s: float = 1800
    history: str = "none"


@dataclass(frozen=True)
class TracesSettings:
    drop_truncated: bool = False
    drop_empty: bool = True
    drop_duplicates: bool = True
    validation_fraction: float = 0.05
    max_failed_fraction: float = 0.01


@dataclass(frozen=True)
class TargetSettings:
    model: str  # required: no default
    hidden_size: int | None = None


@dataclass(frozen=True)
class VllmEngineSettings:
    python: str | None = None
    tensor_parallel_size: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    max_model_len: int | None = None
    trust_remote_code: bool | None = None
    enforce_eager: bool | None = None
    gpu_memory_utilization: float | None = None
    enable_expert_parallel: bool | None = None
    max_num_batched_tokens: int | None = None
    cuda_graphs: bool = False
    connector: str = "auto"
    staging_dir: str | None = None
    max_in_flight_tokens: int | None = None
    max_clients: int = 2
    idle_timeout_s: float = 900
    allow_untested_version: bool = False


@dataclass(frozen=True)
class HiddenStatesSettings:
    backend: str = "vllm"
    vllm: VllmEngineSettings = field(default_factory=VllmEngineSettings)
    layers: str | tuple[int, ...] = "auto"
    max_seq_len: int = 16384
    overlong: str = "truncate"
    dtype: str = "bfloat16"
    batch_tokens: int = 16384
    compute_dtype: str = "auto"
    device_map: bool = False
    trust_remote_code: bool = False
    max_disk_gb: float | None = None
    pack_slots: int = 4  # shards packing at once (hidden_states/packing.pack_slot)


@dataclass(frozen=True)
class DraftSettings:
    draft_vocab_size: int = 32000
    ttt_steps: int = 7
    step_weight_decay: float = 0.8
    head_dim: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    architecture: str = "auto"  # auto, llama or deepseek_mla (draft/config.py: auto is MLA for DeepSeek/Kimi)
    init_from: str | None = None  # a draft folder to start training from (draft/init_from.py)


# draft.*: the attention's shape (None: derived from the target) and EAGLE-3.1's norms (false: off),
# what draft.config.draft_config_from_target takes. The norms are recorded (rule params, the resume
# fingerprint) only when on: a draft without them keeps the jobs it had before they existed.
DRAFT_ATTENTION_KEYS = ("head_dim", "num_attention_heads", "num_key_value_heads")
DRAFT_NORM_KEYS = ("norm_before_fc", "fc_norm", "norm_output")


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 10
    lr: float = 1.0e-4
    warmup_ratio: float = 0.02
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    batch_tokens: int = 16384
    seed: int = 0
    save_every_steps: int = 500
    activation_checkpointing: bool = False
    fsdp: bool = False


# train.* that do not shape the weights (how often a resume point is saved, recompute instead of keep,
# shard instead of replicate): run-time only in the rules, left out of the resume fingerprint
TRAIN_RUNTIME_KEYS = ("save_every_steps", "activation_checkpointing", "fsdp")


@dataclass(frozen=True)
class ValidateSettings:
    serve_check: bool = True
    num_speculative_tokens: int = 3
    baseline: bool = True
    max_questions: int = 64
    max_tokens: int | None = None
    temperature: float | None = 0.0
    enforce_eager: bool = True
    remote_dir: str | None = None
    served_offline_tolerance: float | None = 0.02
    by_k_max: int = 0
    speedup: bool = True
    speedup_repeats: int = 3
    select_every_epochs: int = 1
    learning_curve: tuple[float, ...] = ()
    context_buckets: tuple[int, ...] = (512, 2048, 8192)


@dataclass(frozen=True)
class Settings:
    """The whole config, one typed section per schema section."""

    dataset: DatasetSettings
    target: TargetSettings
    run: str = "demo"
    demo: DemoSettings = field(default_factory=DemoSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    traces: TracesSettings = field(default_factory=TracesSettings)
    hidden_states: HiddenStatesSettings = field(default_factory=HiddenStatesSettings)
    draft: DraftSettings = field(default_factory=DraftSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    validate: ValidateSettings = field(default_factory=ValidateSettings)


def section(cls: type[T], values: Mapping[str, Any] | None) -> T:
    """A typed section from a mapping: nested sections typed too, lists as tuples, mappings frozen;
    absent keys take the field's default (the schema's). Unknown keys raise TypeError."""
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
            value = dict(value)  # a copy (a section's fields are not reassigned; mappings not frozen)
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

    def typed(self, cls: type[T], name: str, recorded: Mapping[str, Any] | None = None) -> T:
        """Section `name` as its typed settings (`cls`): the recorded params with these run-time values
        added, a key given by neither taking the schema's default. What a script hands the package."""
        return section(cls, self.section(name, recorded))


def runtime_only(**sections: Mapping[str, Any]) -> RuntimeOnly:
    """Run-time values by section, e.g. runtime_only(server=as_params(settings.server)): see RuntimeOnly."""
    return RuntimeOnly({name: dict(values) for name, values in sections.items()})


def field_default(cls: type, name: str) -> Any:
    """The default of one field of a section (the schema's), for a section with required fields."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def served_max_tokens(settings: Settings) -> int:
    """max_tokens of the serve check's requests, and of its run replayed offline: generation.max_tokens,
    capped by validate.max_tokens."""
    cap = settings.generation.max_tokens
    return min(cap, settings.validate.max_tokens or cap)
