"""The training-loss curve as a PNG, shared by the finetune://jobs/{id}/loss.png resource and finetune_status."""

from __future__ import annotations

import io

from gpubox.errors import MissingExtraError


def loss_png(points: list[tuple[int, float]], title: str) -> bytes:
    """The loss curve as a PNG (matplotlib's Agg backend through Figure: no display, no global pyplot state)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("The loss-curve image", "train", "matplotlib") from exc
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
