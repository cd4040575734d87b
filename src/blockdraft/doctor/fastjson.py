"""Vectorised reading of our own flat step records straight from the log's bytes.

`json.loads` costs ~45 us a line on the 2-core dev box, too slow for a million-step log. Our
trainer writes step records as flat JSON objects starting with `{"kind": "step"`, so numpy can find
every `"key":` and the value after it for all lines at once, and parse the numbers in bulk.
Long decimals are read to their first 10 characters (17 for `time`): 5+ significant digits, which
is all a diagnosis needs and halves the conversion time. Any line this does not fully understand
(strings, nested objects, odd layout, a truncated tail) is handed back for `json.loads`; a few
lines of each layout are re-parsed with `json` as a check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

PREFIXES = (b'{"kind": "step"', b'{"kind":"step"')
NAN_WATCH = ("loss", "grad_norm", "acc", "lr", "tau_est", "kl")
NAN_SUFFIX = "!nan"
# Our writer stores NaN/Inf as null and lists the fields here; such (rare) lines go through json.
FLAGGED = "nonfinite"
CHUNK_BYTES = 32 << 20
DEFAULT_KEEP = 10
KEEP_CHARS = {"time": 17}
MAX_VALUE_WIDTH = 40
# Columns few checks read: kept as byte spans and parsed on first use (see parse_spans).
LAZY = ("tau_est", "seq_len_max", "tok_per_s")
SPAN_START, SPAN_END = "@start", "@end"
QUOTE, COLON, SPACE, COMMA, CR, BRACE_OPEN, BRACE_CLOSE = 34, 58, 32, 44, 13, 123, 125
_HASH_WEIGHTS = (np.random.default_rng(12345).integers(1, 2**62, size=256, dtype=np.int64) | 1).astype(np.uint64)


@dataclass
class FastRows:
    """Step rows parsed without json: columns plus the micro-batch bucket lists."""

    lines: np.ndarray
    cols: dict[str, np.ndarray]
    single_bucket: np.ndarray
    multi_buckets: list[list[int]] | None
    acc_per_pos: np.ndarray | None


def split_step_lines(data: bytes, mapping: dict[str, str]) -> tuple[FastRows | None, list[tuple[int, bytes]], int]:
    """Parse the step lines we can; return them, the other lines (line number, bytes) and the line count."""
    from blockdraft.doctor.records import LIST_FIELDS, STEP_FIELDS

    rename = {theirs: ours for ours, theirs in mapping.items()}
    wanted = {name: name for name in STEP_FIELDS + LIST_FIELDS}
    for theirs, ours in rename.items():
        wanted[theirs] = ours
    for ours in mapping:
        if mapping[ours] != ours:
            wanted.pop(ours, None)

    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = _newlines(buf)
    starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
    ends = np.concatenate([newlines, [len(buf)]]).astype(np.int64)
    if len(starts) and starts[-1] >= len(buf):
        starts, ends = starts[:-1], ends[:-1]
    line_count = len(starts)
    if not line_count:
        return None, [], 0
    candidate = _prefix_match(buf, starts, ends)
    slow_idx = [np.flatnonzero(~candidate)]
    parts: list[_ChunkResult] = []
    cand_idx = np.flatnonzero(candidate)
    if len(cand_idx):
        bounds = np.searchsorted(starts[cand_idx], np.arange(CHUNK_BYTES, len(buf) + CHUNK_BYTES, CHUNK_BYTES))
        bounds = np.unique(np.concatenate([[0], bounds, [len(cand_idx)]]))
        tasks = [cand_idx[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
        parts = [_parse_chunk(buf, data, starts, ends, lines, wanted) for lines in tasks]
        slow_idx += [p.rejected for p in parts]
    slow_lines = np.sort(np.concatenate(slow_idx))
    slow = [(int(i), data[starts[i] : ends[i]]) for i in slow_lines if ends[i] > starts[i]]
    if not parts or not any(len(p.lines) for p in parts):
        return None, slow, line_count
    return _merge(parts), slow, line_count


def _newlines(buf: np.ndarray) -> np.ndarray:
    """Positions of every newline, scanned in cache-sized slices (one huge temporary costs more)."""
    step = 4 << 20
    found = [np.flatnonzero(buf[s : s + step] == 10) + s for s in range(0, len(buf), step)]
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _prefix_match(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    width = max(len(p) for p in PREFIXES)
    head = gather(buf, starts, width)
    match = np.zeros(len(starts), dtype=bool)
    for prefix in PREFIXES:
        n = len(prefix)
        match |= ((ends - starts) > n) & (head[:, :n] == np.frombuffer(prefix, dtype=np.uint8)).all(axis=1)
    return match


@dataclass
class _ChunkResult:
    lines: np.ndarray
    cols: dict[str, np.ndarray]
    single_bucket: np.ndarray
    multi: dict[int, list[int]]
    rejected: np.ndarray
    acc_tail: list[bytes]


def _parse_chunk(
    buf: np.ndarray, data: bytes, starts: np.ndarray, ends: np.ndarray, lines: np.ndarray, wanted: dict[str, str]
) -> _ChunkResult:
    s0, s1 = int(starts[lines[0]]), int(ends[lines[-1]])
    quotes = np.flatnonzero(buf[s0:s1] == QUOTE) + s0
    closes = np.flatnonzero(buf[np.minimum(quotes + 1, len(buf) - 1)] == COLON)
    keys_end = quotes[closes]
    keys_open = quotes[np.maximum(closes - 1, 0)]
    key_len = keys_end - keys_open - 1
    key_hash = (key_len * 1_000_003 + buf[keys_open + 1].astype(np.int64) * 1009 + buf[keys_end - 1]).astype(np.uint64)
    offsets = np.searchsorted(keys_end, starts[lines])
    counts = np.searchsorted(keys_end, ends[lines]) - offsets

    accepted: list[np.ndarray] = []
    col_parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    bucket_parts: list[tuple[np.ndarray, np.ndarray]] = []
    multi: dict[int, list[int]] = {}
    acc_tail: list[bytes] = []
    rejected = [lines[counts == 0]]
    for width in np.unique(counts[(counts > 0) & (counts <= len(_HASH_WEIGHTS))]):
        rows = np.flatnonzero(counts == width)
        idx = offsets[rows, None] + np.arange(width)
        hashes = key_hash[idx]
        same = (hashes == hashes[0]).all(axis=1)
        signature = np.where(same, np.uint64(0), (hashes * _HASH_WEIGHTS[:width]).sum(axis=1) | np.uint64(1))
        for sig in np.unique(signature):
            grp = rows[signature == sig]
            gidx = idx[signature == sig]
            result = _parse_group(buf, data, ends[lines[grp]], keys_open[gidx], keys_end[gidx], wanted)
            if result is None:
                rejected.append(lines[grp])
                continue
            ok, cols, single, grp_multi, tail = result
            rejected.append(lines[grp][~ok])
            good_lines = lines[grp][ok]
            accepted.append(good_lines)
            for name, values in cols.items():
                col_parts.setdefault(name, []).append((good_lines, values[ok]))
            bucket_parts.append((good_lines, single[ok]))
            multi.update({int(lines[grp][r]): v for r, v in grp_multi.items() if ok[r]})
            acc_tail = tail or acc_tail
    rejected.append(lines[counts > len(_HASH_WEIGHTS)])
    good = np.sort(np.concatenate(accepted)) if accepted else np.zeros(0, dtype=np.int64)
    cols = {name: _scatter(good, parts, np.nan, np.float64) for name, parts in col_parts.items()}
    single_bucket = _scatter(good, bucket_parts, -1, np.int64)
    return _ChunkResult(good, cols, single_bucket, multi, np.concatenate(rejected), acc_tail)


def _scatter(lines: np.ndarray, parts: list[tuple[np.ndarray, np.ndarray]], fill: float, dtype: type) -> np.ndarray:
    if len(parts) == 1 and len(parts[0][0]) == len(lines):
        return parts[0][1].astype(dtype, copy=False)
    out = np.full(len(lines), fill, dtype=dtype)
    for part_lines, values in parts:
        out[np.searchsorted(lines, part_lines)] = values
    return out


def _parse_group(
    buf: np.ndarray,
    data: bytes,
    line_ends: np.ndarray,
    keys_open: np.ndarray,
    keys_end: np.ndarray,
    wanted: dict[str, str],
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, dict[int, list[int]], list[bytes]] | None:
    """Parse rows sharing one key layout; None when the layout is not a flat step record."""
    names = [
        data[int(a) + 1 : int(b)].decode("utf-8", "replace") for a, b in zip(keys_open[0], keys_end[0], strict=True)
    ]
    if not names or names[0] != "kind" or len(set(names)) != len(names) or FLAGGED in names:
        return None
    n, width = keys_open.shape
    value_start = keys_end + 2
    value_start += buf[np.minimum(value_start, len(buf) - 1)] == SPACE
    value_end = np.empty_like(value_start)
    sep = keys_open[:, 1:] - 1
    sep -= buf[sep] == SPACE
    value_end[:, :-1] = sep
    last = line_ends - 1
    last -= buf[last] == CR
    value_end[:, -1] = last
    ok = (buf[sep] == COMMA).all(axis=1) & (buf[last] == BRACE_CLOSE)
    first_char = buf[np.minimum(value_start, len(buf) - 1)]
    nested = (first_char == BRACE_OPEN) | (first_char == QUOTE)
    nested[:, 0] = False
    ok &= ~nested.any(axis=1)
    cols: dict[str, np.ndarray] = {}
    single = np.full(n, -1, dtype=np.int64)
    multi: dict[int, list[int]] = {}
    tail: list[bytes] = []
    for j, name in enumerate(names):
        ours = wanted.get(name)
        if ours is None or j == 0:
            continue
        vs, ve = value_start[:, j], value_end[:, j]
        if ours == "buckets":
            single, multi = _buckets(buf, data, vs, ve)
        elif ours == "acc_per_pos":
            tail = [data[int(a) : int(b)] for a, b in zip(vs[-500:], ve[-500:], strict=True)]
        else:
            if ours in LAZY:
                cols[ours + SPAN_START], cols[ours + SPAN_END] = vs.astype(np.float64), ve.astype(np.float64)
            else:
                cols[ours] = _numbers(buf, data, vs, ve, KEEP_CHARS.get(ours, DEFAULT_KEEP))
            if ours in NAN_WATCH:
                cols[ours + NAN_SUFFIX] = (first_char[:, j] == 78).astype(np.float64)
    if not _spot_check(data, line_ends, ok, cols, names, wanted):
        return None
    return ok, cols, single, multi, tail


def _numbers(buf: np.ndarray, data: bytes, vs: np.ndarray, ve: np.ndarray, keep: int) -> np.ndarray:
    """JSON numbers (and true/false/null/NaN/Infinity) from byte spans, converted in bulk by numpy.

    Only the first `keep` characters of a long decimal are converted (5+ significant digits for
    values >= 1e-4; strtod time grows with length); a value in e-notation is always read whole.
    """
    widths = ve - vs
    width = int(min(max(int(widths.max(initial=1)), 1), keep))
    chars = gather(buf, vs, width)
    first = chars[:, 0].copy()
    letter = first >= 65
    if letter.all():
        return np.where(first == 116, 1.0, np.where(first == 102, 0.0, np.nan))
    np.multiply(chars, np.arange(width)[None, :] < widths[:, None], out=chars)
    chars[letter] = 48
    long_rows = np.flatnonzero((widths > width) & ~letter)
    exact_rows = long_rows[:0]
    if len(long_rows):
        tail = np.take(buf, ve[long_rows, None] - np.arange(3, 6), mode="clip")
        exact_rows = long_rows[((tail == 101) | (tail == 69)).any(axis=1) | (widths[long_rows] > MAX_VALUE_WIDTH)]
        chars[exact_rows] = 48
    if width <= 12 and not ((chars == 46) | (chars == 101) | (chars == 69)).any():
        values = _integers(chars).astype(np.float64)
    else:
        values = _strtod(chars)
    if len(exact_rows):
        values[exact_rows] = _numbers(buf, data, vs[exact_rows], ve[exact_rows], MAX_VALUE_WIDTH)
    if letter.any():
        second = np.take(buf, vs + 1, mode="clip")
        values[first == 116] = 1.0
        values[first == 102] = 0.0
        values[(first == 110) | (first == 78)] = np.nan
        values[first == 73] = np.inf
        values[(first == 45) & (second == 73)] = -np.inf
    values[widths <= 0] = np.nan
    return values


def parse_spans(data: bytes, starts: np.ndarray, ends: np.ndarray, name: str) -> np.ndarray:
    """Values of a lazy column from its byte spans (float positions, as stored among the columns)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    return _numbers(buf, data, starts.astype(np.int64), ends.astype(np.int64), KEEP_CHARS.get(name, DEFAULT_KEEP))


def gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Copy `width` bytes from each start (zero past the end): row copies of a sliding-window view."""
    out = np.zeros((len(starts), width), dtype=np.uint8)
    if len(buf) < width or not len(starts):
        return out
    inside = starts <= len(buf) - width
    out[inside] = np.lib.stride_tricks.sliding_window_view(buf, width)[starts[inside]]
    for r in np.flatnonzero(~inside):
        tail = buf[int(starts[r]) :]
        out[r, : len(tail)] = tail
    return out


def _strtod(chars: np.ndarray) -> np.ndarray:
    try:
        return chars.view(f"S{chars.shape[1]}").ravel().astype(np.float64)
    except ValueError:
        return np.array([_safe_float(bytes(row).rstrip(b"\0")) for row in chars], dtype=np.float64)


def _safe_float(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _integers(chars: np.ndarray) -> np.ndarray:
    """Zero-padded ASCII integers to int64, a digit column at a time (cheaper than string conversion)."""
    value = np.zeros(len(chars), dtype=np.int64)
    for j in range(chars.shape[1]):
        col = chars[:, j]
        is_digit = (col >= 48) & (col <= 57)
        value = np.where(is_digit, value * 10 + (col.astype(np.int64) - 48), value)
    return np.where(chars[:, 0] == 45, -value, value)


def _buckets(buf: np.ndarray, data: bytes, vs: np.ndarray, ve: np.ndarray) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Bucket ids per row; one-element lists are read in bulk, longer ones with json."""
    widths = ve - vs
    single = np.full(len(vs), -1, dtype=np.int64)
    digit = buf[np.minimum(vs + 1, len(buf) - 1)]
    simple = (widths == 3) & (digit >= 48) & (digit <= 57)
    single[simple] = digit[simple].astype(np.int64) - 48
    multi: dict[int, list[int]] = {}
    for r in np.flatnonzero(~simple & (widths > 2)):
        try:
            items = json.loads(data[int(vs[r]) : int(ve[r])])
        except ValueError:
            continue
        if isinstance(items, list):
            multi[int(r)] = [int(v) for v in items if isinstance(v, int | float) and not isinstance(v, bool)]
    return single, multi


def _spot_check(
    data: bytes,
    line_ends: np.ndarray,
    ok: np.ndarray,
    cols: dict[str, np.ndarray],
    names: list[str],
    wanted: dict[str, str],
) -> bool:
    """Re-parse a few rows with json; any disagreement sends the whole layout to the json path."""
    rows = np.flatnonzero(ok)
    if not len(rows):
        return True
    picks = np.unique(rows[np.linspace(0, len(rows) - 1, num=min(4, len(rows))).astype(int)])
    for r in picks:
        end = int(line_ends[r])
        start = data.rfind(b"\n", 0, end) + 1
        try:
            rec = json.loads(data[start:end])
            for name in names:
                ours = wanted.get(name)
                if ours not in cols:
                    continue
                value = rec.get(name)
                got = float(cols[ours][r])
                expected = float("nan") if value is None else float(value)
                same = got == expected or (got != got and expected != expected)
                if not (same or abs(got - expected) <= 1e-4 * abs(expected)):
                    return False
        except (ValueError, TypeError):
            return False
    return True


def _merge(parts: list[_ChunkResult]) -> FastRows:
    lines = np.concatenate([p.lines for p in parts])
    names = sorted({name for p in parts for name in p.cols})
    cols = {name: np.concatenate([p.cols.get(name, np.full(len(p.lines), np.nan)) for p in parts]) for name in names}
    single = np.concatenate([p.single_bucket for p in parts])
    multi_rows: dict[int, list[int]] = {}
    for p in parts:
        multi_rows.update(p.multi)
    multi_buckets = None
    if multi_rows:
        where = {int(line): i for i, line in enumerate(lines)}
        multi_buckets = [[int(b)] if b >= 0 else [] for b in single]
        for line, items in multi_rows.items():
            multi_buckets[where[line]] = items
    acc_tail = next((p.acc_tail for p in reversed(parts) if p.acc_tail), [])
    profiles = []
    for raw in acc_tail:
        try:
            profiles.append(json.loads(raw))
        except ValueError:
            continue
    acc = None
    good = [p for p in profiles if isinstance(p, list) and p]
    if good:
        width = len(good[-1])
        same = [p for p in good if len(p) == width]
        acc = np.nanmean(np.array(same, dtype=np.float64), axis=0)
    return FastRows(lines=lines, cols=cols, single_bucket=single, multi_buckets=multi_buckets, acc_per_pos=acc)
