"""`blockdraft bench`: the training hot path on a target of a named shape, with random weights."""
