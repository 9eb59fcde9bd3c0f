"""The README's op snippets run as printed: a user copies them first."""

import pathlib
import re

import numpy as np
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(section):
    """The ```python blocks under the README heading `section` (up to the next heading of its level or above)."""
    text = (ROOT / "README.md").read_text()
    level = re.match(r"#+", section).group(0)
    start = text.index(f"\n{section}\n")
    end = re.compile(rf"\n#{{1,{len(level)}}} ").search(text, start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end.start() if end else None], re.S)


def test_the_ops_and_string_embedding_snippets_run():
    blocks = python_blocks("## Ops")
    assert len(blocks) >= 2, "the Ops section's snippets moved"
    scope = {}
    exec(compile(blocks[0], "README.md#ops", "exec"), scope)
    # The StringEmbedding snippet names features and tables it does not make.
    scope.update(history=tf.constant(["1,2", "", "3"]), t1=tf.random.normal([64, 8]), t2=tf.random.normal([10, 4]))
    exec(compile(blocks[1], "README.md#stringembedding", "exec"), scope)
    assert np.isfinite(scope["tco"].string_embedding(scope["genres"], scope["table"], delimiter="|").numpy()).all()
