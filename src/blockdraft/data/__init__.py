"""The data path: chat files -> tokens and loss masks (cached) -> bucketed batches -> prefetch queue."""
