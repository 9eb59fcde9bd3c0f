"""Key-to-row hash-table embedding: every key gets its own row of a value matrix.

    table = tco.HashTable(dim=16, capacity=1_000_000)
    y = tco.hash_table_embedding(table, raw_ids, combiner="mean", insert=True)

Unlike `hash_embedding` (hash buckets, where unrelated keys collide and
share a row), a `HashTable` maps each key to a row of its own, the first time
the key is seen with `insert=True` (training). Without `insert` (serving), a
key the table lacks reads no row: it is left out of its bag, as
`safe_embedding_lookup_sparse` leaves out ids the table does not have.

The table is two ordinary variables: `table` (int64 slots, on the CPU) and
`values` ([capacity, dim], trainable). Checkpoints, SavedModels and
`model.export` store them as they store any variable, and a loaded model
needs nothing but the op library. `tf.train.Checkpoint.restore` also loads a
table saved at another capacity (see `restore_any_capacity`). The pooling is
`CtrEmbeddingLookup`'s, so the gradient reaches `values` as
`tf.IndexedSlices` of the looked-up rows and every optimizer updates (and
keeps slots for) only those rows.
"""

import functools
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_v2_func_graphs, resource_variable_ops

from tf_ctr_ops import _errors
from tf_ctr_ops import ops as _lookup_ops
from tf_ctr_ops._args import (check_combiner, in_place_variable, max_norm_attr, per_feature, sharded_variables,
                             table_operand)
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._table_grad import forward_table
from tf_ctr_ops.table_layout import (CLOCK, COLUMNS, DROPPED, EMPTY_ENTRY, EVICTED, FREE_COUNT,  # noqa: F401
                                     HEADER_ROWS, INT_KEYS, KEY_KIND, NEXT_ROW, OCCUPIED, STRING_KEYS,
                                     UNKNOWN_KEYS, default_num_slots, empty_table_array, free_list_rows,
                                     free_rows, table_shape)

_ops = load_op_library()

tf.no_gradient("CtrHashTableFind")

KEY_DTYPES = (tf.int64, tf.string)
EVICTIONS = ("none", "lru", "lfu")


def check_eviction(eviction):
    eviction = "none" if eviction is None else eviction
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction must be one of {EVICTIONS} (or None), got {eviction!r}")
    return eviction


def check_table_args(capacity, num_slots, admit_after):
    """Validated (capacity, num_slots, admit_after)."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    capacity = int(capacity)
    num_slots = default_num_slots(capacity) if num_slots is None else num_slots
    if isinstance(num_slots, bool) or not isinstance(num_slots, (int, np.integer)) or num_slots < 1 \
            or num_slots & (num_slots - 1):
        raise ValueError(f"num_slots must be a power of two, got {num_slots!r}")
    if num_slots < capacity + capacity // 3 + 1:  # rows must fit under the 3/4 slot limit
        raise ValueError(f"num_slots {num_slots} is too small for capacity {capacity}: it must hold "
                         f"the rows at under 3/4 load (default: {default_num_slots(capacity)})")
    if isinstance(admit_after, bool) or not isinstance(admit_after, (int, np.integer)) or admit_after < 1:
        raise ValueError(f"admit_after must be an integer >= 1, got {admit_after!r}")
    return capacity, int(num_slots), int(admit_after)


def empty_table(num_slots, capacity, key_dtype=None):
    """The int64 table tensor (table_shape) of a table with no keys of
    `key_dtype` (None: not recorded)."""
    return tf.constant(empty_table_array(num_slots, capacity, key_kind(key_dtype)))


def key_kind(key_dtype):
    """The table header's KEY_KIND of keys of `key_dtype` (None: unknown)."""
    if key_dtype is None:
        return UNKNOWN_KEYS
    return STRING_KEYS if tf.as_dtype(key_dtype) == tf.string else INT_KEYS


def slot_pairs(table, num_slots):
    """The (key, entry) of every slot: [num_slots, 2] (cc/core/hash_table.h)."""
    region = tf.reshape(table[HEADER_ROWS:HEADER_ROWS + num_slots], [-1])
    return tf.reshape(region[:2 * num_slots], [num_slots, 2])


def check_key_dtype(key_dtype):
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in KEY_DTYPES:
        raise ValueError(f"key_dtype must be tf.int64 or tf.string, got {key_dtype.name}")
    return key_dtype


class HashTable(tf.Module):
    """A key-to-row table: the `values` row of each key it has seen.

    Args:
      dim: the embedding width.
      capacity: the rows of `values`; keys beyond it are dropped (they read no
        row) and counted in `statistics()["dropped"]`.
      key_dtype: tf.int64 (int32 keys are accepted too) or tf.string. String
        keys are stored as their 64-bit `to_hash_bucket_fast` fingerprint.
      dtype: the values' dtype.
      initializer: initializer of `values` (a callable taking shape and
        dtype, or a Keras initializer's name or config, as
        `keras.initializers.get` takes it); every row starts with its value,
        so a key inserted later starts there too. Default: truncated normal,
        stddev 1/sqrt(dim).
      admit_after: a key gets a row the admit_after-th time it is inserted;
        until then it reads no row (filters out one-off keys).
      eviction: when all rows are taken, "lru" evicts the keys least recently
        seen by inserting calls, "lfu" the least often seen (capacity/16 at a
        time; never a key of the running call), and their rows go to new keys,
        reset by `initializer`. None (default): new keys are dropped.
      num_slots: hash slots, a power of two (default: >= 2 x capacity).
      table_device: where the key table lives and its keys are found: the
        CPU (default), or a GPU ("/GPU:0"), which finds and inserts keys on
        the device with the CPU's rules (same rows); a call that must evict
        runs its inserts on the host, on a copy of the key table.
        `values` goes where the caller's device scope puts it.
    """

    def __init__(self, dim, capacity, key_dtype=tf.int64, dtype=tf.float32, initializer=None, admit_after=1,
                 eviction=None, num_slots=None, name="hash_table", table_device="/CPU:0"):
        super().__init__(name=name)
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.dim = int(dim)
        self.capacity, self.num_slots, self.admit_after = check_table_args(capacity, num_slots, admit_after)
        self.key_dtype = check_key_dtype(key_dtype)
        dtype = tf.as_dtype(dtype)
        if not dtype.is_floating:
            raise ValueError(f"dtype (of the values) must be a float type, got {dtype.name}")
        self.eviction = check_eviction(eviction)
        self.table_device = check_table_device(table_device)
        if initializer is None:
            initializer = tf.keras.initializers.TruncatedNormal(stddev=1.0 / np.sqrt(self.dim))
        elif not callable(initializer):
            initializer = tf.keras.initializers.get(initializer)  # "he_normal", a config dict
        self.row_initializer = initializer
        self.reset_seed = reset_seed_of(initializer)
        self._slot_optimizer = _SlotOptimizer()
        with self.name_scope:
            self.table = create_table_variable(  # the find kernel runs where the table lives
                lambda: tf.Variable(empty_table(self.num_slots, self.capacity, self.key_dtype), trainable=False,
                                    name="table"), self.table_device)
            values = tf.cast(initializer([self.capacity, self.dim], dtype=dtype), dtype)  # a NumPy float64 too
            self.values = tf.Variable(values, name="values")
        restore_any_capacity(self)

    def reset_slots_of(self, optimizer):
        """With eviction: also reset the rows of `optimizer`'s slots (momentums,
        accumulators, ...) of `values` when a row goes to a new key. Keras 3
        optimizers; build the optimizer (or take a step) first."""
        self._slot_optimizer.set(optimizer)

    def slot_optimizer(self):
        return self._slot_optimizer.get()

    def find(self, keys, insert=False):
        """The row of each key (any shape), -1 for keys without one."""
        return find_rows(self, dense_keys(keys, self.key_dtype), insert=insert)

    def size(self):
        """Keys that have a row."""
        return table_statistics(self.table, self.capacity)["size"]

    def statistics(self):
        """A dict of scalar tensors: size, occupied slots, dropped, evicted, load factor."""
        return table_statistics(self.table, self.capacity)

    def export(self):
        """(keys, values) of every key with a row, in row order; string keys as their fingerprints."""
        return export_rows(self.table, self.values, self.num_slots)

    def insert_rows(self, keys, values):
        """Inserts `keys` (int64 fingerprints for string tables) with their `values`
        rows, as `export()` gives them: loads one table into another of any capacity."""
        return insert_rows(self, keys, values)

    def restore_resized(self, checkpoint_path, name):
        """Inserts the keys and values of the HashTable (or HashTableEmbedding
        layer) saved as `name` in a tf.train.Checkpoint
        (`tf.train.Checkpoint(name=table).save(...)`) whatever its capacity,
        and returns how many fit. `Checkpoint.restore` does the same; this
        reads one table of a checkpoint by its name."""
        reader = tf.train.load_checkpoint(checkpoint_path)
        saved = {k: f"{name}/{k}/.ATTRIBUTES/VARIABLE_VALUE" for k in ("table", "values", "embeddings")}
        found = {k for k, key in saved.items() if reader.has_tensor(key)}
        if "table" not in found or not found & {"values", "embeddings"}:
            raise ValueError(f"checkpoint {checkpoint_path} holds no hash table named {name!r} (no "
                             f"{name}/table with {name}/values or {name}/embeddings)")
        table = reader.get_tensor(saved["table"])
        values = reader.get_tensor(saved["values" if "values" in found else "embeddings"])
        check_saved_key_kind(table, self)
        if values.ndim != 2 or values.shape[1] != self.dim:
            width = values.shape[1] if values.ndim == 2 else f"? (values of shape {values.shape})"
            raise ValueError(f"checkpoint {checkpoint_path} holds {name!r} with rows of width {width}, this "
                             f"table's rows are {self.dim} wide: a table restores into one of its own width")
        dtype = _variable(self.values).dtype
        if values.dtype != dtype.as_numpy_dtype:
            raise ValueError(f"checkpoint {checkpoint_path} holds {name!r} with rows of {tf.as_dtype(values.dtype).name}, "
                             f"this table's rows are {dtype.name}: a table restores rows of its own dtype (cast them "
                             f"and pass them to insert_rows)")
        return insert_rows(self, *rows_of_tensors(table, values))


def insert_rows(table, keys, values):
    """Inserts `keys` with their `values` rows into `table` (a HashTable or a
    built HashTableEmbedding); returns how many keys got a row. A key given
    more than once takes its first row (a scatter of both would keep either)."""
    keys = tf.reshape(tf.convert_to_tensor(keys, tf.int64), [-1])
    values = tf.convert_to_tensor(values, _variable(table.values).dtype)
    if values.shape.rank not in (None, 2) or values.shape[-1] not in (None, table.dim):
        raise ValueError(f"values must be [n, {table.dim}] rows of the table's width, got shape {values.shape}")
    if keys.shape[0] is not None and values.shape.rank == 2 and values.shape[0] not in (None, keys.shape[0]):
        raise ValueError(f"values must hold one row per key: {keys.shape[0]} keys, {values.shape[0]} rows")
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(values, out_type=tf.int64), tf.stack([tf.size(keys, out_type=tf.int64), table.dim]),
            message=f"values must hold one row of width {table.dim} per key")]):
        keys, unique_of = tf.unique(keys)  # keys in order of first appearance
    first = tf.math.unsorted_segment_min(tf.range(tf.size(unique_of)), unique_of, tf.size(keys))
    values = tf.gather(values, first)
    rows, _ = _find(_variable(table.table), keys, table.capacity, insert=True, admit_after=1)
    kept = rows >= 0
    _variable(table.values).scatter_update(
        tf.IndexedSlices(tf.boolean_mask(values, kept), tf.boolean_mask(rows, kept)))
    return tf.reduce_sum(tf.cast(kept, tf.int64))


def restore_any_capacity(table):
    """Makes `tf.train.Checkpoint.restore` load `table` (a HashTable or a
    built HashTableEmbedding) from a checkpoint of a table of any capacity or
    slot count, as `restore_resized` does.

    A checkpoint of the same shapes restores as any variable does. Otherwise
    TF would refuse the variables' shapes, so the two variables' restores are
    taken over: once both the saved `table` and `values` have arrived, the
    table is emptied and the saved keys are inserted with their rows (in the
    saved row order; keys beyond the capacity are dropped and counted in
    `statistics()["dropped"]`). Eager restores only (TF2's default), outside
    tf.distribute strategies; the optimizer's slots of `values` still need a
    checkpoint of the same capacity. Returns whether it took them over.
    """
    variables = {part: getattr(table, part) for part in ("table", "values")}
    if not all(isinstance(_variable(v), resource_variable_ops.BaseResourceVariable) for v in variables.values()):
        # Distributed values (their strategy restores them, at the saved
        # shape only), or a Keras variable not yet initialized: False.
        return False
    restore = _AnyCapacityRestore(table)
    for part, variable in variables.items():
        # A weak reference, and the class's own method: a variable holding
        # itself would wait for the cycle collector to free a deleted table.
        variable._restore_from_tensors = functools.partial(restore.arrive, part, weakref.ref(variable))
    return True


class _AnyCapacityRestore:
    """The saved table and values of one restore, until both have arrived."""

    def __init__(self, table):
        self._table = weakref.ref(table)
        self._saved = {}
        self._before = {}  # part -> (variable, its value before this restore assigned it)

    def arrive(self, part, variable_ref, restored_tensors):
        variable = variable_ref()
        original = functools.partial(type(variable)._restore_from_tensors, variable)
        saved = restored_tensors["VARIABLE_VALUE"]
        if not tf.executing_eagerly():
            return original(restored_tensors)
        if part in self._saved:  # a restore of one part alone left it here: this is another restore
            self._saved, self._before = {}, {}
        table = self._table()
        try:  # what a part can be refused for, before it is assigned
            if part == "table":
                check_saved_key_kind(saved, table)
            elif int(saved.shape[1]) != table.dim:
                raise ValueError(f"the checkpoint's table has rows of width {int(saved.shape[1])}, this one "
                                 f"{table.dim}: a table restores from one of the same dim")
        except ValueError:
            self._put_back()  # the other part, if this restore assigned it: a refused restore changes nothing
            raise
        same_shape = tuple(saved.shape) == tuple(variable.shape)
        result = None
        if same_shape:  # restored as any variable (a checkpoint may hold this part alone)
            self._before[part] = (variable_ref, tf.identity(_variable(variable)))
            result = original(restored_tensors)
            if part == "table":
                _keep_key_kind(variable, table.key_dtype)  # a table saved before the cell has 0 there
        self._saved[part] = (saved, same_shape)
        if len(self._saved) == 2:
            (saved_table, same_table), (saved_values, same_values) = self._saved["table"], self._saved["values"]
            if not (same_table and same_values):
                self._insert_saved_or_put_back(saved_table, saved_values)
            elif table.eviction == "none":
                self._reset_free_rows_or_put_back()
            self._saved, self._before = {}, {}
        return result

    def _insert_saved_or_put_back(self, saved_table, saved_values):
        """Inserts the saved keys; a checkpoint whose keys cannot be read or
        inserted (a row past its values, say) leaves both variables as they
        were before the restore, as a refused restore does."""
        table = self._table()
        for part, var in (("table", table.table), ("values", table.values)):
            if part not in self._before:  # not assigned by this restore: its value now is the one to keep
                self._before[part] = (lambda v=var: v, tf.identity(_variable(var)))
        try:
            self._insert_saved(saved_table, saved_values)
        except (ValueError, tf.errors.OpError) as e:
            self._put_back()
            if isinstance(e, ValueError):
                raise
            raise ValueError(f"the checkpoint's table could not be restored into this one ({e.message.strip()}); "
                             "the table is as it was before the restore") from e

    def _reset_free_rows_or_put_back(self):
        try:
            reset_free_rows(self._table())
        except (TypeError, ValueError, tf.errors.OpError) as e:
            self._put_back()
            raise ValueError(f"the rows this table's checkpoint had freed could not be given fresh values from "
                             f"its initializer ({_errors.summary(e)}); the table is as it was before the "
                             "restore") from e

    def _put_back(self):
        for variable_ref, value in self._before.values():
            if variable_ref() is not None:
                _variable(variable_ref()).assign(value)
        self._saved, self._before = {}, {}

    def _insert_saved(self, saved_table, saved_values):
        table = self._table()
        keys, values = rows_of_tensors(saved_table, saved_values)
        _variable(table.table).assign(empty_table(table.num_slots, table.capacity, table.key_dtype))
        # Rows past the saved keys go to new keys as they are: fresh, not what
        # this table's old keys had trained there.
        every_row = tf.range(table.capacity, dtype=tf.int64)
        _variable(table.values).assign(fresh_rows(table.row_initializer, every_row, (table.capacity, table.dim),
                                                  _variable(table.values).dtype,
                                                  tf.constant([table.reset_seed, 0], tf.int64)))
        insert_rows(table, keys, values)


def reset_free_rows(table):
    """Fresh values for the rows on a restored table's free stack, where the
    table does not evict (eager). Only an evicting table frees rows, and
    resets each as a new key takes it (see _find_and_reset); a table without
    eviction restored from such a table's checkpoint would hand those rows to
    new keys as the evicted keys left them."""
    reset = free_row_reset(table, _variable(table.table).numpy())
    if reset is not None:
        _variable(table.values).scatter_update(reset)


def free_row_reset(table, table_array):
    """The IndexedSlices of fresh values that reset_free_rows writes for the
    table array `table_array` (drawn before it is loaded, so that an
    initializer that fails leaves a load undone), or None."""
    if table.eviction != "none":
        return None
    rows = free_rows(table_array, table.capacity)
    rows = rows[(rows >= 0) & (rows < table.capacity)]  # a corrupt stack is the find's to refuse
    if not rows.size:
        return None
    fresh = fresh_rows(table.row_initializer, tf.constant(rows), (table.capacity, table.dim),
                       _variable(table.values).dtype, tf.constant([table.reset_seed, 0], tf.int64))
    return tf.IndexedSlices(fresh, tf.constant(rows))


def _keep_key_kind(table_var, key_dtype):
    """Writes the key kind into a restored table's header (a checkpoint
    written before the header had the cell holds 0 there), so that its own
    checkpoints are checked."""
    row, column = divmod(KEY_KIND, COLUMNS)
    _variable(table_var).scatter_nd_update([[row, column]], tf.constant([key_kind(key_dtype)], tf.int64))


def check_saved_key_kind(saved_table, table):
    """String keys are stored as int64 fingerprints, so a checkpoint of the
    other key kind would restore without error and find none of its keys."""
    saved, own = (int(tf.reshape(t[:HEADER_ROWS], [-1])[KEY_KIND]) for t in (saved_table, _variable(table.table)))
    _refuse_other_key_kind(saved, own)


def _refuse_other_key_kind(saved, own):
    if UNKNOWN_KEYS not in (saved, own) and saved != own:
        names = {INT_KEYS: "int64", STRING_KEYS: "string"}
        raise ValueError(f"the checkpoint's table holds {names.get(saved, saved)} keys, this one takes "
                         f"{names.get(own, own)} keys (key_dtype): a table restores from one of the same key_dtype")


def check_restored_key_kind(table):
    """The key-kind check (and free-row reset) of a restore that ran as the
    table variable was created, before restore_any_capacity could take it over: Keras restores
    a layer's weights in add_weight when the checkpoint was restored before
    the layer was built. A layer first built while a tf.function traces
    (a subclassed model's fit) has no value to read yet, nor a restore."""
    if tf.inside_function():
        return
    with tf.init_scope():
        if not tf.executing_eagerly():
            return
        saved = int(tf.reshape(_variable(table.table)[:HEADER_ROWS], [-1])[KEY_KIND])
        _refuse_other_key_kind(saved, key_kind(table.key_dtype))
        if saved == UNKNOWN_KEYS:
            _keep_key_kind(table.table, table.key_dtype)
        reset_free_rows(table)


# Inserting finds of each table traced into a function graph so far (by
# graph, then by the table variable).
_FINDS_OF_STEP = weakref.WeakKeyDictionary()


def _find_index_in_step(table):
    """Which inserting find of `table` this is in its training step: the
    body of a traced function (Keras' train_step, a tf.function, a loop body)
    runs as one step, so its first inserting find of a table starts a step
    and later ones (a layer shared by two features, called twice) continue
    it, never evicting the keys an earlier find of the step has read. Each
    graph is a step of its own: Keras traces its step function twice into
    one outer function (the first step, then the loop of the others), and a
    loop body runs once per step; a tf.cond branch is part of its graph's
    step. Eagerly, each call is a step."""
    if not tf.inside_function():
        return 0
    table_var = _variable(table.table)
    graph = tf.compat.v1.get_default_graph()
    while isinstance(graph, control_flow_v2_func_graphs.CondBranchFuncGraph):  # a branch runs in its step
        graph = graph.outer_graph
    finds = _FINDS_OF_STEP.setdefault(graph, {})
    index = finds.get(table_var._unique_id, 0)
    if index == 0 and graph is not tf.compat.v1.get_default_graph():
        # The step's first find is in a branch, which may not run: the step
        # starts outside it, with a find of no keys that only advances the
        # clock. Traced now, it comes before the cond in the step's graph,
        # and the table's reads and writes run in the order they are traced.
        with graph.as_default():
            _find(table_var, tf.zeros([0], table.key_dtype), table.capacity, True, table.admit_after,
                  eviction=table.eviction, new_step=True)
        index = 1
    finds[table_var._unique_id] = index + 1
    return index


def _find(table_var, keys, capacity, insert, admit_after, dense_padding=False, eviction="none", new_step=True):
    """(rows, reused_rows): see CtrHashTableFind."""
    # Recorded as a read, as a variable's own reads are: a function's
    # `variables` then list the table, which Keras' model.export saves by.
    resource_variable_ops.variable_accessed(table_var)
    if _on_gpu(table_var) and keys.dtype != tf.int64:
        keys = tf.cast(keys, tf.int64)  # the GPU kernel takes int64 keys only; the CPU widens int32 the same way
    return _ops.ctr_hash_table_find(table=table_var.handle, keys=keys, capacity=capacity, insert=bool(insert),
                                    admit_after=admit_after, dense_padding=dense_padding, eviction=eviction,
                                    new_step=new_step)


def _on_gpu(var):
    return tf.DeviceSpec.from_string(var.device or "").device_type == "GPU"


def _find_and_reset(table, ids, insert, dense_padding=False):
    """Rows of ids; rows that eviction handed to new keys get fresh initial
    values (and optimizer slots, see reset_slots_of) first."""
    if insert:
        check_eviction_outside_replicas(table.eviction)  # before the find inserts
    if insert and (_under_multi_worker_strategy() or _several_replicas()):
        return _find_gathered(table, ids, dense_padding)
    in_step = _find_index_in_step(table) if insert else 0
    rows, reused = _find(_variable(table.table), ids, table.capacity, insert, table.admit_after,
                         dense_padding=dense_padding, eviction=table.eviction if insert else "none",
                         new_step=in_step == 0)
    # Without eviction, the only rows a find reuses are those of a free stack
    # restored from an evicting table's checkpoint, which the restore reset.
    return _reset_reused_rows(table, rows, reused, in_step) if insert and table.eviction != "none" else rows


def _reset_reused_rows(table, rows, reused, in_step):
    """`rows`, once the `reused` ones hold fresh values and optimizer slots."""
    values = _variable(table.values)
    shape = tf.stack([tf.size(reused), table.dim])
    with tf.control_dependencies([rows]):  # the clock this call advanced
        clock = resource_variable_ops.resource_gather(_variable(table.table).handle, [CLOCK // COLUMNS],
                                                      dtype=tf.int64)[0, CLOCK % COLUMNS]
    # The finds of one step share a clock: each has its own draw.
    fresh = fresh_rows(table.row_initializer, reused, (table.capacity, table.dim), values.dtype,
                       tf.stack([tf.constant(table.reset_seed, tf.int64), clock + in_step * 2**40]))
    resets = [values.scatter_update(tf.IndexedSlices(fresh, reused))]
    for slot, initial in optimizer_slots(table.slot_optimizer(), table.values):
        slot = _variable(slot)
        start = tf.cast(fresh, slot.dtype) if initial is FRESH_ROW else tf.fill(shape, tf.cast(initial, slot.dtype))
        resets.append(slot.scatter_update(tf.IndexedSlices(start, reused)))
    with tf.control_dependencies(resets):
        return tf.identity(rows)
    return rows


def reset_seed_of(initializer):
    """The seed of the values that rows handed to new keys restart from: the
    initializer's own (an int), else one drawn now (reproducible under
    keras.utils.set_random_seed, which seeds Python's generator)."""
    import random

    seed = getattr(initializer, "seed", None)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else random.randint(1, 2**31 - 1)


def _of_static_shape(initializer):
    """Initializers whose values depend on the whole matrix: called on the
    rows' shape they would give other values (eagerly, without an error)."""
    import keras

    return isinstance(initializer, (keras.initializers.Orthogonal, keras.initializers.Identity))


def _row_distribution(initializer, table_shape):
    """(kind, a, b) of the distribution a Keras random initializer draws each
    value of a `table_shape` matrix from, or None for any other initializer."""
    import keras

    inits = keras.initializers
    if isinstance(initializer, inits.VarianceScaling):
        if initializer.input_axes is not None or initializer.output_axes is not None:
            return None
        fan_in, fan_out = table_shape
        fan = {"fan_in": fan_in, "fan_out": fan_out}.get(initializer.mode, (fan_in + fan_out) / 2.0)
        scale = initializer.scale / max(1.0, fan)
        if initializer.distribution == "truncated_normal":
            return "truncated_normal", 0.0, np.sqrt(scale) / 0.87962566103423978
        if initializer.distribution == "untruncated_normal":
            return "normal", 0.0, np.sqrt(scale)
        limit = np.sqrt(3.0 * scale)
        return "uniform", -limit, limit
    if isinstance(initializer, inits.TruncatedNormal):
        return "truncated_normal", initializer.mean, initializer.stddev
    if isinstance(initializer, inits.RandomNormal):
        return "normal", initializer.mean, initializer.stddev
    if isinstance(initializer, inits.RandomUniform):
        return "uniform", initializer.minval, initializer.maxval
    return None


def fresh_rows(initializer, rows, table_shape, dtype, seed):
    """Values for `rows`, handed to new keys. A Keras random initializer is
    seeded once and gives the same values at every call, so every reused row
    would start as the same vector: its distribution is drawn from here
    instead, with `seed` ([table's seed, its clock]) new at every inserting
    call, and its fans (VarianceScaling: Glorot, He, Lecun) those of the
    whole `table_shape` matrix, as at creation. Any other initializer
    (constants, a callable of the user's) is called on the rows' shape; one
    that needs a static shape (Orthogonal, Identity) gives the rows their
    values in the whole table it initializes."""
    shape = tf.stack([tf.size(rows, out_type=tf.int32), table_shape[1]])
    kind = _row_distribution(initializer, table_shape)
    if kind is None:
        if not _of_static_shape(initializer):
            try:
                values = tf.cast(initializer(shape, dtype=dtype), dtype)  # NumPy float64 too, as at creation
                # A row count other than the one asked for (in a graph, any
                # static one: the count asked for is not) is an initializer
                # that ignores the shape, its whole table, say: read as one
                # of static shape.
                if values.shape.rank == 2 and values.shape[0] == rows.shape[0] \
                        and values.shape[1] in (None, table_shape[1]):
                    return values
            except (TypeError, ValueError):  # a callable of the user's that wants a static shape
                pass
        return tf.gather(tf.cast(initializer(list(table_shape), dtype=dtype), dtype), rows)
    name, a, b = kind
    if name == "uniform":
        rows = tf.random.stateless_uniform(shape, seed, minval=a, maxval=b)
    elif name == "normal":
        rows = tf.random.stateless_normal(shape, seed, mean=a, stddev=b)
    else:
        rows = tf.random.stateless_truncated_normal(shape, seed, mean=a, stddev=b)
    return tf.cast(rows, dtype)


def _under_multi_worker_strategy():
    """Whether each worker process has a table of its own (see
    _one_copy_creator): under MultiWorkerMirroredStrategy, where inserts must
    run in its replicas (strategy.run), which keep the copies equal."""
    if not (tf.distribute.has_strategy()
            and isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy)):
        return False
    if tf.distribute.in_cross_replica_context():
        raise RuntimeError("under MultiWorkerMirroredStrategy a hash table inserts keys inside strategy.run only: "
                           "a worker inserting on its own would give a key another row than the other workers")
    return True


def _find_gathered(table, ids, dense_padding):
    """Inserting finds under a strategy of several replicas. The keys of all
    replicas, in replica order, go into every worker's table (see
    _find_keys_of_all_replicas), and each replica keeps the rows of its own
    keys. Rows go to new keys in order of first appearance
    (CtrHashTableFind), so the copies of every worker give each key the same
    row, which the mirrored values' aggregated gradients need; and finds of
    one table in one step (a table shared by two features, called twice)
    insert call by call, all replicas' keys at a time, as one replica does
    on the global batch: replica by replica, the second call's keys of the
    first replica would take rows before the first call's of the second."""
    context = tf.distribute.get_replica_context()
    flat = tf.reshape(ids, [-1])
    sizes = context.all_gather(tf.size(flat, out_type=tf.int64)[tf.newaxis], axis=0)
    rows = _find_keys_of_all_replicas(table, context.all_gather(flat, axis=0), dense_padding)
    start = tf.math.cumsum(sizes, exclusive=True)[context.replica_id_in_sync_group]
    return tf.reshape(tf.slice(rows, start[tf.newaxis], tf.size(flat, out_type=tf.int64)[tf.newaxis]),
                      tf.shape(ids))


def _find_keys_of_all_replicas(table, keys, dense_padding=False):
    """Rows of the keys that every replica gathered from all replicas. The
    first replica of each worker inserts them into the worker's table and
    hands its rows to the worker's other replicas (a collective), so a
    sighting is counted once and a key without room is dropped once, not
    once per replica. Those replicas take its rows rather than find the keys
    after it: with admission, a key's sightings before its admitting one
    read no row in the inserting call, where a later find reads the row."""
    context = tf.distribute.get_replica_context()
    local_replicas = len(tf.distribute.get_strategy().extended.worker_devices)
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if local_replicas == 1 or replica is None:
        return _find(_variable(table.table), keys, table.capacity, True, table.admit_after,
                     dense_padding=dense_padding)[0]
    if replica % local_replicas == 0:
        rows, _ = _find(_variable(table.table), keys, table.capacity, True, table.admit_after,
                        dense_padding=dense_padding)
    else:
        rows = tf.zeros([0], tf.int64)
    # The inserters' rows, worker by worker (the others give none). An
    # all_gather like the callers' own, not an all_reduce: a new strategy
    # object reuses collective instance keys, and an all_reduce met there an
    # all_gather of an earlier eager (or traced) step.
    inserted = context.all_gather(rows, axis=0)
    count = tf.size(keys, out_type=tf.int64)
    return tf.reshape(tf.slice(inserted, [replica // local_replicas * count], [count]), tf.shape(keys))


def optimizer_slots(optimizer, variable):
    """[(slot variable, its initial value)] of the rows of `variable` in a Keras 3 optimizer.

    Keras names the slots of a variable `{variable.path with '_' for '/'}_{slot}`
    with the variable's shape; accumulators (Adagrad, Ftrl) start at the
    optimizer's initial_accumulator_value, the moving average of use_ema at
    the row's own fresh value (FRESH_ROW), every other slot at 0. A slot
    name that also starts with the prefix of a longer-named variable (layers
    `user` and `user_embeddings_v2`) is that variable's. Variables may share
    a name (eager tf.Variables are not uniquified: two default HashTables
    both have `hash_table/values`), so their slots share names too; Keras
    creates each slot kind in the order of its trainable variables, so the
    k-th slot of a name belongs to the k-th of them.
    """
    if optimizer is None:
        return []
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's slots are its inner one's
    prefix = _slot_prefix(variable)
    namesakes = [v for v in getattr(optimizer, "_trainable_variables", [])
                 if _slot_prefix(v) == prefix and tuple(v.shape) == tuple(variable.shape)]
    position = next((i for i, v in enumerate(namesakes) if v is variable), None)
    if position is None:  # not one of this optimizer's variables: no slots of its own
        return []
    longer = {_slot_prefix(v) for v in getattr(optimizer, "_trainable_variables", [])}
    longer = [p for p in longer if len(p) > len(prefix) and p.startswith(prefix)]
    slots, seen = [], {}
    for slot in getattr(optimizer, "variables", []):
        if (tuple(slot.shape) != tuple(variable.shape) or not slot.name.startswith(prefix)
                or any(slot.name.startswith(p) for p in longer)):
            continue
        nth = seen.get(slot.name, 0)
        seen[slot.name] = nth + 1
        if nth == position:
            slots.append((slot, _slot_start(optimizer, slot.name[len(prefix):])))
    return slots


FRESH_ROW = "fresh row"  # a slot that restarts at the row's new value, not at a constant


def _slot_start(optimizer, kind):
    if kind == "accumulator":
        return getattr(optimizer, "initial_accumulator_value", 0.0)
    if kind == "average":  # Keras' use_ema: the average of a new row is the row
        return FRESH_ROW
    return 0.0


def _slot_prefix(variable):
    if hasattr(variable, "path"):  # a Keras variable
        return variable.path.replace("/", "_") + "_"
    return str(variable.name).replace("/", "_").replace(":", "_") + "_"  # a tf.Variable, as Keras names its slots


def _one_copy_creator(next_creator, **kwargs):
    """Creates a table variable as one plain variable even under a
    tf.distribute strategy, which would make a copy per replica (or cut it
    into shards): replicas that inserted into copies of their own would give
    one key different rows. All replicas find and insert in the one table (on
    the CPU, or on a parameter server), whose lock serializes their inserts.
    Under MultiWorkerMirroredStrategy each worker process has its own, which
    _find_gathered keeps equal to the others'."""
    if not tf.distribute.has_strategy():
        return next_creator(**kwargs)
    strategy = tf.distribute.get_strategy()
    parameter_server = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if not (parameter_server or multi_worker or isinstance(strategy, (tf.distribute.MirroredStrategy,
                                                                      tf.distribute.OneDeviceStrategy))):
        raise NotImplementedError(
            f"hash tables train under MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy and "
            f"ParameterServerStrategy, not yet under {type(strategy).__name__}")
    kwargs.pop("synchronization", None)
    kwargs.pop("aggregation", None)
    kwargs.pop("experimental_enable_variable_lifting", None)
    if not parameter_server:
        return resource_variable_ops.ResourceVariable(**kwargs)
    # On one parameter server, never partitioned (the strategy's partitioner
    # would cut the slots apart): the find of every worker runs there, on the
    # one table, whose lock serializes their inserts. The servers take
    # variables in the strategy's own round robin (TF 2.21's, which this
    # library is built against).
    return strategy.extended._create_variable_round_robin(
        lambda **kw: resource_variable_ops.ResourceVariable(**kw), **kwargs)


def create_table_variable(create, device="/CPU:0"):
    """create() (which makes the table variable) on `device`, as one copy; see _one_copy_creator."""
    with tf.device(device), tf.variable_creator_scope(_one_copy_creator):
        return create()


def create_table_weight(create, device="/CPU:0"):
    """create_table_variable for a Keras weight (create() calls add_weight).
    Keras builds a subclassed model (or a Sequential without an Input)
    symbolically, in a stateless scope that defers creating its layers'
    variables until after build returns, outside this scope: the table would
    then be mirrored or sharded by the strategy. So a deferred creation runs
    in the same scope when it comes."""
    weight = create_table_variable(create, device)
    if getattr(weight, "_value", False) is None:  # Keras deferred it (its private API, Keras 3)
        initialize = weight._initialize

        def initialize_as_one_copy(value):
            with tf.device(device), tf.variable_creator_scope(_one_copy_creator):
                initialize(value)

        weight._initialize = initialize_as_one_copy
    return weight


def check_table_device(device):
    """The table's device as a string."""
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (AttributeError, TypeError, ValueError) as e:  # AttributeError: not a string
        raise ValueError(f"table_device must be a device string such as '/CPU:0' or '/GPU:0', got {device!r}") from e
    if spec.device_type not in ("CPU", "GPU"):
        raise ValueError(f"table_device must name a CPU or a GPU, got {device!r}")
    return spec.to_string()


def check_eviction_outside_replicas(eviction):
    """Eviction resets rows of the values, which a replica cannot assign on its own."""
    if eviction != "none" and tf.distribute.has_strategy():
        raise NotImplementedError("hash tables with eviction do not train under a tf.distribute strategy yet: "
                                  "the rows given to new keys cannot be reset from one replica")


class _SlotOptimizer:
    """The optimizer whose slots an evicting table resets, held weakly: not a
    dependency of the table's checkpoints, and never keeps the optimizer alive.
    A traced step resets the slots of the optimizer linked when it was traced
    (docs/hash_table.md, Limits)."""

    def __init__(self):
        self._ref = None

    def set(self, optimizer):
        self._ref = None if optimizer is None else weakref.ref(optimizer)

    def get(self):
        return None if self._ref is None else self._ref()


def _variable(v):
    return getattr(v, "_value", v)  # a Keras 3 variable wraps a tf.Variable


def dense_keys(keys, key_dtype):
    """Dense keys as a tensor; an empty Python list or array as keys of the
    table's dtype (converted alone it would be float32, which no table takes)."""
    if isinstance(keys, (list, tuple, np.ndarray)):
        try:
            empty = np.size(keys) == 0
        except ValueError:  # rows of different lengths: not a dense tensor, as convert_to_tensor says
            empty = False
        if empty:
            return tf.zeros(np.shape(keys), key_dtype)
    return tf.convert_to_tensor(keys)


def check_key_kind(key_dtype, keys_dtype):
    """Refuses keys of `keys_dtype` that a table of `key_dtype` does not take."""
    if keys_dtype == tf.string:
        if key_dtype != tf.string:
            raise TypeError("string keys need a table with key_dtype=tf.string")
    elif key_dtype == tf.string:
        raise TypeError(f"a table with key_dtype=tf.string takes string keys, got {keys_dtype.name}")
    elif keys_dtype not in (tf.int32, tf.int64):
        raise TypeError(f"keys must be int32, int64 or string, got {keys_dtype.name}")


def _int_keys(keys, key_dtype, dense):
    """Keys as int64 (strings as fingerprints, dense "" as the -1 padding)."""
    check_key_kind(key_dtype, keys.dtype)
    if keys.dtype == tf.string:
        ids = tf.strings.to_hash_bucket_fast(keys, np.iinfo(np.int64).max)
        return tf.where(tf.equal(keys, ""), tf.constant(-1, tf.int64), ids) if dense else ids
    return keys


def find_rows(table, keys, insert=False):
    """Rows of dense `keys` of any shape in `table` (a HashTable or a layer with its attributes)."""
    ids = _int_keys(keys, table.key_dtype, dense=False)
    return _find_and_reset(table, ids, insert)


def hash_table_embedding(table, keys, weights=None, combiner="mean", max_norm=None, insert=False, name=None):
    """Pooled embedding of raw keys, each with a row of its own in `table`.

    Args:
      table: a `HashTable` or a `layers.HashTableEmbedding` (built).
      keys: int32/int64 (or, for string tables, string) keys as a
        `tf.RaggedTensor [B, (n)]`, a `tf.SparseTensor [B, N]`, or a dense
        `[B, N]` tensor padded with -1 (or "").
      weights: optional float weights in the same container as `keys`;
        with "mean" and "sqrtn", keys of weight <= 0 are left out of their
        bag (as safe_embedding_lookup_sparse prunes them).
      combiner: "sum", "mean" or "sqrtn", over the keys that have a row.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      insert: give keys without a row a new one (training). Without it the
        table is only read, and keys without a row are left out of their bag.

    Returns:
      `[B, dim]`, a zero row for a bag with no key that has a row.
    """
    table = _check_table(table, "table", insert)
    check_combiner(combiner)
    max_norm_attr(max_norm)  # refused before any key is inserted
    with tf.name_scope(name or "hash_table_embedding"):
        dense = not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor))
        if dense:
            keys = dense_keys(keys, table.key_dtype)
        bags = _lookup_ops._bags_from_container(keys, weights, -1)
        ids = _int_keys(bags.ids, table.key_dtype, dense)
        if not insert and _find_pools_in_one_op(table):
            out = _pool_found_rows(table, ids, bags, combiner, max_norm, dense_padding=dense)
            return _lookup_ops._with_batch_dim(out, keys)
        if insert:
            ids = _lookup_ops._checked_bag_ids(ids, bags)
        rows = _find_and_reset(table, ids, insert, dense_padding=dense)
        rows_bags = _lookup_ops._Bags(rows, bags.segments, bags.num_rows, bags.kind, bags.weights)
        return _lookup_ops._with_batch_dim(_pool_rows(table, rows_bags, combiner, max_norm), keys)


def _check_table(table, argument, insert=False):
    """A `HashTable`, a built layer that has one (duck-typed: a layer's
    table is a Keras variable), or a read-only view of one that
    tf.saved_model.load restored."""
    if all(hasattr(table, a) for a in ("table", "values", "key_dtype", "capacity")):
        return table
    if getattr(table, "built", True) is False and hasattr(table, "key_dtype"):
        raise ValueError(f"{argument} is a {type(table).__name__} layer that is not built yet: "
                         "call (or build) it first, then pass it")
    if _LoadedTable.holds(table):
        if insert:
            raise ValueError(f"{argument} is a table restored by tf.saved_model.load, which can only be read: its "
                             "admission, eviction and initializer are not saved. To insert keys, make a "
                             "tf_ctr_ops.HashTable and load this one into it with table.restore_resized("
                             "'EXPORT_DIR/variables/variables', NAME), NAME being its attribute path in the "
                             "saved object")
        return _LoadedTable(table)
    raise TypeError(f"{argument} must be a tf_ctr_ops.HashTable (or a built layers.HashTableEmbedding), "
                    f"got {type(table).__name__}")


class _LoadedTable:
    """A HashTable (or HashTableEmbedding layer) as tf.saved_model.load
    restores it: its two variables without the Python attributes, which a
    SavedModel does not keep. The attributes a read needs follow from the
    variables: capacity and width from the values, the slot count from the
    table's rows, the key dtype from the table's header."""

    @staticmethod
    def _values_of(loaded):
        values = getattr(loaded, "values", None)
        return getattr(loaded, "embeddings", None) if values is None else values

    @classmethod
    def holds(cls, loaded):
        table, values = getattr(loaded, "table", None), cls._values_of(loaded)
        return (isinstance(table, tf.Variable) and isinstance(values, tf.Variable) and table.dtype == tf.int64
                and table.shape.rank == 2 and table.shape[1] == COLUMNS and values.shape.rank == 2)

    def __init__(self, loaded):
        self.table, self.values = loaded.table, self._values_of(loaded)
        self.capacity, self.dim = (int(n) for n in self.values.shape)
        self.num_slots = int(self.table.shape[0]) - HEADER_ROWS - free_list_rows(self.capacity)
        with tf.init_scope():  # the header is read once, eagerly, also when called in a tf.function
            kind = int(tf.reshape(self.table[:HEADER_ROWS], [-1])[KEY_KIND])
        self.key_dtype = tf.string if kind == STRING_KEYS else tf.int64
        self.admit_after, self.eviction = 1, None


def multi_hash_table_embedding(tables, features, weights=None, combiners="mean", max_norms=None, insert=False,
                               name=None):
    """The slots form of `hash_table_embedding`: N features, one find per table.

    HugeCTR's slots: the keys of all features that share a table are found
    (and inserted) by one `CtrHashTableFind`, and features that also share a
    combiner and max_norm are pooled by one `CtrEmbeddingLookup` over N x B
    bags, however many features there are.

    Args:
      tables: one `HashTable` (or built `layers.HashTableEmbedding`) that
        every feature reads, or a list of N.
      features: list of N key containers as `hash_table_embedding` takes
        them, all with the same batch size B.
      weights: None, or a list of N (entries may be None).
      combiners, max_norms: one value for all features, or a list of N.
      insert: as in `hash_table_embedding`.

    Returns:
      List of N `[B, dim]` tensors: what `hash_table_embedding` gives for each
      feature when called on the features in order (new keys get rows in that
      order). With eviction, one call never evicts a key of any of its features.
    """
    if not isinstance(features, (list, tuple)):  # a tensor would be taken row by row
        raise TypeError(f"features must be a list of key containers (one per feature), got "
                        f"{type(features).__name__}: for one feature, use hash_table_embedding")
    features = list(features)
    n = len(features)
    if n == 0:
        raise ValueError("features must be a non-empty list")
    listed = isinstance(tables, (list, tuple))
    tables = [_check_table(t, f"tables[{i}]" if listed else "tables", insert)
              for i, t in enumerate(per_feature(tables, n, "tables"))]
    weights = per_feature(weights, n, "weights")
    combiners = [check_combiner(c) for c in per_feature(combiners, n, "combiners")]
    # Refused before any key is inserted; as numbers, features group by them.
    max_norms = [None if m is None else max_norm_attr(m) for m in per_feature(max_norms, n, "max_norms")]
    with tf.name_scope(name or "multi_hash_table_embedding"):
        slots = [_slot(keys, w, t.key_dtype) for keys, w, t in zip(features, weights, tables)]
        batch = _common_batch_size([slot.batch for slot in slots])
        outputs = [None] * n
        # By the key table, which read-only views of one loaded table share.
        for members in _grouped(range(n), lambda i: id(tables[i].table)):
            table = tables[members[0]]
            # A read finds the keys of each group of slots as it pools them.
            found_by_pooling = not insert and _find_pools_in_one_op(table)
            if not found_by_pooling:
                # Every feature checked (its bags, the common batch) before any
                # table inserts: a refused call changes no table.
                with tf.control_dependencies([batch] + [s.ids for s in slots]):
                    _find_slot_rows(table, [slots[i] for i in members], insert)
            # Weighted and unweighted features apart: an unweighted one given
            # weights of 1 would take the weighted pooling's rounding.
            for pooled in _grouped(members, lambda i: (combiners[i], max_norms[i], slots[i].weights is None)):
                outs = _pool_slots(table, [slots[i] for i in pooled], batch, combiners[pooled[0]],
                                   max_norms[pooled[0]], found_by_pooling)
                for i, out in zip(pooled, outs):
                    outputs[i] = _lookup_ops._with_batch_dim(out, slots[i].keys)
        return outputs


class _Slot:
    """One feature's keys (as int64 ids), their bags' row ids in [0, B), weights and B."""

    def __init__(self, keys, ids, row_ids, weights, batch):
        self.keys, self.ids, self.row_ids, self.weights, self.batch = keys, ids, row_ids, weights, batch
        self.rows = None  # the table's rows of ids, once found


def _slot(keys, weights, key_dtype):
    dense = not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor))
    keys = dense_keys(keys, key_dtype) if dense else keys
    bags = _lookup_ops._bags_from_container(keys, weights, -1)
    batch = _batch_size(keys)
    # Checked here, not by the pooling of all the slots' bags, where a row
    # outside one feature's batch would be another feature's row.
    # int64 whatever the feature's int type: the slots' keys are found together.
    ids = tf.cast(_lookup_ops._checked_bag_ids(_int_keys(bags.ids, key_dtype, dense), bags), tf.int64)
    with tf.control_dependencies([ids]):
        row_ids = _row_ids(bags)
    w = None if bags.weights is None else tf.cast(bags.weights, tf.float32)
    if dense:
        # Dense padding (-1, "") is dropped here rather than by the find's
        # dense_padding, which would make -1 padding in every feature the
        # find reads: in ragged and sparse features -1 is a key.
        keep = tf.not_equal(ids, -1)
        ids, row_ids = tf.boolean_mask(ids, keep), tf.boolean_mask(row_ids, keep)
        w = None if w is None else tf.boolean_mask(w, keep)
    return _Slot(keys, ids, row_ids, w, batch)


def _grouped(indices, key):
    """Indices grouped by key, groups in order of their first index."""
    groups = {}
    for i in indices:
        groups.setdefault(key(i), []).append(i)
    return list(groups.values())


def _batch_size(keys):
    if isinstance(keys, tf.RaggedTensor):
        return keys.nrows(out_type=tf.int64)
    if isinstance(keys, tf.SparseTensor):
        return keys.dense_shape[0]
    return tf.shape(keys, out_type=tf.int64)[0]


def _common_batch_size(sizes):
    """B, checked equal across the features (bag f * B + b is feature f's row b)."""
    checks = [tf.debugging.assert_equal(size, sizes[0], message=f"feature {i} has another batch size than feature 0")
              for i, size in enumerate(sizes[1:], 1)]
    with tf.control_dependencies(checks):
        return tf.identity(sizes[0])


def _row_ids(bags):
    """Each key's bag as a row id in [0, B)."""
    if bags.kind == "row_splits":
        return tf.ragged.row_splits_to_segment_ids(tf.cast(bags.segments, tf.int64), out_type=tf.int64)
    return tf.identity(tf.cast(bags.segments, tf.int64))


def _find_slot_rows(table, slots, insert):
    """One find of all the slots' keys, in feature order; sets each slot's rows."""
    if insert and len(slots) > 1 and _several_replicas():
        _find_slot_rows_gathered(table, slots)
        return
    rows = _find_and_reset(table, tf.concat([s.ids for s in slots], 0), insert)
    sizes = tf.stack([tf.size(s.ids, out_type=tf.int64) for s in slots])
    for slot, slot_rows in zip(slots, tf.split(rows, sizes, num=len(slots))):
        slot.rows = slot_rows


def _several_replicas():
    return (tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
            and tf.distribute.get_strategy().num_replicas_in_sync > 1)


def _find_slot_rows_gathered(table, slots):
    """Inserting finds of several slots under a strategy of several replicas.
    One replica gives rows to new keys slot by slot (all of a feature's keys,
    then the next feature's); replica by replica, the slots would interleave
    and keys would get other rows (other initial values) than in one
    process. So every replica finds the keys of all replicas, slot-major
    (see _find_keys_of_all_replicas), and keeps the rows of its own."""
    check_eviction_outside_replicas(table.eviction)
    context = tf.distribute.get_replica_context()
    gathered, own = [], []
    for s in slots:
        flat = tf.reshape(s.ids, [-1])
        size = tf.size(flat, out_type=tf.int64)
        sizes = context.all_gather(size[tf.newaxis], axis=0)
        gathered.append(context.all_gather(flat, axis=0))
        own.append((tf.math.cumsum(sizes, exclusive=True)[context.replica_id_in_sync_group], size))
    rows = _find_keys_of_all_replicas(table, tf.concat(gathered, 0))
    slot_start = tf.constant(0, tf.int64)
    for s, g, (start, size) in zip(slots, gathered, own):
        s.rows = tf.reshape(tf.slice(rows, (slot_start + start)[tf.newaxis], size[tf.newaxis]), tf.shape(s.ids))
        slot_start += tf.size(g, out_type=tf.int64)


def _pool_slots(table, slots, batch, combiner, max_norm, found_by_pooling=False):
    """One lookup over the slots' bags, feature-major: [k * B, dim], split in
    k. found_by_pooling: the lookup reads the slots' keys (_pool_found_rows),
    not the rows a find gave them."""
    segments = tf.concat([s.row_ids + k * batch for k, s in enumerate(slots)], 0)
    weights = None
    if any(s.weights is not None for s in slots):
        weights = tf.concat([tf.ones_like(s.ids, tf.float32) if s.weights is None else s.weights for s in slots], 0)
    ids = tf.concat([s.ids if found_by_pooling else s.rows for s in slots], 0)
    bags = _lookup_ops._Bags(ids, segments, len(slots) * batch, "row_ids", weights)
    if found_by_pooling:
        pooled = _pool_found_rows(table, ids, bags, combiner, max_norm, dense_padding=False)
    else:
        pooled = _pool_rows(table, bags, combiner, max_norm)
    return tf.split(pooled, len(slots), axis=0)


def _prunes_weights(combiner, weights):
    """As safe_embedding_lookup_sparse, weights <= 0 are pruned but for "sum"."""
    return combiner != "sum" and weights is not None


def _find_pools_in_one_op(table):
    """Whether a read-only find and the pooling of its rows can be one
    CtrHashTableEmbedding: a CPU kernel reading both variables in place, so
    the table must be on a CPU and the values a variable on its host (not on
    a GPU, not partitioned), outside tf.distribute, whose replicas read their
    own copies."""
    values = in_place_variable(table.values)
    if values is None or tf.distribute.has_strategy() or _on_gpu(_variable(table.table)):
        return False
    host, other = (tf.DeviceSpec.from_string(_variable(v).device or "") for v in (table.table, values))
    return (other.job, other.replica, other.task) in ((host.job, host.replica, host.task), (None, None, None))


def _pool_found_rows(table, keys, bags, combiner, max_norm, dense_padding):
    """_find (read only) and _pool_rows of its rows in one op."""
    table_var, values = _variable(table.table), in_place_variable(table.values)
    for var in (table_var, values):  # recorded as reads, so the tape and model.export see both
        resource_variable_ops.variable_accessed(var)
    weights = _lookup_ops._weights_values(bags.weights)
    weights_input, has_weights = _lookup_ops._op_weights(weights)
    out, _ = _ops.ctr_hash_table_embedding(
        table=table_var.handle, values=values.handle, keys=keys, segments=_lookup_ops._op_segments(bags.segments),
        num_rows=tf.cast(bags.num_rows, tf.int64), weights=weights_input, T=values.dtype, capacity=table.capacity,
        dense_padding=dense_padding, combiner=combiner, segment_kind=bags.kind,
        prune_weights=_prunes_weights(combiner, weights), max_norm=max_norm_attr(max_norm), has_weights=has_weights)
    return out


@tf.RegisterGradient("CtrHashTableEmbedding")
def _hash_table_embedding_grad(op, grad, _):
    """The gradient of the lookup of the rows the op found: IndexedSlices of
    the values' rows, and the weights' gradient."""
    _, values, _, segments, num_rows, weights = op.inputs
    values = forward_table(values)
    attrs = {k: op.get_attr(k) for k in ("combiner", "segment_kind", "prune_weights", "max_norm", "has_weights")}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    values_grad, weights_grad = _lookup_ops.pooled_grads(
        grad, _ops.ctr_resource_embedding_lookup_grad, resource_variable_ops.variable_shape, values, op.outputs[1],
        segments, num_rows, weights, dict(attrs, id_mode="index", invalid_ids="skip_negative", default_id=-1,
                                          num_buckets=0), "per_id")
    return [None, values_grad, None, None, None, weights_grad]


def _pool_rows(table, bags, combiner, max_norm):
    """The pooled `table.values` rows of `bags` (ids: rows found, -1 for
    keys without one, which are left out). Values a ParameterServerStrategy
    partitioned are gathered shard by shard on their servers, never whole."""
    prune = _prunes_weights(combiner, bags.weights)
    shards = sharded_variables(table.values)
    if shards is not None:
        return _lookup_ops._sharded_lookup(shards, bags, combiner=combiner, invalid_ids="skip_negative",
                                          prune_weights=prune, max_norm=max_norm)
    return _lookup_ops._lookup(table_operand(table.values), bags.ids, bags.segments, bags.num_rows,
                               _lookup_ops._weights_values(bags.weights), segment_kind=bags.kind,
                               combiner=combiner, invalid_ids="skip_negative", prune_weights=prune,
                               max_norm=max_norm)


def table_statistics(table_var, capacity):
    header = tf.reshape(tf.convert_to_tensor(_variable(table_var))[:HEADER_ROWS], [-1])
    size = header[NEXT_ROW] - header[FREE_COUNT]
    return {
        "size": size,
        "occupied": header[OCCUPIED],
        "dropped": header[DROPPED],
        "evicted": header[EVICTED],
        "load_factor": tf.cast(size, tf.float64) / float(capacity),
    }


def rows_of_tensors(table, values):
    """(keys, values) of every key with a row, from a table tensor and its
    values (a checkpoint's, of any capacity), in row order."""
    capacity = int(values.shape[0])
    num_slots = int(table.shape[0]) - HEADER_ROWS - free_list_rows(capacity)
    return export_rows(tf.convert_to_tensor(table), tf.convert_to_tensor(values), num_slots)


def export_rows(table_var, values_var, num_slots):
    slots = slot_pairs(tf.convert_to_tensor(_variable(table_var)), num_slots)
    with_row = slots[:, 1] >= 0
    keys = tf.boolean_mask(slots[:, 0], with_row)
    rows = tf.boolean_mask(slots[:, 1], with_row)
    order = tf.argsort(rows)  # in row order (insertion order, until eviction reuses rows)
    return tf.gather(keys, order), tf.gather(tf.convert_to_tensor(_variable(values_var)), tf.gather(rows, order))
