"""Shared reading of a depth sweep: the plateau sentence and the two-panel plot."""

from __future__ import annotations

from .output import figure, log_if_spread, save_figure


def plateau_note(sweep, rows) -> str:
    """Where ``satcore._decisions.sweep``'s plateau starts and how much loss was gained before and after it.

    ``rows`` carry ``blocks``, ``train_loss`` and ``test_loss`` in depth order.
    """
    p = sweep.plateau
    rule = f"plateau (satcore._decisions.sweep rule on V_max, rel_tol {sweep.rel_tol})"
    if p is None:
        return f"{rule}: none -- the growth value is still falling at the deepest model."
    first = next(r for r in rows if r["blocks"] == p.start_depth)
    base, last = rows[0], rows[-1]
    signal = "low signal: every V_max within 2x its noise floor" if p.low_signal else "above the noise floor"
    return (
        f"{rule} starts at {p.start_depth} blocks ({signal}); loss gain up to it: "
        f"train {base['train_loss'] - first['train_loss']:+.4f}, test {base['test_loss'] - first['test_loss']:+.4f}; "
        f"after it: train {first['train_loss'] - last['train_loss']:+.4f}, "
        f"test {first['test_loss'] - last['test_loss']:+.4f}."
    )


SERIES = [
    ("train_ag_max", "AG_max (train probe)", "o-"),
    ("train_ag_batch_max", "eq. (2) (train, batch mean)", "^-"),
    ("growth_value_max", "V_max (held-out)", "s-"),
    ("growth_floor", "noise floor of V", "k--"),
]


def plot_sweep(rows, sweep, path, title: str, xlabel: str, loss_label: str = "cross-entropy (nats)"):
    """Left: train/test loss vs depth. Right: AG_max, eq. (2), V_max and its noise floor (log y)."""
    fig, (ax1, ax2) = figure(2)
    blocks = [r["blocks"] for r in rows]
    losses = [r["train_loss"] for r in rows] + [r["test_loss"] for r in rows]
    ax1.plot(blocks, [r["train_loss"] for r in rows], "o-", label="train loss")
    ax1.plot(blocks, [r["test_loss"] for r in rows], "s-", label="test loss")
    ax1.set_xlabel(xlabel)
    ax1.set_ylabel(loss_label)
    log_if_spread(ax1, losses)
    ax1.set_title(f"{title}: loss vs depth")
    ax1.legend()
    values = []
    for key, label, style in SERIES:
        ys = [r.get(key) for r in rows]
        values += ys
        ax2.plot(blocks, ys, style, label=label)
    if sweep.plateau is not None:
        ax2.axvline(sweep.plateau.start_depth, color="grey", ls=":", label="plateau start")
    ax2.set_xlabel(xlabel)
    ax2.set_ylabel("score (activation-gradient units)")
    log_if_spread(ax2, values)
    ax2.set_title("first-order signal vs depth")
    ax2.legend(fontsize=7)
    save_figure(fig, path)
