"""The target's config.json, parsed here alone (`TargetShape.load`), and its auxiliary layers.

Every reader of the target's config.json (parse-time checks, the disk budget, extraction planning and
its vLLM engine, the final norm, the draft's shape) takes a `TargetShape`: the file as written, and
the language model's section of it (a VL wrapper such as Kimi-K2.5's nests it as text_config).

The auxiliary layers EAGLE-3 fuses are chosen here too, in one rule (`aux_layers`: hidden_states.layers
or `auto`), and renumbered here for each engine: `vllm_layer_ids` (vLLM's
eagle_aux_hidden_state_layer_ids, which the exported draft and speculators share), `engine_layer_ids`
(what the vLLM extraction engine captures) and `sglang_layer_ids` (SGLang's and SpecForge's numbering,
the 0-indexed layers themselves).

Standard library imports only: the vLLM interpreter imports it too (hidden_states/vllm_worker.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# model_type of targets with multi-head latent attention: DeepSeek-V2/V3 and the Kimi family built on
# V3 (draft.architecture auto gives them an MLA draft: draft_config.py)
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size")
DRAFT_KEYS = ("hidden_size", "num_attention_heads", "vocab_size")  # what a draft cannot be shaped without
AUTO_MIN_LAYERS = 5  # `auto` picks layers 1, N//2-1 and N-4: distinct from N = 5 on
# The embedded demo's tiny target (demo/fit.py, demo/tokenizer.py build it to this shape): what the
# workflow plans with before that target is built (the disk cap's windows and state files: planning/)
DEMO_HIDDEN_SIZE = 128
DEMO_TARGET_SHAPE = {
    "hidden_size": DEMO_HIDDEN_SIZE,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 1024,
}


class AuxLayerError(ValueError):
    """hidden_states.layers cannot name three auxiliary layers of the target; the message says why."""


@dataclass(frozen=True)
class TargetShape:
    """The target's config.json: `config` as written, its sha256, and the language model's fields."""

    config: Mapping[str, Any]
    sha256: str = ""  # of the file's bytes ("" when built from a mapping)
    source: str = "the target config.json"  # the file, for messages

    @classmethod
    def load(cls, target: str | Path) -> TargetShape:
        """From a model folder or the config.json itself.

        Raises:
            OSError: the file cannot be read; ValueError: it is not JSON.
        """
        file = config_file(target)
        raw = file.read_bytes()
        return cls(json.loads(raw), hashlib.sha256(raw).hexdigest(), str(file))

    @classmethod
    def from_json(cls, model_config: Mapping[str, Any]) -> TargetShape:
        return cls(model_config)

    @property
    def is_vl_wrapper(self) -> bool:
        """A multimodal wrapper (Kimi-K2.5's KimiK25ForConditionalGeneration): a text or vision config
        inside."""
        return "text_config" in self.config or "vision_config" in self.config

    @property
    def text(self) -> dict[str, Any]:
        """The language model's section: a wrapper's text_config (where the top states no hidden_size),
        with the wrapper's model_type when the text model names none; else the whole config."""
        nested = self.config.get("text_config")
        if "hidden_size" in self.config or not isinstance(nested, dict) or not nested:
            return dict(self.config)
        wrapper = {"model_type": self.config["model_type"]} if self.config.get("model_type") else {}
        return wrapper | nested

    @property
    def model_type(self) -> str | None:
        return self.text.get("model_type")

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def has_remote_code(self) -> bool:
        """An auto_map: the model's classes ship with it (trust_remote_code)."""
        return bool(self.config.get("auto_map"))

    @property
    def num_layers(self) -> int | None:
        """Decoder layers N, None when config.json states none."""
        layers = self.text.get("num_hidden_layers")
        return layers if isinstance(layers, int) else None

    @property
    def hidden_size(self) -> int:
        """Raises ValueError when config.json states none."""
        hidden = self.text.get("hidden_size")
        if not isinstance(hidden, int):
            raise ValueError("the target config.json has no hidden_size (nor text_config.hidden_size)")
        return hidden

    @property
    def rms_norm_eps(self) -> float | None:
        return self.text.get("rms_norm_eps")

    def stated_shape(self) -> tuple[int, int, int] | None:
        """The language model's (layers, hidden, vocab) as config.json states them, or None when it does
        not say them plainly: a key missing (a config class's default or renamed attribute), or a nested
        config other than text_config that could be the language model's, or a text_config beside a
        hidden_size at the top (AutoConfig decides then)."""
        nested = [k for k, v in self.config.items() if isinstance(v, dict) and "hidden_size" in v]
        if nested not in ([], ["text_config"]) or (nested and "hidden_size" in self.config):
            return None
        values = [self.text.get(key) for key in SHAPE_KEYS]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return None
        return values[0], values[1], values[2]

    def draft_fields(self) -> dict[str, Any]:
        """The language model's section, for draft_config.py's draft_config_from_target.

        Raises:
            ValueError: a key no draft can be shaped without is missing.
        """
        text = self.text
        missing = [k for k in DRAFT_KEYS if k not in text]
        if missing:
            raise ValueError(f"target config {self.source} lacks {missing}; is target.model a causal LM?")
        return text

    def aux_layers(self, spec: str | Sequence[int | str]) -> list[int]:
        """`aux_layers(spec, N)` for this target (N: num_hidden_layers)."""
        return aux_layers(spec, int(self.text["num_hidden_layers"]))


def config_file(target: str | Path) -> Path:
    """The config.json of `target`, a model folder or the file itself."""
    path = Path(target)
    return path / "config.json" if path.is_dir() else path


def aux_layers(spec: str | Sequence[int | str], num_layers: int) -> list[int]:
    """The three auxiliary layers as 0-indexed decoder-layer outputs (HF `hidden_states[l + 1]`).

    Args:
        spec: hidden_states.layers: "auto" (layers 1, N//2-1, N-4, as EAGLE-3 / SpecForge pick them) or
            three ints.
        num_layers: the target's decoder layer count N.

    Raises:
        AuxLayerError: when the layers are not three distinct ints in [0, N).
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    if [str(x) for x in items] == ["auto"]:
        if num_layers < AUTO_MIN_LAYERS:
            raise AuxLayerError(
                f"hidden_states.layers=auto needs >= {AUTO_MIN_LAYERS} decoder layers, "
                f"target has {num_layers}"
            )
        layers = [1, num_layers // 2 - 1, num_layers - 4]
    else:
        try:
            layers = [int(x) for x in items]
        except ValueError as err:
            raise AuxLayerError(f"hidden_states.layers: {spec!r} is neither 'auto' nor three ints") from err
    if len(layers) != 3 or len(set(layers)) != 3 or not all(0 <= x < num_layers for x in layers):
        raise AuxLayerError(
            f"hidden_states.layers: {layers} must be three distinct 0-indexed decoder layers in "
            f"[0, {num_layers}) (or 'auto')"
        )
    return sorted(layers)


def vllm_layer_ids(layers: Sequence[int]) -> list[int]:
    """vLLM's `eagle_aux_hidden_state_layer_ids`: the *input* to layer l+1, i.e. output of layer l."""
    return [int(x) + 1 for x in layers]


def engine_layer_ids(layers: Sequence[int], num_layers: int) -> list[int]:
    """The ids the vLLM extraction engine captures: the aux layers' vLLM ids, then N (the last decoder
    layer's output, before the final norm: hidden_states/final_norm.py applies it)."""
    return [*vllm_layer_ids(layers), num_layers]


def sglang_layer_ids(aux_layer_ids_vllm: Sequence[int]) -> list[int]:
    """vLLM's ids ("input of layer i") as SGLang/SpecForge number them ("output of 0-indexed layer i").

    Raises:
        ValueError: an id 0 (the embeddings), which SGLang's numbering cannot express.
    """
    if any(i < 1 for i in aux_layer_ids_vllm):
        raise ValueError(
            f"auxiliary layer ids {list(aux_layer_ids_vllm)} (vLLM numbering) include the embeddings"
        )
    return [int(i) - 1 for i in aux_layer_ids_vllm]
