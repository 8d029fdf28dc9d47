"""Run by .venv-speculators' python (tests/integration/test_speculators_load.py): the speculators
library's own loader and forward on an exported speculators-format folder.

    python speculators_load.py FOLDER INPUTS OUTPUT [FOLDER INPUTS OUTPUT ...]

For each triple (one process: the library's import is most of the cost), loads FOLDER with
`SpeculatorModel.from_pretrained` (speculators' registry picks the model class from config.json), the
verifier's embeddings with `load_verifier_weights` (from the folder the config names), runs speculators'
Eagle3 forward (teacher-forced TTT steps) on INPUTS (safetensors: aux_hidden_states [1, T, 3H],
input_ids [1, T] as speculators aligns them) and writes OUTPUT: its draft tokens and logits per step and,
as JSON metadata, the class, the config fields read, the model's tensors the file did not give and the
file's tensors the model does not hold as stored.
"""

import json
import sys

import torch
from safetensors.torch import load_file, save_file
from speculators import SpeculatorModel, SpeculatorModelConfig

FIELDS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size")


def check(folder: str, inputs: str, output: str) -> None:
    config = SpeculatorModelConfig.from_pretrained(folder)
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention wants a compiler  # noqa: SLF001
    model = SpeculatorModel.from_pretrained(folder, config=config)
    loaded = {name: t.clone() for name, t in model.state_dict().items()}
    model = model.float().eval()
    # The checkpoint carries no embeddings (vLLM shares the target's): load_verifier_weights fills them
    # when they are NaN, as Eagle3DraftModel's __init__ leaves them, but from_pretrained (transformers 5)
    # materialises a weight absent from the file uninitialised; mark them as __init__ does first.
    torch.nn.init.constant_(model.embed_tokens.weight, torch.nan)
    model.load_verifier_weights()
    logits = []
    model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out[0]))
    stored = load_file(f"{folder}/model.safetensors")
    data = load_file(inputs)
    ids = data["input_ids"]
    with torch.no_grad():
        tokens = model(
            hidden_states=data["aux_hidden_states"],
            input_ids=ids,
            document_ids=torch.zeros_like(ids),
            ttt_steps=int(data["steps"]),
        )
    report = {
        "class": type(model).__name__,
        "config": {name: getattr(model.config, name) for name in FIELDS},
        "verifier": model.config.speculators_config.verifier.name_or_path,
        "layer_ids": list(model.config.eagle_aux_hidden_state_layer_ids),
        "not_in_file": sorted(loaded.keys() - stored.keys()),  # left to init or to the verifier
        "not_loaded": sorted(k for k in stored if k not in loaded or not torch.equal(loaded[k], stored[k])),
        "nan": [name for name, p in model.state_dict().items() if p.is_floating_point() and p.isnan().any()],
    }
    drafted = {"tokens": torch.stack([t[0] for t in tokens]), "logits": torch.stack(logits)}
    save_file(drafted, output, metadata={"report": json.dumps(report)})


args = sys.argv[1:]
for i in range(0, len(args), 3):
    check(*args[i : i + 3])
