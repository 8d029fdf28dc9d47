"""The vllm backend's extraction engines: one folder per engine scope (the main shards, or under a
disk cap one epoch's plan window; the baseline's shards have their own), and the paths derived from a
folder: its log, its service() output, its stats' results folder, a shard's files that decide whether
it needs its scope's engine (hidden_states/engine.needs_engine).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_pipeline.config import SPLITS
from eagle3_pipeline.planning.variants import BASELINE

SERVICE = "service.json"  # the engine job's service() output, in its folder


@dataclass(frozen=True)
class EngineScopes:
    """The run's engine folders under work/ (`windowed`: one per epoch and plan window)."""

    results: str
    work: str
    logs: str
    windowed: bool

    @property
    def root(self) -> str:
        """The main engine's folder, or the parent of every plan window's."""
        return f"{self.work}/hidden_states/engine"

    @property
    def baseline(self) -> str:
        """The baseline's engine (its own scope: nothing of the main draft waits on it)."""
        return f"{self.work}/{BASELINE}hidden_states/engine"

    @property
    def pattern(self) -> str:
        """The main engine folder, with {epoch} and {window} (a plan window) when windowed."""
        return f"{self.root}/epoch-{{epoch}}-window-{{window}}" if self.windowed else self.root

    @property
    def roots(self) -> list[str]:
        """Every engine folder of the run: a GPU job waits there for a stopping engine's exit."""
        return [self.root, self.baseline]

    @property
    def stats_roots(self) -> list[str]:
        """Where each engine start's stats are kept (the report reads them), per root."""
        return [self.stats_dir(root) for root in self.roots]

    def folder(self, epoch: int | str | None = None, window: int | None = None) -> str:
        """The engine folder of plan window `window` of epoch `epoch` (the main one without windows)."""
        return self.pattern.format(epoch=epoch, window=window) if self.windowed else self.root

    def scope(self, where: str) -> str:
        """Engine folder `where` under work/: its logs' names."""
        return where.removeprefix(f"{self.work}/")

    def log(self, where: str) -> str:
        """The engine's own log (the engine process's, beside its job's)."""
        return f"{self.logs}/extraction_engine/{self.scope(where)}.log"

    def service(self, where: str) -> str:
        return f"{where}/{SERVICE}"

    def stats_dir(self, where: str) -> str:
        """The results folder of the stats of engine folder `where`: its path under results/RUN/ with
        engine_stats for engine (hidden_states/engine_stats[/epoch-E-window-W])."""
        stats = self.scope(where).replace("hidden_states/engine", "hidden_states/engine_stats", 1)
        return f"{self.results}/{stats}"

    def shard_files(self, states: str, shard: str) -> tuple[list[str], list[str]]:
        """A main extraction job's traces and outputs (its states in folder `states`): an output
        missing or older than its traces needs the scope's engine."""
        traces = [f"{self.results}/traces/shards/{split}/shard-{shard}.parquet" for split in SPLITS]
        outputs = [
            f"{states}/{split}/shard-{shard}.{ext}" for split in SPLITS for ext in ("safetensors", "json")
        ]
        return traces, outputs

    def baseline_shard_files(self, shard: str) -> tuple[list[str], list[str]]:
        """shard_files for a baseline extraction job (the train split only)."""
        states = f"{self.results}/{BASELINE}hidden_states/train/shard-{shard}"
        traces = [f"{self.results}/{BASELINE}traces/shards/train/shard-{shard}.parquet"]
        return traces, [f"{states}.safetensors", f"{states}.json"]
