"""CtrMultiHotDense (tco.multi_hot_dense) against the TF composition it
replaces: a Dense layer's MatMul over a concatenation of id encodings
(tf.math.bincount(ids, depth, binary_output, axis=-1)) and dense columns,
forward and gradient, with edge cases and bad input."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco


def native(blocks, kernel):
    """The composition: each (ids, depth[, binary]) encoded by bincount, concatenated with the dense blocks."""
    columns = []
    for block in blocks:
        if isinstance(block, tuple):
            ids, depth = block[0], block[1]
            binary = block[2] if len(block) == 3 else True
            columns.append(tf.math.bincount(ids, minlength=depth, maxlength=depth, binary_output=binary, axis=-1,
                                            dtype=kernel.dtype))
        else:
            columns.append(tf.cast(block, kernel.dtype))
    return tf.matmul(tf.concat(columns, axis=1), kernel)


def random_blocks(rng, batch, id_dtype=tf.int64, binary=True):
    """Interleaved blocks: one-hot [B, 1] ids, multi-valued [B, 4] ids (some past the depth), a dense block, a count block."""
    return [
        (tf.constant(rng.integers(0, 7, size=(batch, 1)), id_dtype), 7),
        tf.constant(rng.normal(size=(batch, 2)), tf.float32),
        (tf.constant(rng.integers(0, 12, size=(batch, 4)), id_dtype), 10, binary),  # ids 10, 11 dropped
        (tf.constant(rng.integers(0, 3, size=(batch, 5)), id_dtype), 3, False),
        tf.constant(rng.normal(size=(batch, 1)), tf.float32),
    ]


WIDTH = 7 + 2 + 10 + 3 + 1


def assert_same_forward_and_kernel_gradient(fused_fn, native_fn, kernel):
    np.testing.assert_allclose(fused_fn(), native_fn(), rtol=1e-6, atol=1e-6)
    grads = []
    for fn in (fused_fn, native_fn):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn() ** 2)
        grads.append(tape.gradient(loss, kernel))
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]), grads[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch", [0, 1, 9, 4096])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("binary", [True, False])
def test_matches_matmul_of_concatenated_encodings(rng, batch, id_dtype, binary):
    blocks = random_blocks(rng, batch, id_dtype, binary)
    kernel = tf.constant(rng.normal(size=(WIDTH, 5)), tf.float32)
    got = tco.multi_hot_dense(blocks, kernel)
    assert got.shape == (batch, 5) and got.dtype == tf.float32
    np.testing.assert_allclose(got, native(blocks, kernel), rtol=1e-5, atol=1e-5)


def test_float64_and_a_single_encoding(rng):
    ids = tf.constant(rng.integers(0, 30, size=(50, 3)))
    kernel = tf.constant(rng.normal(size=(30, 4)), tf.float64)
    got = tco.multi_hot_dense([(ids, 30)], kernel)
    assert got.dtype == tf.float64
    np.testing.assert_allclose(got, native([(ids, 30)], kernel), rtol=1e-12, atol=1e-12)


def test_encodings_alone_build_in_a_graph(rng):
    # With no dense block the op's dense list is empty, and graph building
    # cannot infer an empty list's type from the kernel that follows it.
    ids = tf.constant(rng.integers(0, 3, size=(5, 2)))
    kernel = tf.constant(rng.normal(size=(3, 2)), tf.float32)
    f = tf.function(lambda ids, kernel: tco.multi_hot_dense([(ids, 3)], kernel))
    np.testing.assert_allclose(f(ids, kernel), native([(ids, 3)], kernel), rtol=1e-6, atol=1e-6)
    with tf.GradientTape() as tape:
        tape.watch(kernel)
        loss = tf.reduce_sum(f(ids, kernel) ** 2)
    with tf.GradientTape() as want_tape:
        want_tape.watch(kernel)
        want = tf.reduce_sum(native([(ids, 3)], kernel) ** 2)
    np.testing.assert_allclose(tape.gradient(loss, kernel), want_tape.gradient(want, kernel), rtol=1e-5)


def test_repeated_ids_count_once_or_by_their_count():
    kernel = tf.constant(np.arange(4 * 2, dtype=np.float32).reshape(4, 2))
    ids = tf.constant([[3, 3, 1], [0, 0, 0]])
    np.testing.assert_array_equal(tco.multi_hot_dense([(ids, 4)], kernel), [[8, 10], [0, 1]])
    np.testing.assert_array_equal(tco.multi_hot_dense([(ids, 4, False)], kernel), [[14, 17], [0, 3]])


def test_empty_rows_zero_depth_and_ids_past_the_depth(rng):
    kernel = tf.constant(rng.normal(size=(3, 2)), tf.float32)
    no_ids = tf.zeros([4, 0], tf.int64)
    past = tf.constant([[5], [9], [3], [7]], tf.int64)
    dense = tf.constant(rng.normal(size=(4, 3)), tf.float32)
    blocks = [(no_ids, 0), (past, 0), dense, (past, 0, False)]
    got = tco.multi_hot_dense(blocks, kernel)
    np.testing.assert_allclose(got, native(blocks, kernel), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(tco.multi_hot_dense([(no_ids, 3)], kernel), np.zeros((4, 2), np.float32))


def test_gradients_match_matmul(rng):
    blocks = random_blocks(rng, 17)
    kernel = tf.Variable(rng.normal(size=(WIDTH, 3)).astype(np.float32))
    dense = [b for b in blocks if not isinstance(b, tuple)]
    upstream = tf.constant(rng.normal(size=(17, 3)), tf.float32)
    grads = []
    for fn in (tco.multi_hot_dense, native):
        with tf.GradientTape() as tape:
            tape.watch(dense)
            out = fn(blocks, kernel)
        grads.append(tape.gradient(out, [kernel] + dense, output_gradients=upstream))
    for got, want in zip(*grads):
        np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(want), rtol=1e-5, atol=1e-5)


def test_kernel_rows_no_id_names_are_never_read(rng):
    # The MatMul multiplies an inf row by the encoding's zeros (NaN); the
    # fused op reads only the rows the ids name (documented).
    kernel = np.ones((4, 2), np.float32)
    kernel[2] = np.inf
    ids = tf.constant([[0], [3]])
    assert np.isnan(native([(ids, 4)], tf.constant(kernel)).numpy()).all()
    np.testing.assert_array_equal(tco.multi_hot_dense([(ids, 4)], tf.constant(kernel)), np.ones((2, 2)))


def test_negative_id_is_an_error_naming_block_row_and_value():
    kernel = tf.ones([8, 2])
    blocks = [(tf.constant([[1], [2], [0]]), 4), (tf.constant([[0, 1], [2, -7], [-1, 0]]), 4)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        native(blocks, kernel)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -7 in row 1 of block 1 \(an encoding\) is negative"):
        tco.multi_hot_dense(blocks, kernel)
    # Its place among all the blocks, as the Python checks number them: it
    # was its place among the encodings (block 1 here).
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -7 in row 1 of block 2 \(an encoding\)"):
        tco.multi_hot_dense([tf.ones([3, 2])] + blocks, tf.ones([10, 2]))


def test_shape_mismatches_are_errors():
    ids = tf.constant([[1], [2]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"4 columns wide but the kernel has 5 rows"):
        tco.multi_hot_dense([(ids, 4)], tf.ones([5, 2]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rows|Dimension"):
        tco.multi_hot_dense([(ids, 4), tf.ones([3, 1])], tf.ones([5, 2]))


def test_bad_arguments_are_clear_python_errors():
    ids = tf.constant([[1], [2]])
    with pytest.raises(ValueError, match="at least one encoded block"):
        tco.multi_hot_dense([tf.ones([2, 3])], tf.ones([3, 2]))
    with pytest.raises(TypeError, match="int32 or int64"):
        tco.multi_hot_dense([(tf.constant([[1.0]]), 4)], tf.ones([4, 2]))
    with pytest.raises(ValueError, match=r"\[B, L\] matrix"):
        tco.multi_hot_dense([(tf.constant([1, 2]), 4)], tf.ones([4, 2]))
    with pytest.raises(ValueError, match="depth must be >= 0"):
        tco.multi_hot_dense([(ids, -1)], tf.ones([4, 2]))
    with pytest.raises(ValueError, match="ids, depth"):
        tco.multi_hot_dense([(ids,)], tf.ones([4, 2]))


def test_in_a_tf_function_with_unknown_batch(rng):
    kernel = tf.constant(rng.normal(size=(WIDTH, 5)), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.int64), tf.TensorSpec([None, 2], tf.float32),
                                  tf.TensorSpec([None, 4], tf.int64), tf.TensorSpec([None, 5], tf.int64),
                                  tf.TensorSpec([None, 1], tf.float32)])
    def f(a, x, b, c, y):
        return tco.multi_hot_dense([(a, 7), x, (b, 10), (c, 3, False), y], kernel)

    blocks = random_blocks(rng, 33)
    got = f(blocks[0][0], blocks[1], blocks[2][0], blocks[3][0], blocks[4])
    assert f.get_concrete_function().output_shapes.as_list() == [None, 5]
    np.testing.assert_allclose(got, native(blocks, kernel), rtol=1e-5, atol=1e-5)


def test_one_hot_blocks_drop_negative_ids_as_one_hot_does(rng):
    ids = tf.constant([[2], [-1], [9], [0]], tf.int64)
    dense = tf.constant(rng.normal(size=(4, 2)), tf.float32)
    kernel = tf.Variable(rng.normal(size=(5 + 2, 3)).astype(np.float32))
    want_fn = lambda: tf.matmul(tf.concat([tf.one_hot(ids[:, 0], 5), dense], 1), kernel)  # noqa: E731
    got_fn = lambda: tco.multi_hot_dense([(ids, 5, True, True), dense], kernel)  # noqa: E731
    assert_same_forward_and_kernel_gradient(got_fn, want_fn, kernel)


def test_adversarial_attrs_are_errors_not_crashes():
    from tf_ctr_ops.multi_hot import _ops

    ids = tf.constant([[1, 2], [0, 3]], tf.int64)
    kernel = tf.ones([8, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than 8 columns wide but the kernel has 8 rows"):
        _ops.ctr_multi_hot_dense(ids=[ids, ids], dense=[], kernel=kernel, depths=[2**62, 2**62 + 7],
                                 binary_output=[True, True])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one-hot depth 3, but the block is 8 wide"):
        _ops.ctr_multi_hot_dense(ids=[ids], dense=[], kernel=kernel, depths=[8], binary_output=[True],
                                 column_depths=[3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per ids input"):
        _ops.ctr_multi_hot_dense(ids=[ids], dense=[], kernel=kernel, depths=[8], binary_output=[True, False])
    with pytest.raises(tf.errors.InvalidArgumentError, match="layout must order the 1 column blocks"):
        _ops.ctr_multi_hot_dense(ids=[ids], dense=[], kernel=kernel, depths=[8], binary_output=[True], layout=[1])


def test_one_hot_columns_side_by_side(rng):
    # column_depths: the [B, S, d] one-hot of [B, S] ids flattened to [B, S * d] (TF1's input_layer).
    from tf_ctr_ops.multi_hot import _ops

    ids = tf.constant(rng.integers(-1, 5, size=(30, 3)), tf.int64)  # -1 and 4: zeros in their column
    kernel = tf.Variable(rng.normal(size=(3 * 4, 2)).astype(np.float32))

    def native_fn():
        return tf.matmul(tf.reshape(tf.one_hot(ids, 4), [-1, 12]), kernel)

    def fused_fn():
        return _ops.ctr_multi_hot_dense(ids=[ids], dense=[], kernel=kernel, depths=[12], binary_output=[True],
                                        column_depths=[4])

    assert_same_forward_and_kernel_gradient(fused_fn, native_fn, kernel)
