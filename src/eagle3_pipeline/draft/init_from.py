"""`draft.init_from`: start training from an existing EAGLE-3 draft instead of a seeded init.

The starting draft is a folder in either format the export writes (draft/export.py), which is also how
public drafts ship:

    EAGLE/SpecForge  config.json (LlamaForCausalLMEagle3: hidden/intermediate/heads/head_dim/vocab_size
                     top level) + model.safetensors (or pytorch_model.bin, as EAGLE's own releases do):
                     fc, midlayer.*, norm, lm_head, d2t/t2d
    speculators      config.json with speculators_config and the layer in transformer_layer_config;
                     the same tensors with midlayer. named layers.0.

Its tensors are mapped back to the draft's own names and checked against the draft this run's config
builds (draft_config.draft_config_from_target): a draft of another target (hidden size, target vocabulary,
the fc's auxiliary-state count, the auxiliary layers it was trained on) or of another shape (heads,
head_dim, the EAGLE-3.1 norms) is refused with an error naming both values and the key to set.

The vocabulary map is this run's (draft/vocab.py: the run's own most frequent tokens), so a starting
draft whose d2t differs is REMAPPED, not refused: lm_head's rows are independent per token, so each row
of a token both maps hold is carried over exactly (found by target token id), and a token only this run
picked keeps the seeded init's row; the log says how many of each. Refusing would force the run to keep
the public draft's vocabulary, picked on someone else's data, which is what training on the target's own
traces is meant to improve. Everything else (fc, the layer, norm) is loaded as is.

The embeddings are the target's (frozen, not exported): a starting draft's `embed_tokens.weight`, or
speculators' `verifier_lm_head.weight`, is checked for shape and dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.draft.export import aux_layers_from_metadata, checkpoint_config
from eagle3_pipeline.draft.init_files import WEIGHT_FILES, weights_file
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.vocab import draft_ids as map_draft_ids
from eagle3_pipeline.draft_config import (
    NUM_AUX_LAYERS,
    DraftConfig,
    read_checkpoint_config,
    rope_theta_of,
)
from eagle3_pipeline.settings import DRAFT_NORM_KEYS
from eagle3_pipeline.target_shape import sglang_layer_ids

log = logging.getLogger(__name__)

DROPPED = ("embed_tokens.weight", "verifier_lm_head.weight")  # the target's, frozen here: not loaded
# the shape a config.json states, and the key that sets it in this pipeline (None: the target's, fixed)
SHAPE_KEYS: dict[str, str | None] = {
    "hidden_size": None,
    "target_hidden_size": None,
    "vocab_size": None,
    "intermediate_size": None,
    "num_attention_heads": "draft.num_attention_heads",
    "num_key_value_heads": "draft.num_key_value_heads",
    "head_dim": "draft.head_dim",
    "norm_before_fc": "draft.norm_before_fc",
    "fc_norm": "draft.fc_norm",
    "norm_output": "draft.norm_output",
    # an MLA draft's (draft.architecture deepseek_mla): the target's ranks and head sizes
    "q_lora_rank": None,
    "kv_lora_rank": None,
    "qk_nope_head_dim": None,
    "qk_rope_head_dim": None,
    "v_head_dim": None,
}


@dataclass
class StartingDraft:
    """A starting draft read from its folder, under the draft's own tensor names.

    Attributes:
        path: the folder.
        format: "eagle" or "speculators".
        architecture: "llama" or "deepseek_mla" (draft.architecture's names).
        shape: the SHAPE_KEYS values its config states (a key it leaves out is absent).
        tensors: trained tensors, checkpoint names (midlayer.*), lm_head included, no d2t/t2d.
        token_ids: the target token id of each lm_head row [Vd] (arange(Vd) + d2t; arange without d2t).
        aux_layers_vllm: the auxiliary layers it was trained on, vLLM's numbering (None: not stated).
        rope_theta: its RoPE theta (10,000 when its config states none, as its readers take it).
    """

    path: Path
    format: str
    architecture: str
    shape: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    token_ids: torch.Tensor
    aux_layers_vllm: list[int] | None
    rope_theta: float


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    if not file.exists():
        raise FileNotFoundError(
            f"draft.init_from: {file.parent} has none of {list(WEIGHT_FILES)}; point draft.init_from at a "
            "draft's folder (config.json and its weights)"
        )
    if file.suffix == ".bin":
        return dict(torch.load(file, map_location="cpu", weights_only=True))
    with safe_open(str(file), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def _shape(layer: dict[str, Any], top: dict[str, Any], mla: bool) -> dict[str, Any]:
    """SHAPE_KEYS as the config states them, with the readers' defaults (head_dim hidden/heads, kv heads
    the heads, target_hidden_size the hidden size, the norms off). An MLA draft's head sizes are its MLA
    keys: head_dim and kv heads, which its readers do not take from a Llama head, are not compared."""
    shape = {k: layer[k] for k in SHAPE_KEYS if k in layer}
    shape |= {k: top[k] for k in ("target_hidden_size", *DRAFT_NORM_KEYS) if k in top}
    if mla:
        shape = {k: v for k, v in shape.items() if k not in ("head_dim", "num_key_value_heads")}
    if "hidden_size" in shape:
        shape.setdefault("target_hidden_size", shape["hidden_size"])
        if "num_attention_heads" in shape and not mla:
            shape.setdefault("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
            shape.setdefault("num_key_value_heads", shape["num_attention_heads"])
    return shape | {k: bool(shape.get(k, False)) for k in DRAFT_NORM_KEYS}


def _aux_layers(top: dict[str, Any]) -> list[int] | None:
    """The auxiliary layers in vLLM's numbering: the top-level key (vLLM's, which the export and
    speculators write), else eagle_config's (SGLang's "output of layer i": vLLM's minus one)."""
    if top.get("eagle_aux_hidden_state_layer_ids"):
        return [int(i) for i in top["eagle_aux_hidden_state_layer_ids"]]
    nested = (top.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return [int(i) + 1 for i in nested] if nested else None


def _token_ids(path: Path, tensors: dict[str, torch.Tensor], vocab_size: int | None) -> torch.Tensor:
    """Each lm_head row's target token id, from d2t (checked against t2d when both are there)."""
    rows = tensors["lm_head.weight"].shape[0]
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    if d2t is None:
        if vocab_size is not None and rows != vocab_size:
            raise ValueError(
                f"draft.init_from: {path} has {rows} lm_head rows, not the whole vocabulary ({vocab_size}), "
                "and no d2t to say which tokens they are"
            )
        return torch.arange(rows, dtype=torch.int64)
    ids = map_draft_ids(d2t.to(torch.int64))
    if len(ids) != rows or (t2d is not None and (int(t2d.sum()) != rows or not bool(t2d.bool()[ids].all()))):
        raise ValueError(f"draft.init_from: {path}'s d2t, t2d and lm_head ({rows} rows) disagree")
    return ids


def read_starting_draft(path: str | Path) -> StartingDraft:
    """The draft at `path` (module docstring), tensors renamed to the draft's own names.

    Raises:
        FileNotFoundError: no config.json or no weights in the folder.
        ValueError: no lm_head, or d2t/t2d that do not match it.
    """
    folder = Path(path).expanduser()
    if not (folder / "config.json").exists():
        raise FileNotFoundError(
            f"draft.init_from: {folder / 'config.json'} does not exist; point draft.init_from at an EAGLE-3 "
            "draft's folder (EAGLE or speculators format)"
        )
    config = read_checkpoint_config(folder)
    kind, layer, top = "speculators" if config.speculators else "eagle", config.layer, config.stated
    # speculators (and vLLM's loader) name the layer layers.0.; the draft and the EAGLE format midlayer.
    tensors = {
        name.replace("layers.0.", "midlayer.", 1) if name.startswith("layers.0.") else name: t
        for name, t in _read_tensors(weights_file(folder)).items()
    }
    if "lm_head.weight" not in tensors:
        raise ValueError(f"draft.init_from: {folder} has no lm_head.weight; is it an EAGLE-3 draft?")
    mla = config.mla
    shape = _shape(layer, top, mla)
    ids = _token_ids(folder, tensors, shape.get("vocab_size"))
    theta = rope_theta_of(layer)  # unstated: 10,000, as transformers' LlamaConfig (and so vLLM) reads it
    architecture = "deepseek_mla" if mla else "llama"
    return StartingDraft(folder, kind, architecture, shape, tensors, ids, _aux_layers(top), theta)


def _shape_errors(start: StartingDraft, config: DraftConfig) -> list[str]:
    """What in the starting draft's stated shape differs from this run's draft, with the key to set."""
    theirs, ours = start.architecture, getattr(config, "architecture", "llama")
    if theirs != ours:  # the other checks would only restate it
        return [f"a {theirs} draft, this run's is {ours}: set draft.architecture: {theirs}"]
    errors = []
    for key, setting in SHAPE_KEYS.items():
        if key not in start.shape or not hasattr(config, key):
            continue
        theirs, ours = start.shape[key], getattr(config, key)
        if theirs == ours:
            continue
        if setting is None:
            errors.append(
                f"{key} {theirs} (starting draft) != {ours} (this run's draft, from target.model): a draft "
                "of another target; set target.model to the target the draft was trained for, or "
                "draft.init_from to a draft of this target"
            )
        else:
            errors.append(
                f"{key} {theirs} (starting draft) != {ours} (this run's draft): set {setting}: {theirs}"
            )
    return errors


def _aux_errors(start: StartingDraft, config: DraftConfig, aux_layers_vllm: list[int] | None) -> list[str]:
    """The fc's auxiliary-state count (from its width) and the layers the draft was trained on."""
    errors = []
    fc = start.tensors.get("fc.weight")
    width = config.target_hidden_size
    if fc is not None and fc.shape[-1] != NUM_AUX_LAYERS * width:
        count = f"{fc.shape[-1] / width:g}"
        errors.append(
            f"fc reads {fc.shape[-1]} features ({count} auxiliary states of {width}), this run's draft "
            f"{NUM_AUX_LAYERS * width} ({NUM_AUX_LAYERS} states): a draft of another target or another "
            "EAGLE version; set draft.init_from to an EAGLE-3 draft of target.model"
        )
    stated, ours = start.aux_layers_vllm, aux_layers_vllm
    if stated is not None and ours is not None and list(stated) != list(ours):
        errors.append(
            f"auxiliary layers {stated} (starting draft, vLLM numbering) != {list(ours)} (this run's hidden "
            f"states): set hidden_states.layers: {sglang_layer_ids(stated)} (0-indexed outputs) to train "
            "on the draft's layers"
        )
    return errors


def _tensor_errors(start: StartingDraft, expected: dict[str, torch.Tensor]) -> list[str]:
    """Names and shapes against the draft's own tensors (lm_head's rows are remapped, not compared)."""
    tensors = {k: v for k, v in start.tensors.items() if k not in DROPPED}
    missing, unknown = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unknown:
        return [
            f"tensors missing {missing}, unknown {unknown}: another draft architecture (this run's draft "
            "is built from draft.* and target.model)"
        ]
    errors = []
    for name, tensor in tensors.items():
        want = tuple(expected[name].shape)
        have = tuple(tensor.shape)
        if name == "lm_head.weight":
            want, have = want[1:], have[1:]
        if have != want:
            errors.append(
                f"{name} has shape {tuple(tensor.shape)}, this run's draft {tuple(expected[name].shape)}"
            )
    return errors


def check_fits(
    start: StartingDraft,
    config: DraftConfig,
    expected: dict[str, torch.Tensor],
    aux_layers_vllm: list[int] | None = None,
) -> None:
    """Refuse a starting draft that is not this run's draft up to its vocabulary.

    Args:
        start: the starting draft.
        config: this run's draft (draft_config_from_target).
        expected: this run's draft's tensors (Eagle3Draft.exported_state_dict), for names and shapes.
        aux_layers_vllm: the auxiliary layers of this run's hidden states (None: not compared).

    Raises:
        ValueError: every mismatch, each with both values and the key to set.
    """
    errors = _shape_errors(start, config) + _aux_errors(start, config, aux_layers_vllm)
    embed = start.tensors.get("embed_tokens.weight")
    target_embed = (config.vocab_size, config.hidden_size)
    if embed is not None and tuple(embed.shape) != target_embed:
        errors.append(
            f"embed_tokens.weight {tuple(embed.shape)} != the target's {target_embed}: a draft of another "
            "target; set target.model or draft.init_from"
        )
    errors = errors or _tensor_errors(start, expected)  # the stated shapes explain a tensor mismatch best
    if errors:
        raise ValueError(f"draft.init_from: {start.path} does not fit this run's draft: " + "; ".join(errors))
    if start.rope_theta != config.rope_theta:
        log.warning(
            "draft.init_from: the starting draft's rope_theta is %g (10,000 when its config states none), "
            "this run's draft trains and exports the target's %g: its attention starts from weights fitted "
            "to other rotary frequencies",
            start.rope_theta,
            config.rope_theta,
        )


def remap_rows(
    rows: torch.Tensor, start_ids: torch.Tensor, new_ids: torch.Tensor, fresh: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """lm_head rows for `new_ids` (target ids): a token's row from `rows` where `start_ids` holds it, else
    its row of `fresh`; -> (rows [len(new_ids), H], how many were carried over)."""
    size = int(max(start_ids.max(), new_ids.max())) + 1
    position = torch.full((size,), -1, dtype=torch.int64)
    position[start_ids] = torch.arange(len(start_ids))
    source = position[new_ids]
    shared = source >= 0
    out = fresh.detach().clone()
    out[shared] = rows[source[shared]].to(out.dtype)
    return out, int(shared.sum())


def load_into(
    model: Eagle3Draft, start: StartingDraft, token_ids: torch.Tensor, aux_layers_vllm: list[int] | None
) -> int:
    """Check `start` against `model` and load its tensors, lm_head remapped to `token_ids` (this run's
    draft vocabulary, target ids); -> the lm_head rows carried over."""
    expected = model.exported_state_dict()
    check_fits(start, model.config, expected, aux_layers_vllm)
    tensors = {k: v for k, v in start.tensors.items() if k not in DROPPED}
    head, carried = remap_rows(
        tensors["lm_head.weight"], start.token_ids, token_ids, expected["lm_head.weight"]
    )
    model.load_trained(tensors | {"lm_head.weight": head})
    log.info(
        "draft.init_from: started from %s (%s format); lm_head: %d of this run's %d draft tokens carried "
        "over by target token id, %d new ones start from the seeded init (%d of the starting draft's %d "
        "tokens not in this run's vocabulary map)",
        start.path,
        start.format,
        carried,
        len(token_ids),
        len(token_ids) - carried,
        len(start.token_ids) - carried,
        len(start.token_ids),
    )
    return carried


def start_training_from(
    model: Eagle3Draft, init_from: str | None, token_ids: torch.Tensor, shard: str | None
) -> None:
    """Training's hook: load draft.init_from into the freshly built `model` (nothing when unset).

    Args:
        model: the draft as build_model made it (seeded init, before any sharding or DDP wrap).
        init_from: config draft.init_from.
        token_ids: this run's draft vocabulary (target ids of lm_head's rows).
        shard: a training shard of this run, whose metadata names the auxiliary layers (None: not checked).
    """
    if not init_from:
        return
    aux = aux_layers_from_metadata(Path(shard).with_suffix(".json")) if shard else None
    load_into(model, read_starting_draft(init_from), token_ids, aux)


def write_eagle_checkpoint(
    init_from: str | Path, config: DraftConfig, aux_layers_vllm: list[int], output_dir: str | Path
) -> Path:
    """The starting draft, checked against this run's draft `config` (its own vocabulary kept), as an
    EAGLE-format folder the offline check reads (validate/offline.py: load_draft); -> the folder.

    Raises:
        ValueError: the draft does not fit this run's draft (check_fits).
    """
    start = read_starting_draft(init_from)
    own = dataclasses.replace(config, draft_vocab_size=len(start.token_ids))
    with torch.device("meta"):  # names and shapes only: no memory for a production-size draft
        expected = Eagle3Draft(own).exported_state_dict()
    check_fits(start, own, expected, aux_layers_vllm)
    tensors = {k: v.to(torch.bfloat16) for k, v in start.tensors.items() if k not in DROPPED}
    if own.draft_vocab_size != own.vocab_size:
        t2d = torch.zeros(own.vocab_size, dtype=torch.bool)
        t2d[start.token_ids] = True
        tensors |= {"d2t": start.token_ids - torch.arange(len(start.token_ids)), "t2d": t2d}
    out = Path(output_dir)
    io.write_safetensors(tensors, out / "model.safetensors", metadata={"format": "pt"})
    io.write_json(checkpoint_config(own, aux_layers_vllm), out / "config.json", indent=1)
    log.info("starting draft %s written as %s for the offline check", start.path, out)
    return out
