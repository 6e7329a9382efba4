"""The demo's figure: accuracy per draft step, correct capture vs miswired (matplotlib, Agg backend)."""
from __future__ import annotations

from typing import Dict, Optional


def accuracy_plot(path: str, curves: Dict[str, object], title: str, taus: Optional[Dict[str, str]] = None) -> None:
    """curves: label -> Metrics (teacher_forced, conditional per step). Two panels: teacher-forced and conditional
    accuracy per draft step; the legend carries each curve's predicted accept length when given."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    styles = [("tab:green", "o"), ("tab:red", "s"), ("tab:blue", "^"), ("tab:orange", "v")]
    for ax, field, name in ((axes[0], "teacher_forced", "teacher-forced"),
                            (axes[1], "conditional", "conditional on earlier steps accepted")):
        for (label, m), (color, marker) in zip(curves.items(), styles):
            ys = getattr(m, field)
            xs = list(range(1, len(ys) + 1))
            lab = label + (f"  ({taus[label]})" if taus and label in taus and field == "conditional" else "")
            ax.plot(xs, ys, color=color, marker=marker, label=lab)
        ax.set_xlabel("draft step")
        ax.set_title(f"top-1 accuracy, {name}", fontsize=10)
        ax.set_xticks(list(range(1, max(len(getattr(m, field)) for m in curves.values()) + 1)))
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("agreement with the target's greedy token")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["accuracy_plot"]
