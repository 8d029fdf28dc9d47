"""traces/plots: a panel with nothing to draw says so in words instead of an empty axis."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from eagle3_pipeline.traces.plots import plot_counts


def test_no_dropped_prompt_is_said_not_drawn_as_an_empty_panel(tmp_path: Path, monkeypatch):
    import matplotlib.pyplot as plt

    texts: list[str] = []
    save = plt.Figure.savefig

    def keep_texts(fig, *args, **kwargs):
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep_texts)
    stats = {
        "by_source": {"demo-math": {"ok": 3}},
        "kept_by_source": {"demo-math": 3},
        "dropped": {"truncated": 0},
        "prompts": 3,
    }
    plot_counts(stats, tmp_path / "counts.png")
    assert texts == ["no prompt dropped"]
    with Image.open(tmp_path / "counts.png") as image:
        assert image.size[0] > 0
