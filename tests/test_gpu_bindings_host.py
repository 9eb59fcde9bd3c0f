"""The host side of the GPU bindings of tf_ctr_ops._core: they reject bad
arguments exactly as the CPU bindings do, before any device work, and size
the gradients' device workspaces.

Both build their LookupSpec / StringSpec in one place (cc/python/specs.h), so
a call the CPU core refuses is refused by the GPU launchers with the same
ValueError. These checks run on the host: they need a _core built with CUDA
(CI builds one wherever nvcc is found) but no GPU, CuPy or PyTorch. The
device pointers are never dereferenced: every call fails its argument checks
first. Skips, with the reason, where _core was built without CUDA.
"""

import numpy as np
import pytest

from core_helpers import core_or_skip, load_table_layout

core = core_or_skip(without_cuda="tf_ctr_ops._core was built without CUDA: no GPU bindings to check")

VOCAB, DIM = 10, 4
PARAMS = np.zeros((VOCAB, DIM), np.float32)
EMPTY_PARAMS = np.zeros((0, DIM), np.float32)

# (what is wrong, keyword arguments both bindings take, the table's rows)
LOOKUP_CASES = [
    ("unknown combiner", dict(combiner="max"), VOCAB),
    ("unknown id_mode", dict(id_mode="bucket"), VOCAB),
    ("unknown invalid_ids", dict(invalid_ids="drop"), VOCAB),
    ("default_id past the table", dict(default_id=VOCAB), VOCAB),
    ("default_id below -1", dict(default_id=-2), VOCAB),
    ("hash mode with no bucket", dict(id_mode="hash"), 0),
]

STRING_CASES = [
    ("unknown combiner", dict(combiner="max"), VOCAB),
    ("unknown id_mode", dict(id_mode="bucket"), VOCAB),
    ("invalid_ids the string ops lack", dict(invalid_ids="skip_padding"), VOCAB),
    ("negative num_buckets", dict(num_buckets=-1), VOCAB),
    ("delimiter over 16 bytes", dict(delimiter=b"|" * 17), VOCAB),
    ("default_id past the table", dict(default_id=VOCAB), VOCAB),
    ("hash mode with no table row", dict(id_mode="hash"), 0),
    ("mod mode with no table row", dict(id_mode="mod"), 0),
]


def _cpu_error(fn, *args, **kwargs):
    with pytest.raises(ValueError) as cpu:
        fn(*args, **kwargs)
    return str(cpu.value)


def _gpu_lookup(vocab, **kwargs):
    # Null device pointers: a call that got past its argument checks would
    # fail on them (RequirePointer), with a message none of the cases expect.
    core.gpu_embedding_lookup(0, "float32", vocab, DIM, 0, "int64", 1, 0, 0, 1, 0, 0, **kwargs)


def _gpu_string(vocab, **kwargs):
    core.gpu_string_embedding(0, "float32", vocab, DIM, 0, 0, 0, 1, 0, 0, **kwargs)


@pytest.mark.parametrize("what,kwargs,vocab", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_gpu_lookup_rejects_what_the_cpu_rejects(what, kwargs, vocab):
    params = PARAMS if vocab else EMPTY_PARAMS
    want = _cpu_error(core.embedding_lookup, params, np.zeros(1, np.int64), np.array([0, 1], np.int64), **kwargs)
    with pytest.raises(ValueError) as gpu:
        _gpu_lookup(vocab, **kwargs)
    assert str(gpu.value) == want, what
    with pytest.raises(ValueError) as grad:
        core.gpu_embedding_lookup_grad(0, "float32", vocab, DIM, 0, "int64", 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                       **kwargs)
    assert str(grad.value) == want, what


@pytest.mark.parametrize("what,kwargs,vocab", STRING_CASES, ids=[c[0] for c in STRING_CASES])
def test_gpu_string_embedding_rejects_what_the_cpu_rejects(what, kwargs, vocab):
    params = PARAMS if vocab else EMPTY_PARAMS
    want = _cpu_error(core.string_embedding, params, np.frombuffer(b"1", np.uint8), np.array([0, 1], np.int64),
                      **kwargs)
    with pytest.raises(ValueError) as gpu:
        _gpu_string(vocab, **kwargs)
    assert str(gpu.value) == want, what


# The grouped launcher's per-feature dicts have no default_id, num_buckets or invalid_ids.
GROUPED_CASES = [c for c in STRING_CASES if not {"default_id", "num_buckets", "invalid_ids"} & set(c[1])]


@pytest.mark.parametrize("what,kwargs,vocab", GROUPED_CASES, ids=[c[0] for c in GROUPED_CASES])
def test_gpu_grouped_string_embedding_names_the_feature(what, kwargs, vocab):
    """The grouped launcher prefixes the CPU's message with the feature it concerns."""
    params = PARAMS if vocab else EMPTY_PARAMS
    want = _cpu_error(core.string_embedding, params, np.frombuffer(b"1", np.uint8), np.array([0, 1], np.int64),
                      **kwargs)
    # Feature 0 is valid and needs no pointers (an empty index-mode table, batch 0).
    good = dict(vocab=0, dim=0, id_mode="index", params_ptr=0, out_ptr=0)
    bad = dict(vocab=vocab, dim=DIM, params_ptr=0, out_ptr=0, **kwargs)
    with pytest.raises(ValueError) as gpu:
        core.gpu_multi_string_embedding([good, bad], "float32", 0, 0, 0, 0, 0, 0)
    assert str(gpu.value) == "features[1]: " + want, what


@pytest.mark.parametrize("layout,batch", [
    (dict(first_string=-1), 2), (dict(num_strings=3), 2), (dict(num_strings=-1), 2),
    (dict(out_rows=3, num_strings=2), 2), (dict(out_rows=-1), 2), (dict(out_stride=DIM - 1), 2)])
def test_gpu_grouped_feature_layout_is_checked(layout, batch):
    """A feature's strings must fit the launch's rows, its output rows its
    strings, and its rows their stride: refused before any device work."""
    feature = dict(vocab=VOCAB, dim=DIM, params_ptr=1, out_ptr=1, **layout)
    with pytest.raises(ValueError, match="features\\[0\\]: needs 0 <= first_string"):
        core.gpu_multi_string_embedding([feature], "float32", batch, 1, 1, 1, 1 << 20, 1)


@pytest.mark.parametrize("what,kwargs", [("unknown eviction", dict(eviction="fifo")),
                                         ("admit_after below 1", dict(admit_after=0))])
def test_gpu_hash_table_insert_rejects_what_the_cpu_rejects(what, kwargs):
    # One place builds both bindings' insert rules (MakeInsertRules): the same
    # ValueError, raised before any pointer is read.
    table = load_table_layout().empty_table_array(16, 8)
    want = _cpu_error(core.hash_table_find, table, np.zeros(1, np.int64), 8, insert=True, **kwargs)
    with pytest.raises(ValueError) as gpu:
        core.gpu_hash_table_find_or_insert(1, table.shape[0], 8, 1, 1, 1, 1, 1, 1, **kwargs)
    assert str(gpu.value) == want, what


def test_gpu_bindings_reject_unknown_table_dtypes():
    # Empty shapes need only the offsets and status pointers; 1 stands in for
    # them, and the dtype is refused before anything is launched or read.
    with pytest.raises(ValueError, match="params_dtype must be"):
        core.gpu_embedding_lookup(0, "int8", 0, 0, 0, "int64", 0, 0, 1, 0, 0, 1)
    with pytest.raises(ValueError, match="params_dtype must be"):
        core.gpu_string_embedding(0, "int8", 0, 0, 0, 0, 0, 0, 0, 1, id_mode="index")


@pytest.mark.parametrize("bags", [0, 1, 7, 1000, 123457])
def test_gradient_workspaces_hold_counts_offsets_and_scan_scratch(bags):
    """Both gradients lay out their workspace alike: per-bag counts, bags + 1
    offsets and CUB's scan scratch, each 256-byte aligned as CUB expects."""
    ids = core.gpu_embedding_lookup_grad_workspace_bytes(bags)
    assert core.gpu_string_embedding_grad_workspace_bytes(bags) == ids

    def align(n):
        return -(-n // 256) * 256

    assert ids % 256 == 0
    assert ids >= align(8 * bags) + align(8 * (bags + 1)) + 256
