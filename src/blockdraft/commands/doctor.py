"""`blockdraft doctor RUN_DIR_OR_LOG`: diagnose a run from its log.jsonl (numpy, rich and matplotlib load in `run`)."""

from __future__ import annotations

import argparse

from blockdraft.doctor.findings import SEVERITIES
from blockdraft.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="RUN_DIR_OR_LOG",
                        help="a run folder or log: blockdraft log.jsonl, any JSONL, HF trainer_state.json or "
                        "checkpoint folder, W&B CSV or wandb-history.jsonl, TensorBoard event files")
    parser.add_argument("--config", metavar="FILE", help="the run's config (YAML/JSON, blockdraft's or another "
                        "trainer's) so the settings checks can run")
    parser.add_argument("--json", action="store_true", help="print the findings as a JSON list instead of a table")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with charts")
    parser.add_argument("--fail-on", choices=SEVERITIES, metavar="LEVEL",
                        help="exit 1 if any finding is at least this severe (info|warning|error)")
    parser.add_argument("--map", dest="mapping", metavar="OURS=THEIRS,...",
                        help="read a foreign log: e.g. loss=train/loss,acc=train/acc,step=global_step")
    parser.add_argument("--follow", action="store_true",
                        help="keep watching a growing log and print new findings as they appear")


def run(args: argparse.Namespace) -> int:
    from blockdraft.doctor.config_file import read_config
    from blockdraft.doctor.fields import parse_mapping
    from blockdraft.doctor.findings import at_least

    mapping = parse_mapping(args.mapping)
    settings, read = read_config(args.config) if args.config else (None, {})
    if args.follow:
        from blockdraft.doctor.follow import follow

        findings = follow(args.path, mapping, as_json=args.json, settings=settings)
    else:
        findings = _offline(args, mapping, settings, read)
    if args.fail_on and any(at_least(f.severity, args.fail_on) for f in findings):
        return 1
    return 0


def _offline(args: argparse.Namespace, mapping: dict[str, str], settings: dict | None, read: dict[str, str]) -> list:
    import json

    from blockdraft.doctor.console import print_report
    from blockdraft.doctor.detectors import diagnose
    from blockdraft.doctor.readers import load_run

    run = load_run(args.path, mapping)
    if settings is not None:
        from blockdraft.doctor.config_file import merge

        run.config = merge(run.config, settings)
        run.config_source, run.config_read = args.config, read
    findings = diagnose(run)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        print_report(run, findings)
    if args.html:
        from blockdraft.doctor.report import write_report

        try:
            path = write_report(run, findings, args.html)
        except OSError as exc:
            raise UserError(f"cannot write {args.html}: {exc.strerror}") from None
        if not args.json:
            print(f"report: {path}")
    return findings
