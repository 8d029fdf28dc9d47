"""The report's first page as a real browser shows it: a headless Chromium screenshot, and whether the
rendered page (after its JavaScript ran) opens on the verdict.

    snakemake --report results/demo/report.html
    python benchmarks/report_screenshot.py results/demo/report.html results/demo/report-front.png

Needs a Chromium on PATH (Debian: `apt-get install chromium`; pip's playwright downloads its browser from
a CDN instead, so it is not used). Prints one JSON line: the screenshot's path and size, and the verdict
lines found in the rendered DOM. Not part of the suite (CI installs no browser); the first page's text is
tested in tests/workflow/test_report_rule.py.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=8000")
VERDICT = ("Verdict: run ", "Served check: ", "Decided by the sampled comparison", "Epoch shipped: ")


def browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        sys.exit(f"ERROR: no headless browser on PATH ({', '.join(BROWSERS)}): apt-get install chromium")
    return found


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser(), *FLAGS, *args], capture_output=True, text=True, timeout=180, check=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the HTML of `snakemake --report`")
    parser.add_argument("output", type=Path, help="the PNG to write")
    parser.add_argument("--size", default="1400,1000", help="window width,height in pixels")
    args = parser.parse_args()
    url = args.report.resolve().as_uri()
    shot = chromium(f"--window-size={args.size}", f"--screenshot={args.output.resolve()}", url)
    if not args.output.exists():
        sys.exit(f"ERROR: no screenshot written:\n{shot.stderr[-2000:]}")
    dom = re.sub(r"<[^>]+>", "", chromium("--dump-dom", url).stdout)
    sys.stdout.write(
        json.dumps(
            {
                "screenshot": str(args.output),
                "bytes": args.output.stat().st_size,
                "window": args.size,
                "verdict_rendered": {phrase: phrase in dom for phrase in VERDICT},
            }
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
