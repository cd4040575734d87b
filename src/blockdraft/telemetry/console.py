"""The live console: a progress bar in a terminal, plain timed lines everywhere else.

In a terminal (stdout and stderr both), a rich bar redraws in place on stderr, with notes
(warnings, checkpoints, evals) printed above it; every line is cropped to the terminal's width.
Under nohup, slurm or `| tee` there is nothing to redraw, so one plain line goes to stdout every
`log_every_s` seconds, at each note and at the end, each a whole line of its own. The ETA comes
from the pace of the last steps, so a slow start (compilation, warm caches) does not skew it, and
is shown only once a pace exists.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections import deque
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Pace:
    """Wall seconds per step and tokens per second over the last `window` steps. A step number
    that goes back (a rollback) starts the window afresh."""

    def __init__(self, window: int = 50) -> None:
        self._marks: deque[tuple[int, float]] = deque(maxlen=window + 1)
        self._work: deque[tuple[float, float]] = deque(maxlen=window)

    def add(self, step: int, now: float, tokens: float, step_time: float) -> None:
        if self._marks and step < self._marks[-1][0]:
            self._marks.clear()
            self._work.clear()
        self._marks.append((step, now))
        self._work.append((tokens, step_time))

    def seconds_per_step(self) -> float | None:
        """None until two steps apart have been seen: there is no pace on the first step."""
        if len(self._marks) < 2:
            return None
        (s0, t0), (s1, t1) = self._marks[0], self._marks[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else None

    def tokens_per_second(self) -> float | None:
        busy = sum(t for _, t in self._work)
        return sum(n for n, _ in self._work) / busy if busy > 0 else None


def or_dash(value: float | None, spec: str) -> str:
    """A number as `spec` formats it; `-` where there is none (the bench and ckpt-scan tables too)."""
    return "-" if value is None else format(value, spec)


class TrainConsole:
    """Progress of a training run for a person watching; log.jsonl holds the numbers."""

    def __init__(self, total_steps: int, epochs: float, enabled: bool = True, log_every_s: float = 30.0,
                 terminal: bool | None = None, stream: TextIO | None = None) -> None:
        self.total = total_steps
        self.epochs = epochs
        self.enabled = enabled
        self.log_every_s = log_every_s
        # both streams on a terminal: only then can a bar redraw without filling a log file
        self.terminal = (sys.stdout.isatty() and sys.stderr.isatty()) if terminal is None else terminal
        self.stream = stream  # plain lines; None: sys.stdout at the time of writing
        self.console = Console(stderr=True)
        self.pace = Pace()
        self._live: Live | None = None
        self._t0 = time.time()
        self._rec: dict[str, Any] | None = None
        self._skips = 0
        self._last_line_at: float | None = None
        self._unprinted = False

    def __enter__(self) -> TrainConsole:
        self._t0 = time.time()
        if self.enabled and self.terminal:
            self._live = Live(self, console=self.console, refresh_per_second=4)  # redrawn: the clock ticks
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        elif self.enabled and not self.terminal and self._unprinted:
            self._plain(self.status_line())

    def step(self, rec: dict[str, Any]) -> None:
        """Take a `step` record; without a terminal, print a line when log_every_s has passed."""
        if not self.enabled:
            return
        now = time.time()
        self.pace.add(rec["step"], now, rec.get("tokens") or 0, rec.get("step_time") or 0.0)
        self._skips += bool(rec.get("skipped"))
        self._rec = rec
        self._unprinted = True
        if not self.terminal and (self._last_line_at is None or now - self._last_line_at >= self.log_every_s):
            self._plain(self.status_line())

    def note(self, message: str, style: str = "yellow") -> None:
        """A line of its own (warnings, checkpoints, evals); without a terminal the progress line
        comes first, so each checkpoint and eval shows where the run stood."""
        if not self.enabled:
            return
        if self.terminal:
            self.console.print(Text(message, style=style))
            return
        if self._unprinted:
            self._plain(self.status_line())
        self._plain(message)

    # ---- what is shown ----------------------------------------------------------------------------------
    def _parts(self) -> tuple[str, str]:
        """(progress, metrics): where the run is and how fast it goes; how the drafter is doing."""
        rec = self._rec or {}
        k = rec.get("step", 0)
        spent = time.time() - self._t0
        per_step = self.pace.seconds_per_step()
        eta = _duration(per_step * max(0, self.total - k)) if per_step is not None else "--"
        progress = (f"step {k}/{self.total} {k / max(self.total, 1):.0%}  elapsed {_duration(spent)}  ETA {eta}  "
                    f"{or_dash(per_step, '.2f')} s/step")
        tok_s = self.pace.tokens_per_second()
        epoch = ""
        if "epoch" in rec:
            of = f"/{self.epochs:g}" if self.epochs else ""
            epoch = f"  epoch {rec['epoch'] + 1}{of} {rec.get('epoch_progress', 0):.0%}"
        stats = (f"loss {or_dash(rec.get('loss'), '.4f')}  acc {or_dash(rec.get('acc'), '.3f')}  "
                 f"tau_est {or_dash(rec.get('tau_est'), '.2f')}  lr {or_dash(rec.get('lr'), '.2e')}  "
                 f"{or_dash(tok_s, ',.0f')} tok/s{epoch}")
        if rec.get("skipped"):
            stats += f"  [skipped: {rec.get('skip_reason')}]"
        if self._skips:
            stats += f"  skips {self._skips}"
        return progress, stats

    def status_line(self) -> str:
        return "  ".join(self._parts())

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """Two lines, each cropped to the terminal: the bar with where the run is, then the metrics."""
        progress, stats = self._parts()
        k = (self._rec or {}).get("step", 0)
        head = Table.grid(padding=(0, 1))
        head.add_column(no_wrap=True)
        head.add_column(no_wrap=True, overflow="ellipsis")
        bar_width = max(10, min(30, options.max_width - len(progress) - 1))  # the text keeps its room first
        head.add_row(ProgressBar(total=max(self.total, 1), completed=k, width=bar_width), Text(progress))
        yield Group(head, Text(stats, no_wrap=True, overflow="ellipsis"))

    def _plain(self, line: str) -> None:
        stream = self.stream or sys.stdout
        line = f"{time.strftime('%H:%M:%S')} {line}"
        if stream.isatty():
            line = line[: shutil.get_terminal_size().columns]
        stream.write(line + "\n")
        stream.flush()
        self._last_line_at = time.time()
        self._unprinted = False
