"""The samples a bench length profile measures, and the profiles there are.

  full, mix  synthetic (`synthetic.SyntheticDataset`): random ids at a profile's lengths
  data       the user's own training files (`--data`), tokenised with the target folder's tokenizer
             through the run's on-disk cache, as `blockdraft train` reads them: their real ids,
             lengths and answer masks, so the rate is the one their run will see
`run_profile` (ours) and bench/peer_nemo.py's `measure_mode` (NeMo's) both take theirs from
`bench_dataset`, so a ratio of the two compares the same samples.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockdraft.bench.synthetic import SyntheticDataset
from blockdraft.data.summary import length_stats
from blockdraft.errors import UserError

if TYPE_CHECKING:
    from blockdraft.config import Config
    from blockdraft.data.cache import Samples, TokenizedDataset
    from blockdraft.data.report import DataReport

PROFILES = ("full", "mix", "data")
_OVERRIDE = re.compile(r"^\w+(\.\w+)+=")  # what a dotted override looks like: a --data list swallows them


def bench_profiles(args: argparse.Namespace) -> list[str]:
    """The profiles to measure: `--lengths` as given; without it, `data` alone when `--data` names files
    (what a user who brings them wants timed), else `full` and `mix`."""
    given = args.lengths if args.lengths is not None else ("data" if args.data else "full,mix")
    profiles = [p.strip() for p in given.split(",") if p.strip()]
    if not profiles or any(p not in PROFILES for p in profiles):
        raise UserError(f"--lengths takes {', '.join(PROFILES[:-1])} and/or {PROFILES[-1]}, not {args.lengths!r}")
    if "data" in profiles and not args.data:
        raise UserError("--lengths data measures your training files: name them with --data FILE [FILE ...]")
    if args.data and "data" not in profiles:
        raise UserError(f"--data is measured as the data profile: add it to --lengths (e.g. {given},data)")
    return profiles


@dataclass
class UserData:
    """The `--data` files, tokenised: the samples of the `data` profile and what reading them found."""

    dataset: TokenizedDataset
    report: DataReport

    def describe(self) -> dict[str, Any]:
        """The report's `env.data`: which files and cache were measured, the lines skipped (as training
        skips them) and the length mix, so a reader knows what the rates are of."""
        report = self.report
        return {**report.as_record(), "samples_skipped": report.samples_total - report.samples_used,
                "lengths": length_stats(self.dataset.lengths)}


def prepare_user_data(args: argparse.Namespace, cfg: Config, tokenizer: Any | None, vocab_size: int) -> UserData | None:
    """The `--data` files through `prepare_dataset` with the bench's data settings (`data.max_len` =
    `--seq-len`, overrides such as `data.format`), or None without `--data`. Before any model is built,
    a user's mistake is one line: no tokenizer to read the files with, a missing file, no usable
    sample, or ids past the target's embedding table."""
    from blockdraft.data.cache import prepare_dataset

    if not args.data:
        return None
    swallowed = [f for f in args.data if _OVERRIDE.match(f) and not Path(f).exists()]
    if swallowed:
        raise UserError(f"--data took {swallowed[0]!r} for a file: put dotted overrides before --data, or end its "
                        "files with --")
    if tokenizer is None:
        raise UserError("--data is tokenised with the target's tokenizer: give --target a model folder that has "
                        "one (tokenizer.json), not a --target-shape")
    dataset, report = prepare_dataset(cfg.data, tokenizer, files=list(args.data))
    if len(tokenizer) > vocab_size:  # the tokenizer can give ids the table lacks: do these files hold any?
        top = int(dataset.ids.max())
        if top >= vocab_size:
            raise UserError(f"--data: these files hold token id {top} (the tokenizer of {args.target}), outside the "
                            f"target's embedding table ({vocab_size} rows: its config.json vocab_size)")
    return UserData(dataset, report)


def bench_dataset(profile: str, args: argparse.Namespace, vocab_size: int, grad_accum: int,
                  data: UserData | None) -> Samples:
    """A profile's samples. Synthetic ones are drawn four times over what the measured updates take, so
    no sample repeats; the user's files are what they are, and a sampler cycles their epochs as
    training does."""
    if profile == "data":
        assert data is not None, "bench_profiles asks for --data with the data profile"
        return data.dataset
    count = max(4096, (args.steps + args.warmup + 2) * args.micro_batch * grad_accum * 4)
    return SyntheticDataset(profile, args.seq_len, vocab_size, count, median=args.mix_median, sigma=args.mix_sigma)
