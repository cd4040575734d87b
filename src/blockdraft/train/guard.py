"""The step guard: decides, from the step's already-synced metrics, whether an update may be applied.

Why: one non-finite or wildly outlying batch must not reach the weights or Adam's moments (the
incident had no NaN detection at all). The decision uses only host floats the loop fetches anyway
(the one metrics sync per step), so guarding costs no extra device round trip.

Spike test, per length bucket (buckets differ in typical loss): a value is a spike when it exceeds
median + k * MAD of the last `window` accepted values of that bucket, once `min_history` values exist,
AND a multiple of that median: `spike_min_ratio` for the loss, `grad_norm_min_ratio` for the grad
norm. MAD is floored at 1e-3 * |median| so a flat history does not turn ordinary noise into spikes;
the ratio keeps MAD's narrow bar from refusing ordinary wobbles. The two differ because the wobbles do:
in a healthy demo run of 2,136 updates no loss reached 1.9x its bucket's median, while small batches'
grad norms reached 3.4x (a ratio of 3 refused 3 of those updates).
Skipped values never enter the window, so a run of spikes cannot raise the bar for itself.

The windows and the run of skips are part of the train state (`state_dict`): a resumed run tests
for spikes from its first step exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from statistics import median
from typing import Any

from blockdraft.config import GuardConfig


class StepGuard:
    def __init__(self, cfg: GuardConfig) -> None:
        self.cfg = cfg
        self._history: dict[tuple[str, int], deque[float]] = defaultdict(lambda: deque(maxlen=cfg.window))
        self._consecutive = 0
        self._refused: list[str] = []  # batch ids of this run of refusals: this process's, not train state

    @property
    def must_roll_back(self) -> bool:
        return self._consecutive >= self.cfg.max_consecutive_skips

    def end_refusals(self) -> list[str]:
        """After a rollback (and its restore): the run of refused steps is over; its batches returned."""
        offenders, self._refused = self._refused, []
        self._consecutive = 0
        return offenders

    def state_dict(self) -> dict[str, Any]:
        """The windows and the run of skips as plain lists and ints, as trainer.pt holds them."""
        return {
            "history": [{"metric": name, "bucket": bucket, "values": list(values)}
                        for (name, bucket), values in sorted(self._history.items()) if values],
            "consecutive": self._consecutive,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the windows and the run of skips with a saved one (a smaller `window` keeps the newest)."""
        self._history.clear()
        for entry in state["history"]:
            self._history[(str(entry["metric"]), int(entry["bucket"]))].extend(float(v) for v in entry["values"])
        self._consecutive = int(state["consecutive"])

    def window_median(self, name: str, bucket: int) -> float | None:
        """The median of a metric's accepted values in a bucket's window; None until the spike test applies."""
        hist = self._history[(name, bucket)]
        return median(hist) if len(hist) >= self.cfg.min_history else None

    def _spike(self, name: str, bucket: int, value: float, min_ratio: float) -> bool:
        med = self.window_median(name, bucket)
        if med is None:
            return False
        mad = max(median(abs(v - med) for v in self._history[(name, bucket)]), 1e-3 * abs(med))
        return value > med + self.cfg.spike_k * mad and value > min_ratio * med

    def check(self, bucket: int, loss: float, grad_norm: float, batch_ids: Sequence[str] = ()) -> str | None:
        """The reason to skip this step, or None to apply it (and remember its values)."""
        if not self.cfg.enabled:
            return None
        reason = None
        if not math.isfinite(loss):
            reason = "nonfinite_loss"
        elif not math.isfinite(grad_norm):
            reason = "nonfinite_grad_norm"
        elif self._spike("loss", bucket, loss, self.cfg.spike_min_ratio):
            reason = "loss_spike"
        elif self.cfg.check_grad_norm and self._spike("grad_norm", bucket, grad_norm, self.cfg.grad_norm_min_ratio):
            reason = "grad_norm_spike"
        if reason is None:
            self._history[("loss", bucket)].append(loss)
            self._history[("grad_norm", bucket)].append(grad_norm)
            self._consecutive = 0
            self._refused.clear()
        else:
            self._consecutive += 1
            self._refused += batch_ids
        return reason
