"""The verbs' tests use the data tests' tokenizer folder and the evaluate tests' tiny drafter."""

from tests.data.conftest import qwen_dir, qwen_tok  # noqa: F401
from tests.evaluate.conftest import tiny_pair  # noqa: F401
