"""README's headline table, written from the demo's recorded figures (docs/demo-figures.json).

The table sits between two markers in README.md and is never edited by hand: `make readme-table` (this
module's main) rewrites what lies between them, and tests/unit/test_headline_table.py fails when README's
table is not what this module writes from the committed figures. Served acceptance only: the figure the
serve check enforces (at the generation's sampling) and greedy beside it, for the draft trained on the
target's own traces and for the baseline trained on the dataset's answers.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

BEGIN = "<!-- headline table: written by `make readme-table` from docs/demo-figures.json, not by hand -->"
END = "<!-- end of the headline table -->"
WIDTH = 105  # README's prose width


def interval(figure: dict[str, Any], bold: bool = False) -> str:
    """`2.16 [2.00, 2.35]`: the value and its 95% interval, two decimals as README writes them."""
    value = f"{figure['value']:.2f}"
    low, high = figure["ci95"]
    return f"{f'**{value}**' if bold else value} [{low:.2f}, {high:.2f}]"


def headline_table(figures: dict[str, Any]) -> str:
    """The table and its caption (what was measured, on what, with which intervals), without markers."""
    served, baseline = figures["served"], figures["baseline"]["served"]
    caption = (
        f"Tokens accepted per target step, the draft served by vLLM ({served['questions']} validation "
        f"questions, {served['k']} speculative tokens, 95% question-level intervals, fresh runs differ by up "
        f"to {figures['spread']['acceptance_length']}; measured {figures['measured']}):"
    )
    rows = (
        ("the target's own traces (this pipeline)", served),
        ("the dataset's answers (the baseline)", baseline),
    )
    return "\n".join(
        [
            textwrap.fill(caption, WIDTH),
            "",
            "| draft trained on | served at the generation's sampling (the check) | served greedy |",
            "|---|---|---|",
            *(
                f"| {name} | {interval(run['sampled'], bold=True)} | {interval(run['greedy'])} |"
                for name, run in rows
            ),
        ]
    )


def with_table(readme: str, table: str) -> str:
    """`readme` with `table` between its markers (each must be there once, BEGIN before END)."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"README must hold the markers once each, in order:\n{BEGIN}\n{END}")
    head, rest = readme.split(BEGIN, 1)
    # the blank line ends the table before the closing comment, in every Markdown renderer
    return f"{head}{BEGIN}\n{table}\n\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str]) -> int:
    """Rewrite README's headline table from the recorded figures."""
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.validate.headline_table", description=main.__doc__
    )
    parser.add_argument("figures", type=Path, help="docs/demo-figures.json")
    parser.add_argument("readme", type=Path, help="README.md")
    args = parser.parse_args(argv)
    table = headline_table(json.loads(args.figures.read_text()))
    args.readme.write_text(with_table(args.readme.read_text(), table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
