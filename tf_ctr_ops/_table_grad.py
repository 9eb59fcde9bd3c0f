"""The gradient of an embedding table: IndexedSlices of the rows a lookup read."""

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops.control_flow_v2_func_graphs import WhileBodyFuncGraph


def dense_table_shape(params):
    """The int32 dense_shape of a table tensor's gradient, read as TF's
    Gather gradient reads it (int64, then cast): tf.shape's int32 output
    refuses a dimension of 2**31 - 1, which is still a valid row count."""
    return tf.cast(tf.shape(params, out_type=tf.int64), tf.int32)


def half_rows_merged(values, indices):
    """(values, indices) with one row per distinct index, summed in float32,
    where the values are float16 or bfloat16; float32 and float64 as given.

    The string ops' gradient has a row per token. Summed in half precision
    (by a dense use of the IndexedSlices, or a scatter-add), the rounding of
    each add builds up over an id's many tokens: 100,000 tokens of 1,000 ids
    were 20x further from the exact gradient than TF's composition, whose
    gradient has a row per distinct id.
    """
    if values.dtype not in (tf.float16, tf.bfloat16):
        return values, indices
    return rows_merged(values, indices)


def rows_merged(values, indices):
    """(values, indices) with one row per distinct index, in order of first
    appearance, as TF's gradient of Unique + Gather gives them; half types
    are summed in float32."""
    distinct, position = tf.unique(indices)
    exact = tf.float32 if values.dtype in (tf.float16, tf.bfloat16) else values.dtype
    summed = tf.math.unsorted_segment_sum(tf.cast(values, exact), position, tf.size(distinct))
    return tf.cast(summed, values.dtype), distinct


def optional_attr(op, name, default):
    """op's attr `name`, or `default` where the op has none (a graph built
    before the attr was added)."""
    try:
        return op.get_attr(name)
    except ValueError:
        return default


def grad_form(op, index=None):
    """The op's grad_indices, or feature `index`'s in a grouped op (whose
    list is empty where every feature's is "per_id")."""
    form = optional_attr(op, "grad_indices", [] if index is not None else b"per_id")
    if index is not None:
        form = form[index] if index < len(form) else b"per_id"
    return form.decode()


def string_table_gradient(values, indices, params, form):
    """A string op's params gradient from its gradient op's rows (one per
    token) in `form`, its grad_indices: the form of the TF subgraph it stands
    for (the rewrite sets it), so that optimizers that are not linear in the
    gradient (Adagrad, Adam, Ftrl) update the rows as they did."""
    if form == "dense":
        return tf.math.unsorted_segment_sum(values, indices, tf.shape(params, out_type=tf.int64)[0])
    values, indices = rows_merged(values, indices) if form == "first_appearance" else half_rows_merged(values, indices)
    return table_gradient(values, indices, dense_table_shape(params))


def table_gradient(values, indices, dense_shape):
    """`tf.IndexedSlices(values, indices, dense_shape)`, with one zero row
    (row 0) when no replica's would have one, under a strategy of several.

    Why: MirroredStrategy and MultiWorkerMirroredStrategy aggregate
    IndexedSlices with a collective all-gather, and TF 2.21's (RingGatherer)
    crashes the process when every replica's gradient has no rows, as on a
    step whose bags hold no id with a row (all padding, or hash-table keys
    not yet admitted). Only then: a zero row beside other replicas' rows
    would reach a sparse optimizer as an update of row 0, which momentum,
    RMSProp or Ftrl move (TF1's optimizers; Keras' skip or densify it). So
    the replicas count their rows together first (one scalar all-reduce)."""
    if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
        values, indices = _at_least_one_row(values, indices, dense_shape)
    return tf.IndexedSlices(values, indices, dense_shape)


def _at_least_one_row(values, indices, dense_shape):
    def one_zero_row():
        return tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype), tf.zeros([1], indices.dtype)

    rows = tf.cast(tf.size(indices), tf.float32)
    if not tf.distribute.in_cross_replica_context():  # a gradient outside strategy.run has no replicas to ask
        rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, rows)
    # a table of no rows has no row 0 to name
    empty = tf.logical_and(tf.equal(rows, 0.0), dense_shape[0] > 0)
    return tf.cond(empty, one_zero_row, lambda: (values, indices))


def forward_table(table):
    """`table` (a lookup's table or variable handle), as a gradient built
    outside the tf.function that read it should read it: from where the
    function took it, when it did.

    Why: a gradient that reads a tensor of the forward function makes it an
    output of that function, and a persistent or nested tape (TF's
    higher-order function gradients) also differentiates every such output:
    a variable's handle or value there receives a dense [V, D] zero gradient,
    added to the table's IndexedSlices, which then reach the optimizer
    dense. TF's own gathers escape this only because their gradients read no
    table (its shape is a constant). A table the function captured (a
    handle, or a tensor) is read from outside it instead, and a variable the
    function read (through Identity ops) is read again, from its handle, as the resource ops'
    gradients read it. Casts on the way (a mixed-precision layer's cast of
    its float32 variable) are applied again outside."""
    if not tf.is_symbolic_tensor(table):  # an eager gradient
        return table
    graph = table.graph
    here = tf.compat.v1.get_default_graph()
    if not isinstance(graph, FuncGraph) or here is graph or isinstance(graph, WhileBodyFuncGraph):
        # A loop body's gradient is built in the gradient loop's body, which
        # reads the forward body's tensors through while_v2's accumulators
        # only: a tensor of a graph around the loop there fails to build.
        return table
    source, casts = table, []
    while source.op.type in ("Identity", "Cast"):  # a mixed-precision layer's table is a cast of its variable
        if source.op.type == "Cast":
            casts.append(source.dtype)
        source = source.op.inputs[0]
    outside = _captured_from(graph, source, here)
    if outside is None and source.op.type == "ReadVariableOp":
        handle = _captured_from(graph, source.op.inputs[0], here)
        if handle is not None:
            outside = resource_variable_ops.read_variable_op(handle, source.dtype)
    if outside is None:
        return table
    for dtype in reversed(casts):
        outside = tf.cast(outside, dtype)
    return outside


def _captured_from(graph, internal, here):
    """The tensor `graph` captured as `internal`, where `here` can read it."""
    for external, captured in graph.captures:
        if captured is internal and _readable_from(here, external):
            return external
    return None


def _readable_from(graph, tensor):
    if isinstance(tensor, tf_ops.EagerTensor):
        return True
    while graph is not None:
        if graph is tensor.graph:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False
