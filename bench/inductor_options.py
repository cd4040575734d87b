"""`blockdraft` with TorchInductor settings set first, to measure what an inductor option buys.

  BD_INDUCTOR='{"max_autotune_gemm": true}' python bench/inductor_options.py bench --target-shape qwen3-8b ...

$BD_INDUCTOR is a JSON object of `torch._inductor.config` names (dotted for nested ones, such as
`triton.cudagraphs`) and values; the arguments after it are the `blockdraft` command line.
"""

from __future__ import annotations

import json
import os
import sys

import torch._inductor.config as inductor_config

from blockdraft.cli import main


def apply(settings: dict[str, object]) -> None:
    """Set each dotted `torch._inductor.config` name, and say so on stderr."""
    for name, value in settings.items():
        *parents, leaf = name.split(".")
        section = inductor_config
        for parent in parents:
            section = getattr(section, parent)
        if not hasattr(section, leaf):
            print(f"inductor_options: torch._inductor.config has no setting {name!r}", file=sys.stderr)
            sys.exit(2)
        setattr(section, leaf, value)
        print(f"inductor_options: {name} = {value!r}", file=sys.stderr)


if __name__ == "__main__":
    apply(json.loads(os.environ.get("BD_INDUCTOR", "{}")))
    sys.exit(main(sys.argv[1:]))
