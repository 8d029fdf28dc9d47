"""The words a figure of the report carries (validate/report.py writes `figure_text` into each PNG's
`Description` text chunk), read back so that a test checks what a picture claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_figure_text(path: str | Path) -> list[dict[str, Any]]:
    """Each panel's title, axis labels, legend entries and texts, as `figure_text` recorded them."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text["Description"])
