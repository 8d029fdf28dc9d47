"""The vllm backend's extraction engines: one folder per engine scope (the main shards, or under a
disk cap one epoch's plan window; the baseline's shards have their own), and the paths derived from a
folder: its log, its service() output (`planned_service`: what every extraction job of the scope
consumes), its stats' results folder, a shard's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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

    def planned_service(self, where: str) -> str:
        """The service() output of engine folder `where`, made to exist (empty) when Snakemake plans.

        Every extraction job of the scope consumes it as an ancient input, so that Snakemake pairs each
        extraction job it runs, for whatever reason (an output missing, a changed param or script,
        --forcerun), with the scope's engine job: a service output always counts as missing to a
        job that runs, which pulls the engine job in. The engine job running reruns no done shard:
        an ancient input that exists never does. Snakemake deletes the file once the group is done
        (jobs.py, GroupJob.postprocess), so it is made again here: without it every done shard of the
        scope would rerun with the engine (Snakemake 9.27.1, dag.update_needrun).
        """
        path = Path(self.service(where))
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        return str(path)

    def stats_dir(self, where: str) -> str:
        """The results folder of the stats of engine folder `where`: its path under results/RUN/ with
        engine_stats for engine (hidden_states/engine_stats[/epoch-E-window-W])."""
        stats = self.scope(where).replace("hidden_states/engine", "hidden_states/engine_stats", 1)
        return f"{self.results}/{stats}"
