"""The data path: chat files -> tokens and loss masks (cached) -> bucketed batches -> prefetch queue.

Public names are loaded on first use, so `blockdraft data --help` and the other verbs that import
this package do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "prepare_dataset": "blockdraft.data.cache",
    "TokenizedDataset": "blockdraft.data.cache",
    "DataReport": "blockdraft.data.report",
    "BatchSampler": "blockdraft.data.batching",
    "PlannedBatch": "blockdraft.data.batching",
    "Prefetcher": "blockdraft.data.prefetch",
    "Batch": "blockdraft.data.prefetch",
    "data_record": "blockdraft.data.summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blockdraft.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
