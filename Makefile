# The two commands of the README: `make demo` (install, then the whole demo DAG) and `make test`.
SHELL := /bin/bash
CORES ?= all
PYTEST_ARGS ?=

.PHONY: install install-pipeline install-vllm install-speculators conda-envs demo plan cost test test-fast lint vllm-compat readme-table clean-demo

# .venv first (the other two see its torch), then the other two side by side; each is a no-op once
# installed from the same pins (envs/install.sh's stamp)
install: install-pipeline
	$(MAKE) --no-print-directory -j2 install-vllm install-speculators

install-pipeline:
	envs/install.sh pipeline

install-vllm: install-pipeline
	envs/install.sh vllm

install-speculators: install-pipeline  # only for tests/integration/test_speculators_load.py (skipped without it)
	envs/install.sh speculators

# envs/pipeline.yaml and envs/vllm.yaml (snakemake --use-conda) from the pins in envs/*.txt
conda-envs:
	python3 envs/conda_envs.py

# DEMO=kimi: the Kimi-family demo (config/demo-kimi/config.yaml over config/config.yaml, results/demo-kimi/)
DEMO ?=
# The demo's GPU rules (training, epoch selection, offline validation) run on CPU, one thread each: two
# at once on the 2-core machine (the learning-curve point trains beside the baseline draft). The serve check
# and the extraction engine hold every slot, so the timing and the engine still run alone.
DEMO_GPU_SLOTS ?= 2
demo: install
	source .venv/bin/activate && snakemake --cores $(CORES) --resources gpu=$(DEMO_GPU_SLOTS) $(if $(DEMO),--configfile config/demo-$(DEMO)/config.yaml)

# the plan of a config, no weights, GPUs or network needed: make plan CONFIG=config/examples/kimi-k2.5-8gpu.yaml
plan: install-pipeline
	source .venv/bin/activate && snakemake -n --configfile $(CONFIG)

# extraction's cost before a run, one JSON object: make cost CONFIG=config/examples/kimi-k2.5-8gpu.yaml
# (PROFILE=profiles/slurm: each engine scope's sbatch resources, GPU hours and a retry's cost): the
# engine jobs the DAG holds now, the plan once the traces are checked (from results/, else at the
# expected length: plan_source), and the bound
CONFIG ?= config/config.yaml
cost:  # read-only and fast: no install step (make install-pipeline first on a fresh machine)
	source .venv/bin/activate && python -m eagle3_pipeline.hidden_states.cost $(CONFIG) $(if $(PROFILE),--profile $(PROFILE))

# every tier (tests/unit, tests/integration, tests/workflow) on TEST_WORKERS pytest-xdist workers and
# WAITING_WORKERS more that take only the modules waiting on sshd, systemd or SLURM (the units of work
# and their order: tests/conftest.py), the 15 slowest tests listed at the end
TEST_WORKERS ?= 2
WAITING_WORKERS ?= 2
test: install
	source .venv/bin/activate && python -m pytest -n $$(( $(TEST_WORKERS) + $(WAITING_WORKERS) )) \
		--waiting-workers $(WAITING_WORKERS) --dist loadscope --durations=15 $(PYTEST_ARGS)

# the edit loop: tests/unit only (no vLLM, no fit, no snakemake run), its tests spread over the workers;
# installs .venv only when it is missing (or predates pytest-xdist)
test-fast:
	.venv/bin/python -c "import xdist" 2>/dev/null || $(MAKE) install-pipeline
	source .venv/bin/activate && python -m pytest tests/unit -n $(TEST_WORKERS) --dist loadscope --durations=15 $(PYTEST_ARGS)

lint: install-pipeline
	source .venv/bin/activate && ruff check src scripts tests benchmarks envs && ruff format --check src scripts tests benchmarks envs \
		&& snakefmt --check Snakefile rules  # snakemake --lint: tests/workflow/test_planning.py

# every vLLM name the project uses (VLLM_NAMES beside the code), checked in each supported release's own
# wheel (src/eagle3_pipeline/vllm_releases.py), read as source: no install, no GPU. The wheels are
# downloaded by name into .cache/vllm-wheels once (240-340 MB each); tests/unit/test_vllm_compat.py reads
# the same cache. One JSON line per release; exit 1 when a name is missing from one.
vllm-compat: install-pipeline
	source .venv/bin/activate && python -m eagle3_pipeline.vllm_compat

# mutation testing of the modules where a silent error costs most, each module's mutants against its fast
# unit tests (tests/mutation/run.py; results and survivors: docs/testing.md); not part of `make test`.
# mutmut is installed into .venv at the pin below on first use. A subset: make mutants
# MUTANT_MODULES="matched journal"; MUTANT_MINUTES caps each module's run (0: no cap)
.PHONY: mutants
MUTMUT_VERSION ?= 3.8.1
MUTANT_MODULES ?=
MUTANT_JOBS ?= 2
MUTANT_MINUTES ?= 0
mutants:
	[ -x .venv/bin/python ] || $(MAKE) install-pipeline
	.venv/bin/python -m pip show mutmut 2>/dev/null | grep -qx "Version: $(MUTMUT_VERSION)" \
		|| .venv/bin/python -m pip install --quiet "mutmut==$(MUTMUT_VERSION)"
	.venv/bin/python tests/mutation/run.py $(MUTANT_MODULES) --jobs $(MUTANT_JOBS) --minutes $(MUTANT_MINUTES)

# README's headline table, written between its markers from the demo's recorded figures (docs/demo.md:
# record them after a fresh demo; tests/unit/test_headline_table.py fails while README's table is stale)
readme-table:
	source .venv/bin/activate && python -m eagle3_pipeline.validate.headline_table docs/demo-figures.json README.md

clean-demo:
	rm -rf results/demo resources/demo results/demo-kimi resources/demo-kimi .snakemake
