#!/bin/bash
# A typical wrapper: activate a venv, set a few things, exec vLLM with the unit's extra arguments.
set -euo pipefail
source /opt/vllm/bin/activate
export VLLM_LOGGING_LEVEL=INFO
MAX_LEN=16384
exec vllm serve "$MODEL" \
    --port "${PORT}" \
    --max-model-len "$MAX_LEN" \
    --reasoning-parser "${REASONING_PARSER:-qwen3}" \
    "$@"
