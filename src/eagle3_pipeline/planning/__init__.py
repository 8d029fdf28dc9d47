"""What the workflow plans when it is parsed, as functions of the config's values (and, under a disk
cap, of the checked traces' records): the draft variants and the learning curve's points
(variants.py), the plan under hidden_states.max_disk_gb (disk_cap.py: from the config and the traces;
window_plan.py: the windows cut from byte counts; state_files.py: the training state files the cap
holds), the training in plan windows and the extraction gate (windows.py), the extraction engines'
folders (engines.py). rules/common/*.smk declare their names from these and wrap them as input
functions; the Snakemake-only parts (ancient, service, temp, expand, resources) stay in the rules.

Below every stage: planning imports only the package's foundations (settings, config, target_shape,
draft_config, state_bytes, io), never a stage (tests/unit/test_import_floors.py), so every stage may
read it.

One meaning per word:

- shard: a data shard (dataset.shard_size samples, `shard-{k:05d}`). FSDP's split of the draft's
  weights over the training processes stays inside `draft/fsdp.py` (its "sharded" means that alone).
- plan window: under hidden_states.max_disk_gb, the shards of one epoch whose hidden states are on disk
  together (window_plan.WindowPlan.windows, per epoch): extracted, trained on and deleted together. The
  engine folders' `epoch-E-window-W` and the extraction gate count plan windows.
- draft window: one draft's own window (windows.DraftWindows), numbered from 0 per draft and epoch,
  each sharing one plan window: the main draft's are the plan windows, a learning-curve point's those
  holding its shards. train_draft_window's {window} and draft/windows/epoch-E/window-W.pt count draft
  windows; draft/window_batches.py plans each draft window's batches.
- shards per window: the most shards one plan window holds at the config bound
  (disk_cap.shards_per_window); `window_shards` in make cost's output is the largest plan window's.
- in-flight tokens: the vLLM extraction engine's bound on tokens in the engine plus staged
  (hidden_states.vllm.max_in_flight_tokens, engine_health.InFlightTokens); not a window.
- variant: a draft trained by the draft rules ({variant}): "" the main draft, "baseline/", a
  learning-curve point "learning_curve/shards-{k}/".
- engine scope: the extraction jobs one engine serves (its folder): the main shards, one plan window,
  or the baseline's shards.
"""
