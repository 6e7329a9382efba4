"""The watch's figure (matplotlib, Agg): per draft position, the live acceptance of each interval over time, the
expected acceptance as a dashed line of the same colour, and the moments an alarm started as red vertical lines.
Written through a temporary file and a rename, at every refresh, so that a watch that is killed still leaves the
last complete figure."""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

from .series import AlarmEvent, Refresh


def acceptance_plot(path: str, refreshes: Sequence[Refresh], events: Sequence[AlarmEvent],
                    expected: Dict[int, Optional[float]], title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    positions = sorted({row.position for r in refreshes for row in r.rows} | set(expected))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
    for i, p in enumerate(positions):
        c = colors[i % len(colors)]
        xs: List[float] = []
        ys: List[float] = []
        for r in refreshes:
            row = next((row for row in r.rows if row.position == p), None)
            if row is not None and row.live is not None:
                xs.append(r.t)
                ys.append(row.live)
        ax.plot(xs, ys, color=c, marker="o", markersize=3, label=f"position {p} live")
        e = expected.get(p)
        if e is not None:
            ax.axhline(e, color=c, linestyle="--", linewidth=1, label=f"position {p} expected {e:.3f}")
    for k, ev in enumerate(events):
        ax.axvline(ev.t, color="red", linestyle=":", linewidth=1.2, label="alarm" if k == 0 else None)
    ax.set_xlabel("seconds since the watch started")
    ax.set_ylabel("acceptance (accepted / verifies reaching the position)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if positions or events:
        ax.legend(loc="lower left", fontsize=7, ncol=2)
    fig.tight_layout()
    tmp = f"{path}.tmp{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["acceptance_plot"]
