"""What reading and tokenising a dataset found: counts, skip reasons and where the bad lines are."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FIRST_LINES_KEPT = 5


@dataclass
class DataReport:
    """Counts for one prepared dataset. samples_total = samples_used + sum(skipped.values())."""

    files: list[str] = field(default_factory=list)
    samples_total: int = 0
    samples_used: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    first_bad_lines: dict[str, list[str]] = field(default_factory=dict)
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    cache_path: str = ""
    cache_hit: bool = False

    def skip(self, reason: str, where: str) -> None:
        self.samples_total += 1
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        lines = self.first_bad_lines.setdefault(reason, [])
        if len(lines) < FIRST_LINES_KEPT:
            lines.append(where)

    def use(self, length: int, loss_tokens: int, truncated: bool) -> None:
        self.samples_total += 1
        self.samples_used += 1
        self.tokens += length
        self.loss_tokens += loss_tokens
        self.truncated += int(truncated)

    def skip_summary(self) -> str:
        """One line for an error message: `12 malformed_json (first: a.jsonl:3), ...`."""
        parts = [
            f"{n} {reason} (first: {', '.join(self.first_bad_lines.get(reason, [])[:2])})"
            for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1])
        ]
        return "; ".join(parts) or "no records"

    def as_record(self) -> dict[str, Any]:
        record = asdict(self)  # a deep copy, in field order
        return {**record, "skipped": dict(sorted(record["skipped"].items())),
                "first_bad_lines": dict(sorted(record["first_bad_lines"].items()))}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> DataReport:
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})
