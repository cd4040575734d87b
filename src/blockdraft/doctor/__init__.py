"""`blockdraft doctor`: diagnose a training run from its log.jsonl, offline or live."""
