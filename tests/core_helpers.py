"""What the tests of the framework-free core (tf_ctr_ops._core) share, with
TensorFlow never imported: loading the core, device buffers on CuPy or
PyTorch (the GPU core tests), and the host encodings of 16-bit tables.

The GPU test modules call `core_or_skip()` and `backend_or_skip()` at import,
so a machine without the core, a CUDA build or a GPU reports them skipped
with the reason. The fuzz harness (tests/fuzz/fuzz_core.py) uses
`load_core()` with its own folders first.
"""

import importlib.machinery
import importlib.util
import os
import sys

import numpy as np

# Relative tolerance per table dtype, applied against the largest reference
# value too: CPU and GPU add in different orders (the GPU sums pairwise), and
# 16-bit outputs may round to neighbouring values.
TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 1.6e-2}


# ---------------------------------------------------------------------------
# The core.


def _package_folders():
    spec = importlib.util.find_spec("tf_ctr_ops")
    return list(spec.submodule_search_locations) if spec is not None and spec.submodule_search_locations else []


def load_core(first=(), last=()):
    """tf_ctr_ops._core without importing the package (and so TensorFlow):
    the first `_core` extension found in the folders `first`, the package's
    folders, then `last`. Raises ImportError, naming where it looked, when
    there is none."""
    if "tf_ctr_ops._core" in sys.modules:
        return sys.modules["tf_ctr_ops._core"]
    searched = list(first) + _package_folders() + list(last)
    for folder in searched:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_core" + suffix)
            if os.path.exists(path):
                core_spec = importlib.util.spec_from_file_location("tf_ctr_ops._core", path)
                module = importlib.util.module_from_spec(core_spec)
                core_spec.loader.exec_module(module)
                sys.modules["tf_ctr_ops._core"] = module
                return module
    raise ImportError(f"tf_ctr_ops._core is not built (looked in {searched}; run the package build first)")


def load_table_layout():
    """tf_ctr_ops/table_layout.py (the hash table's NumPy layout) without
    importing the package, and so TensorFlow."""
    if "tf_ctr_ops.table_layout" in sys.modules:
        return sys.modules["tf_ctr_ops.table_layout"]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tf_ctr_ops", "table_layout.py")
    spec = importlib.util.spec_from_file_location("tf_ctr_ops.table_layout", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["tf_ctr_ops.table_layout"] = module
    return module


def table_by_key(table, capacity):
    """What a hash table holds, whatever slots its keys landed in (a parallel
    insert may place keys of one probe run in another order): the header,
    the free stack, and each occupied slot's (key, entry, last_seen, count)
    sorted by key."""
    layout = load_table_layout()
    num_slots = table.shape[0] - layout.HEADER_ROWS - layout.free_list_rows(capacity)
    slots = table[layout.HEADER_ROWS:layout.HEADER_ROWS + num_slots].reshape(-1)
    pairs, stats = slots[:2 * num_slots].reshape(-1, 2), slots[2 * num_slots:].reshape(-1, 2)
    used = pairs[:, 1] != layout.EMPTY_ENTRY
    contents = np.concatenate([pairs[used], stats[used]], axis=1)
    header = table[:layout.HEADER_ROWS].reshape(-1)
    free = table[layout.HEADER_ROWS + num_slots:].reshape(-1)[:header[layout.FREE_COUNT]]
    return header.copy(), free.copy(), contents[np.argsort(contents[:, 0], kind="stable")]


def assert_same_table(got, want, capacity, err_msg=""):
    """Two tables hold the same keys, rows, stats, header and free stack."""
    for part, a, b in zip(("header", "free stack", "slots by key"), table_by_key(got, capacity),
                          table_by_key(want, capacity)):
        np.testing.assert_array_equal(a, b, err_msg=f"{part} {err_msg}")


def core_or_skip(*needed, without_cuda="no CUDA device: tf_ctr_ops._core was built without CUDA"):
    """The core built with CUDA and the named bindings, else a module-level
    skip (`without_cuda` is the reason given for a core without CUDA)."""
    import pytest

    try:
        core = load_core()
    except ImportError as e:
        pytest.skip(str(e), allow_module_level=True)
    if not getattr(core, "has_cuda", False):
        pytest.skip(without_cuda, allow_module_level=True)
    for name in needed:
        if not hasattr(core, name):
            pytest.skip(f"tf_ctr_ops._core has no {name}", allow_module_level=True)
    return core


# ---------------------------------------------------------------------------
# Device memory through CuPy or PyTorch.


class CupyBackend:
    name = "CuPy"

    def __init__(self, cp):
        self.cp = cp

    def zeros(self, nbytes):
        return self.cp.zeros(nbytes, dtype=self.cp.uint8)

    def address(self, storage):
        return int(storage.data.ptr)

    def copy_in(self, storage, offset, data):
        storage[offset:offset + data.size] = self.cp.asarray(data)

    def copy_out(self, storage, offset, nbytes):
        return self.cp.asnumpy(storage[offset:offset + nbytes])

    def synchronize(self):
        self.cp.cuda.Device().synchronize()


class TorchBackend:
    name = "PyTorch"

    def __init__(self, torch):
        self.torch = torch

    def zeros(self, nbytes):
        return self.torch.zeros(nbytes, dtype=self.torch.uint8, device="cuda")

    def address(self, storage):
        return int(storage.data_ptr())

    def copy_in(self, storage, offset, data):
        storage[offset:offset + data.size].copy_(self.torch.from_numpy(data.copy()))

    def copy_out(self, storage, offset, nbytes):
        return storage[offset:offset + nbytes].cpu().numpy()

    def synchronize(self):
        self.torch.cuda.synchronize()


def find_backend():
    """(a backend on a reachable GPU or None, the reasons the others failed)."""
    reasons = []
    try:
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return CupyBackend(cupy), reasons
            reasons.append("CuPy sees no GPU")
        except Exception as e:  # no driver, or no device
            reasons.append(f"CuPy: {e}")
    except ImportError:
        reasons.append("CuPy is not installed")
    try:
        import torch

        if torch.cuda.is_available():
            return TorchBackend(torch), reasons
        reasons.append("PyTorch sees no GPU")
    except ImportError:
        reasons.append("PyTorch is not installed")
    return None, reasons


def backend_or_skip():
    import pytest

    backend, reasons = find_backend()
    if backend is None:
        pytest.skip("no CUDA device: " + "; ".join(reasons), allow_module_level=True)
    return backend


class Buffer:
    """Device bytes; `ptr` may sit `offset` bytes into the allocation, to test
    misaligned tables, outputs and byte buffers."""

    def __init__(self, backend, nbytes, offset=0):
        self.backend, self.nbytes, self.offset = backend, nbytes, offset
        # At least one byte, so every buffer has a real address.
        self.storage = backend.zeros(max(nbytes, 1) + offset)
        self.ptr = backend.address(self.storage) + offset

    def write(self, array):
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        assert data.size == self.nbytes
        if data.size:
            self.backend.copy_in(self.storage, self.offset, data)

    def read(self, dtype, shape):
        return self.backend.copy_out(self.storage, self.offset, self.nbytes).view(dtype).reshape(shape)


def upload(backend, array, offset=0):
    array = np.ascontiguousarray(array)
    buf = Buffer(backend, array.nbytes, offset)
    buf.write(array)
    return buf


# ---------------------------------------------------------------------------
# Host encodings of 16-bit tables.


def to_bfloat16_bits(values):
    """Round-to-nearest-even float32 -> bfloat16 bits (finite inputs)."""
    u = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode_table(values, dtype):
    """(device array, exact float32 values, array for the CPU core) for a table
    of float32 values stored as dtype. The CPU core has no bfloat16, so it gets
    the exact float32 values of the bfloat16 table."""
    if dtype == "float32":
        return values, values, values
    if dtype == "float16":
        half = values.astype(np.float16)
        return half, half.astype(np.float32), half
    bits = to_bfloat16_bits(values)
    exact = from_bfloat16_bits(bits)
    return bits, exact, exact


def decode(array, dtype):
    return from_bfloat16_bits(array) if dtype == "bfloat16" else array.astype(np.float32)


def assert_close(got, want, dtype):
    tol = TOL[dtype]
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)
