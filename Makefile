# The two commands of the README: `make demo` (install, then the whole demo DAG) and `make test`.
SHELL := /bin/bash
CORES ?= all
PYTEST_ARGS ?=

.PHONY: install install-pipeline install-vllm demo plan test lint clean-demo

install: install-pipeline install-vllm

install-pipeline:
	envs/install.sh pipeline

install-vllm:
	envs/install.sh vllm

demo: install
	source .venv/bin/activate && snakemake --cores $(CORES)

plan: install-pipeline
	source .venv/bin/activate && snakemake -n

test: install
	source .venv/bin/activate && python -m pytest --durations=15 $(PYTEST_ARGS)

lint: install-pipeline
	source .venv/bin/activate && ruff check src scripts tests benchmarks && ruff format --check src scripts tests benchmarks \
		&& snakefmt --check Snakefile rules  # snakemake --lint: tests/workflow/test_planning.py

clean-demo:
	rm -rf results/demo resources/demo .snakemake
