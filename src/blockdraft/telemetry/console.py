"""The live console: one progress line that redraws in place, warnings printed above it."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.text import Text


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class TrainConsole:
    def __init__(self, total_steps: int, epochs: float, enabled: bool = True) -> None:
        self.total = total_steps
        self.epochs = epochs
        self.console = Console(stderr=True)
        self.enabled = enabled
        self._live: Live | None = None
        self._t0 = time.time()
        self._first_step: int | None = None
        self._skips = 0

    def __enter__(self) -> TrainConsole:
        if self.enabled:
            self._live = Live(Text(""), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def step(self, rec: dict) -> None:
        if not self.enabled:
            return
        k = rec["step"]
        if self._first_step is None:
            self._first_step, self._t0 = k, time.time()
        done = k - self._first_step + 1
        eta = (time.time() - self._t0) / done * (self.total - k) if done > 1 else 0.0
        loss, acc, tau = (float("nan") if rec[f] is None else rec[f] for f in ("loss", "acc", "tau_est"))
        line = (
            f"step {k}/{self.total}  loss {loss:.4f}  acc {acc:.3f}  tau_est {tau:.2f}  "
            f"lr {rec['lr']:.2e}  {rec['tok_per_s']:,.0f} tok/s  "
            f"epoch {rec['epoch'] + 1}{f'/{self.epochs:g}' if self.epochs else ''} {rec['epoch_progress']:.0%}  "
            f"ETA {_duration(eta)}"
        )
        if rec.get("skipped"):
            self._skips += 1
            line += f"  [skipped: {rec.get('skip_reason')}]"
        if self._skips:
            line += f"  skips {self._skips}"
        self._live.update(Text(line))

    def note(self, message: str, style: str = "yellow") -> None:
        """A line printed above the progress line (warnings, checkpoints, evals)."""
        if self.enabled:
            self.console.print(Text(message, style=style))
