"""The draft's shape, derived from the target model's config.json.

The draft is one Llama decoder layer as wide as the target (EAGLE-3, SpecForge): the hidden size, MLP
width and norm epsilon are the target's, so that its frozen embeddings and the fc over three auxiliary
states fit without extra projections. The attention's shape (config draft.head_dim,
draft.num_attention_heads, draft.num_key_value_heads) defaults to the target's where the target has a
standard attention with a head size serving engines accept, and otherwise to heads of HEAD_DIM: a
derived hidden/heads can be a size vLLM's attention backends refuse (Kimi-K2.5: 7,168 / 64 = 112;
SpecForge's Kimi-K2.5 draft uses 64 heads of 128).

draft.architecture picks the attention: `llama` (above), or `deepseek_mla`, the target's own multi-head
latent attention (draft/mla.py) with its q/kv LoRA ranks, its nope/rope/value head sizes and its YaRN
rope, served by vLLM as Eagle3DeepseekV3ForCausalLM. `auto` takes MLA for the DeepseekV2/V3 family
(Kimi-K2, Kimi-K2.5: MLA_MODEL_TYPES) and llama otherwise, or when the config asks for a Llama head
(draft.head_dim or draft.num_key_value_heads set, as the Kimi example's 64 heads of 128 do). Which
one a config is, is its `architecture`, read from its MLA fields (kv_lora_rank > 0), so that a config
rebuilt from an exported config.json knows it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eagle3_pipeline.target_shape import MLA_MODEL_TYPES, TargetShape, config_file

NUM_AUX_LAYERS = 3  # EAGLE-3 fuses a low, a middle and a high target layer
HEAD_DIM = 128  # the default head size when the target gives none usable: every vLLM/SGLang backend takes it
# head sizes taken over from a target without asking: FlashAttention, FlashInfer, Triton and vLLM's CPU
# attention all accept these (FlashInfer refuses e.g. 80 or 112; CPU refuses 16)
SERVED_HEAD_DIMS = (64, 128, 256)
ARCHITECTURES = ("auto", "llama", "deepseek_mla")  # config draft.architecture
# vLLM's architecture names of an EAGLE-3 draft with MLA attention
MLA_ARCHITECTURES = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")  # q_lora_rank may be null
VLLM_YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}  # vLLM's


@dataclass(frozen=True)
class DraftConfig:
    """Everything that fixes the draft's tensor shapes and its arithmetic."""

    hidden_size: int  # H: the draft's width, equal to the target's
    target_hidden_size: int  # width of each auxiliary state (fc input is NUM_AUX_LAYERS x this)
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int  # the target vocabulary (embeddings, t2d)
    draft_vocab_size: int  # the draft's lm_head rows
    # EAGLE-3.1's normalisations (speculators' Eagle3SpeculatorConfig names and meanings), all off in
    # EAGLE-3: one RMSNorm over the concatenated auxiliary states before fc, or one per auxiliary state
    # (exclusive), and the final norm's output fed back as the next step's hidden state
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    # MLA (draft.architecture deepseek_mla; all zero for a Llama draft): the target's ranks and head
    # sizes (queries and keys nope + rope wide, values v_head_dim; head_dim is then the rope's size, as
    # in transformers' DeepseekV3Config) and its YaRN rope parameters (None: plain rope)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.norm_before_fc and self.fc_norm:
            raise ValueError(
                "draft.norm_before_fc and draft.fc_norm are exclusive (one norm over the concatenated "
                "auxiliary states, or one per state; vLLM would apply both, speculators refuses both): "
                "set one of them to false"
            )
        if self.architecture == "deepseek_mla" and self.norm_before_fc:
            raise ValueError(
                "draft.norm_before_fc is not served for an MLA draft (vLLM 0.32's deepseek_eagle3.py has no "
                "input_norm): set draft.norm_before_fc: false, or use draft.fc_norm"
            )

    @property
    def architecture(self) -> str:
        """'deepseek_mla' or 'llama' (module docstring)."""
        return "deepseek_mla" if self.kv_lora_rank else "llama"

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head: head_dim, or MLA's nope + rope."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.kv_lora_rank else self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckpointConfig:
    """A draft checkpoint's config.json (EAGLE or speculators format), read in one place
    (read_checkpoint_config) for all that read it: the serve check (the trained auxiliary layers), the
    offline validation (the draft's shape), the demo's head-to-head (its KV cache) and draft.init_from."""

    stated: dict[str, Any]  # the file as written

    @property
    def speculators(self) -> bool:
        return "speculators_config" in self.stated

    @property
    def layer(self) -> dict[str, Any]:
        """The decoder layer's config: speculators keeps it apart (transformer_layer_config)."""
        return dict(self.stated.get("transformer_layer_config") or {}) if self.speculators else self.stated

    @property
    def mla(self) -> bool:
        return any(name in MLA_ARCHITECTURES for name in self.stated.get("architectures") or ())

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """The target layers the draft was trained on, in vLLM's numbering (None: unstated)."""
        return self.stated.get("eagle_aux_hidden_state_layer_ids")

    def draft_config(self) -> DraftConfig:
        """The draft's DraftConfig as an exported (EAGLE format) checkpoint states it; target_hidden_size
        defaults to hidden_size, as the readers take it."""
        stated = self.stated
        known = {k: stated[k] for k in DraftConfig.__dataclass_fields__ if k in stated}
        return DraftConfig(
            **known | {"target_hidden_size": stated.get("target_hidden_size", stated["hidden_size"])}
        )


def read_checkpoint_config(folder: str | Path) -> CheckpointConfig:
    """The config.json of the draft checkpoint in `folder`."""
    return CheckpointConfig(json.loads((Path(folder).expanduser() / "config.json").read_text()))


def read_target_config(path: str | Path) -> dict[str, Any]:
    """The language model's section of the target's config.json (a model directory or the file itself):
    TargetShape.draft_fields (a VL wrapper's text_config, since the draft only sees the language model)."""
    file = config_file(path)
    if not file.exists():
        raise FileNotFoundError(
            f"target config {file} does not exist; set target.model to the weights folder"
        )
    return TargetShape.load(file).draft_fields()


def rope_theta_of(model_config: dict[str, Any]) -> float:
    """rope_theta, from transformers 4 (top level) or 5 (rope_parameters) configs."""
    if "rope_theta" in model_config:
        return float(model_config["rope_theta"])
    return float((model_config.get("rope_parameters") or {}).get("rope_theta", 10000.0))


def attention_shape(
    target: dict[str, Any],
    head_dim: int | None = None,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
) -> tuple[int, int, int]:
    """(head_dim, heads, kv heads) of the draft: the settings given, else the defaults (module docstring).

    head_dim: the target's `head_dim`, or its hidden/heads when that is one of SERVED_HEAD_DIMS, else
    HEAD_DIM (a target with multi-head latent attention, kv_lora_rank, has no Llama head size to take).
    Heads: the target's when the head size is the target's, else hidden/head_dim. KV heads: the target's
    when the heads are, else as many as the heads.

    Raises:
        ValueError: naming the draft.* key to set when the defaults do not fit the target.
    """
    hidden, target_heads = int(target["hidden_size"]), int(target["num_attention_heads"])
    latent = "kv_lora_rank" in target  # MLA: its head sizes are not a Llama draft's
    derived = hidden // target_heads if hidden % target_heads == 0 else None
    own = None if latent else target.get("head_dim") or (derived if derived in SERVED_HEAD_DIMS else None)
    head_dim = int(head_dim or own or HEAD_DIM)
    if num_attention_heads is None:
        if own is not None and int(own) == head_dim:
            num_attention_heads = target_heads
        elif hidden % head_dim == 0:
            num_attention_heads = hidden // head_dim
        else:
            raise ValueError(
                f"the target's hidden_size {hidden} is not a multiple of the draft's head_dim {head_dim}: "
                "set draft.num_attention_heads (and draft.head_dim) in the config"
            )
    if num_key_value_heads is None:
        same = not latent and num_attention_heads == target_heads
        target_kv = int(target.get("num_key_value_heads") or target_heads)
        num_key_value_heads = target_kv if same else num_attention_heads
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"draft.num_attention_heads ({num_attention_heads}) is not a multiple of "
            f"draft.num_key_value_heads ({num_key_value_heads}): set draft.num_key_value_heads"
        )
    return head_dim, int(num_attention_heads), int(num_key_value_heads)


def draft_config_from_target(
    target: dict[str, Any],
    draft_vocab_size: int,
    head_dim: int | None = None,
    num_attention_heads: int | None = None,
    num_key_value_heads: int | None = None,
    norm_before_fc: bool | None = None,
    fc_norm: bool | None = None,
    norm_output: bool | None = None,
    architecture: str = "auto",
) -> DraftConfig:
    """The draft's shape for `target` (a parsed config.json); draft_vocab_size is capped at the target's.

    head_dim and the heads are config draft.* (None: see attention_shape); so are the EAGLE-3.1 norms
    (None: off) and the architecture (module docstring). A Llama draft uses plain RoPE with the target's
    theta (trained and served alike; a target's own rope scaling is not carried over); an MLA draft takes
    the target's rope scaling too, as vLLM's MLA attention applies it (deepseek_yarn).
    """
    hidden = int(target["hidden_size"])
    llama_head = head_dim is not None or num_key_value_heads is not None
    if resolve_architecture(target, architecture, llama_head) == "deepseek_mla":
        heads = mla_heads(target, head_dim, num_attention_heads, num_key_value_heads)
        mla = mla_fields(target)
        head_dim, kv_heads = mla["qk_rope_head_dim"], heads
    else:
        head_dim, heads, kv_heads = attention_shape(
            target, head_dim, num_attention_heads, num_key_value_heads
        )
        mla = {}
    return DraftConfig(
        hidden_size=hidden,
        target_hidden_size=hidden,
        intermediate_size=int(target.get("intermediate_size") or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(target),
        max_position_embeddings=int(target.get("max_position_embeddings", 8192)),
        vocab_size=int(target["vocab_size"]),
        draft_vocab_size=min(int(draft_vocab_size), int(target["vocab_size"])),
        norm_before_fc=bool(norm_before_fc),
        fc_norm=bool(fc_norm),
        norm_output=bool(norm_output),
        **mla,
    )


def resolve_architecture(target: dict[str, Any], architecture: str = "auto", llama_head: bool = False) -> str:
    """'llama' or 'deepseek_mla' for config draft.architecture (`auto`: by the target's model_type, llama
    whatever the target when `llama_head`, a Llama head size or kv heads set in the config).

    Raises:
        ValueError: an unknown architecture, or MLA for a target without MLA dimensions.
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"draft.architecture {architecture!r} is not one of {list(ARCHITECTURES)}")
    if architecture == "auto":
        mla = target.get("model_type") in MLA_MODEL_TYPES and not llama_head
        architecture = "deepseek_mla" if mla else "llama"
    if architecture == "deepseek_mla":
        missing = [key for key in MLA_KEYS if not target.get(key)]
        if missing:
            raise ValueError(
                f"draft.architecture deepseek_mla (or auto on a {target.get('model_type')!r} target) takes "
                f"the target's multi-head latent attention, and the target config has no {missing}: set "
                "draft.architecture: llama"
            )
    return architecture


def mla_heads(
    target: dict[str, Any],
    head_dim: int | None,
    num_attention_heads: int | None,
    num_key_value_heads: int | None,
) -> int:
    """Query heads of an MLA draft: draft.num_attention_heads, else the target's. MLA has one latent
    key/value per token and head sizes fixed by the target, so head_dim and num_key_value_heads cannot
    be chosen (the values an exported config carries, the rope size and the heads, are accepted).

    Raises:
        ValueError: draft.head_dim or draft.num_key_value_heads set to another value.
    """
    heads = int(num_attention_heads or target["num_attention_heads"])
    rope = int(target["qk_rope_head_dim"])
    if head_dim not in (None, rope) or num_key_value_heads not in (None, heads):
        raise ValueError(
            "an MLA draft (draft.architecture deepseek_mla, or auto on a DeepseekV2/V3/Kimi target) takes "
            "its "
            "head sizes from the target's qk_nope_head_dim, qk_rope_head_dim and v_head_dim: leave "
            "draft.head_dim and draft.num_key_value_heads null (or set draft.architecture: llama)"
        )
    return heads


def mla_fields(target: dict[str, Any]) -> dict[str, Any]:
    """DraftConfig's MLA fields from the target's config (DeepseekV2/V3 names)."""
    q_lora = target.get("q_lora_rank")
    return {
        "q_lora_rank": int(q_lora) if q_lora else None,
        **{key: int(target[key]) for key in MLA_KEYS},
        "rope_scaling": yarn_parameters(target),
    }


def yarn_parameters(target: dict[str, Any]) -> dict[str, Any] | None:
    """The target's rope scaling as vLLM's MLA attention applies it (deepseek_yarn), every parameter
    explicit; None for plain rope. transformers 4 (`rope_scaling`, `type`) and 5 (`rope_parameters`,
    `rope_type`) spellings are read.

    Raises:
        ValueError: a scaling other than YaRN, which the MLA draft does not implement.
    """
    params = target.get("rope_scaling") or target.get("rope_parameters") or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return None
    if kind not in ("yarn", "deepseek_yarn") or params.get("attention_factor") == 1.0:
        raise ValueError(
            f"the target's rope scaling {params} is not YaRN (deepseek_yarn in vLLM), the only one the MLA "
            "draft implements: set draft.architecture: llama (plain rope)"
        )
    original = params.get("original_max_position_embeddings") or target.get("max_position_embeddings", 8192)
    yarn = {
        "rope_type": "yarn",
        "factor": float(params["factor"]),
        "original_max_position_embeddings": int(original),
    }
    return yarn | {
        key: float(default if params.get(key) is None else params[key]) for key, default in VLLM_YARN.items()
    }
