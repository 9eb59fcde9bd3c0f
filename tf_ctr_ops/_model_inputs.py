"""Inputs to verify a rewritten SavedModel on: read from a file or synthesized.

A rewrite is verified by running the original and the rewritten model on the
same inputs, so the inputs must be ones the original accepts. Real CTR models
reject arbitrary values: a `StringLookup` without OOV slots fails on an
unknown token, a `ParseExample` fails on a string that is not a serialized
`tf.Example`. Synthesis therefore tries candidates, the original model being
the judge:

1. plain values: integers sorted in [0, 2) (ids valid in any table, indices
   in canonical order), standard-normal floats, delimited id lists of 1 to 8
   ids ("1,0", "0,1,1,1,1", "1", ...: bags of several lengths, as a pooling
   that rounds differently shows itself only on longer ones), random bools;
   the id lists of an input a string split reads joined as it splits them
   (`tf.strings.split(x)` on whitespace, `"||"` on itself), and, where the
   original refuses those, joined by each delimiter the graph's splits use;
2. serialized `tf.Example`s for every string input, built from the feature
   spec of the graph's ParseExample node (its keys, dtypes and dense shapes),
   a string feature that a lookup finds straight from the parse holding keys
   spread over that lookup's vocabulary (a fused lookup wrong for a later
   entry alone would go unseen on the first);
3. every input a lookup reads directly (a function argument of the input's
   name, as Keras exports them) at once, with the vocabulary of that
   lookup's table (read through the table's object in the SavedModel);
4. input by input, values from the vocabularies the graph's lookup tables
   are initialized with (constant keys, or the SavedModel's asset files),
   keeping a change when the failure moves elsewhere (that input is fixed).
   Each try is a call of the original, so (3) saves most of them: a model
   of 26 lookups took about 60 s of tries without it.

Once the original accepts a candidate, its plain ids (integer batch inputs,
the ids of the plain id lists, and tf.Example int features, where no
vocabulary chose them) are widened: ids 0 and 1 leave untested whatever only
larger ids reach (rows past the first two, a hash or a modulo of the id,
one-hot depths). The widest range the original accepts is kept, trying 1000,
100 and 10, and first any bound the original names when it refuses one
("indices[3] = 999 is not in [0, 57)"), then one id past it (a partitioned
table's shard names its own rows: the whole table is wider); below a range
refused without a bound, halving finds the widest accepted one. Then one string of each plain
string input becomes empty (an empty bag, where TF's splits differ most:
`tf.compat.v1.string_split` gives it no token, `tf.strings.split` one), if
the original accepts that too.
"""

import os
import re
import time
import zipfile

import numpy as np
import tensorflow as tf

from tf_ctr_ops import _errors

BATCH = 4
_PARSE_EXAMPLE_OPS = ("ParseExampleV2", "ParseExample", "ParseSingleExample")
_TABLE_INIT_OPS = ("LookupTableImportV2", "InitializeTableV2")
_SEARCH_SECONDS = 120  # the vocabulary search's budget; each try is one call of the original


class InputsError(ValueError):
    """No inputs were found that the original model accepts."""


# ---------------------------------------------------------------------------
# Reading inputs from a file


def load_inputs_file(path, signatures, unselected=None):
    """{signature key: {input: array}} from `path`, for `signatures` ({key: concrete function}).

    An `.npz` holds arrays named by input (used by every signature that has
    that input) or "SIGNATURE/INPUT"; a signature it holds none of is left
    out (its inputs are synthesized), one it holds some of is an error; the
    arrays of `unselected` signatures
    ({key: concrete function}: those left out of this rewrite) are ignored,
    so that one file serves any subset. Strings as numpy str or bytes arrays. Any other file is read as a TFRecord file (plain or gzip) of
    serialized `tf.Example`s,
    fed to each signature whose one input is a string (a signature that
    parses examples); the other signatures' inputs are synthesized.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputsError(f"inputs file {path} does not exist")
    if os.path.isdir(path):
        raise InputsError(f"inputs file {path} is a folder: give an .npz or a TFRecord file")
    # By content, not by name: an .npz is a zip archive whatever it is called.
    with open(path, "rb") as f:
        starts_as_zip = f.read(4) == b"PK\x03\x04"
    if starts_as_zip or zipfile.is_zipfile(path):
        return _inputs_from_npz(path, signatures, unselected)
    return _inputs_from_tfrecord(path, signatures)


def _tfrecord_records(path):
    """The records of a TFRecord file, plain or gzip (`TFRecordWriter` with
    `options="GZIP"`). Tried plain first: a plain file's first bytes (its
    first record's length) may look like gzip's magic number."""
    try:
        return [r.numpy() for r in tf.data.TFRecordDataset(path)]
    except tf.errors.OpError as plain_error:
        try:
            return [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type="GZIP")]
        except tf.errors.OpError:
            raise plain_error from None


_S_DROPS_NULS = ("drops each string's trailing NUL bytes: serialized tf.Examples (which may end in one) go in a "
                 "TFRecord file for a signature whose one input they are, or to optimize_saved_model's "
                 "sample_inputs as an object array")


def nul_hint(path, error):
    """A hint for a model failing on an inputs file with `error`: a bytes
    ('S') array of an .npz may have lost trailing NUL bytes, which breaks
    serialized protos. Only for a failure to parse: an id out of range has
    nothing to do with it."""
    if "pars" not in error.lower():
        return ""
    try:
        with np.load(path, allow_pickle=False) as data:
            has_bytes = any(data[k].dtype.kind == "S" for k in data.files)
    except (OSError, ValueError, zipfile.BadZipFile):  # not an .npz (a TFRecord file)
        return ""
    return f"; note that a dtype='S' array in an .npz {_S_DROPS_NULS}" if has_bytes else ""


def _input_keys(name, spec):
    """The keys an input goes by: its argument name and, where TF had to
    make that a Python name (`feat/x` -> `feat_x`), its SignatureDef key,
    which saved_model_cli and servers show."""
    signature_def_key = spec.name if spec.name and not spec.name.isidentifier() else None
    return [name] + ([signature_def_key] if signature_def_key not in (None, name) else [])


def _candidates(key, name, spec):
    """An input's names in an .npz, the signature's own (SIGNATURE/INPUT)
    before those every signature may take."""
    keys = _input_keys(name, spec)
    return [f"{key}/{k}" for k in keys] + keys


def _inputs_from_npz(path, signatures, unselected=None):
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputsError(f"inputs file {path} is not a readable .npz: {e}") from None
    with data:
        arrays = {}
        for k in data.files:
            try:
                arrays[k] = data[k]
            except ValueError as e:
                if "allow_pickle" in str(e):  # an object array: loading it would unpickle, i.e. run code
                    raise InputsError(f"inputs file {path}: array {k!r} is an object array, which is not loaded "
                                      f"(it would need pickle); save strings as a bytes or str array, e.g. "
                                      f"np.array(values, dtype='S'), which {_S_DROPS_NULS}") from e
                raise _unreadable_member(path, k, e) from None
            except (OSError, AttributeError, zipfile.BadZipFile) as e:  # a member that is no .npy
                raise _unreadable_member(path, k, e) from None
            if not isinstance(arrays[k], np.ndarray):  # np.load hands a member not named .npy over as bytes
                raise _unreadable_member(path, k, "its bytes are no .npy array")
    if not arrays:
        raise InputsError(f"inputs file {path} holds no arrays")
    out, used = {}, set()
    for key, fn in signatures.items():
        specs = fn.structured_input_signature[1]
        given = {}
        for name, spec in specs.items():
            for candidate in _candidates(key, name, spec):
                if candidate in arrays:
                    given[name] = _file_array_as_input(path, candidate, arrays[candidate], spec)
                    used.add(candidate)
                    break
        if not given:
            continue  # none of its inputs: synthesized, as without a file
        missing = [_input_keys(n, specs[n])[-1] for n in specs if n not in given]
        if missing:
            raise InputsError(f"inputs file {path} has no array for input(s) {missing} of signature {key!r} "
                              f"(name them INPUT or {key}/INPUT); it has {sorted(arrays)}")
        out[key] = given
    for key, fn in (unselected or {}).items():  # left out of this rewrite: one file serves any subset
        used |= {c for name, spec in fn.structured_input_signature[1].items() for c in _candidates(key, name, spec)}
    unused = sorted(set(arrays) - used)
    if unused:  # a misspelt name would otherwise go unnoticed
        inputs = sorted({f"{k}/{_input_keys(n, spec)[-1]}" for k, fn in signatures.items()
                         for n, spec in fn.structured_input_signature[1].items()})
        raise InputsError(f"inputs file {path} has array(s) {unused} that no signature takes; the inputs are "
                          f"{inputs} (SIGNATURE/INPUT, or INPUT alone for every signature)")
    return out


def _unreadable_member(path, member, why):
    why = f"{type(why).__name__}: {why}" if isinstance(why, Exception) else why
    return InputsError(f"inputs file {path}: member {member!r} is not a readable .npy array ({why})")


# The numpy kinds an input of each kind of dtype takes: integers convert to
# floats, never the other way (a float id would be truncated).
_ACCEPTED_KINDS = {"i": "iu", "u": "iu", "f": "iuf", "c": "iufc", "b": "b", "O": "USO"}


def _file_array_as_input(path, name, array, spec):
    """`array` as input `spec` takes it, or an InputsError naming what differs."""
    want = np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
    if array.dtype.kind not in _ACCEPTED_KINDS.get(want.kind, want.kind):
        raise InputsError(f"array {name!r} of inputs file {path} is {array.dtype}; the input is "
                          f"{spec.dtype.name}")
    if not spec.shape.is_compatible_with(array.shape):
        raise InputsError(f"array {name!r} of inputs file {path} has shape {list(array.shape)}; the input is "
                          f"{spec.shape}")
    if want.kind in "iu" and array.size:
        info = np.iinfo(want)
        if array.min() < info.min or array.max() > info.max:
            raise InputsError(f"array {name!r} of inputs file {path} holds values outside {spec.dtype.name}'s "
                              f"range [{info.min}, {info.max}]")
    return array.astype(want)


def _inputs_from_tfrecord(path, signatures):
    try:
        records = _tfrecord_records(path)
    except tf.errors.OpError as e:
        raise InputsError(f"inputs file {path} is neither an .npz nor a readable TFRecord file: "
                          f"{_errors.summary(e)}") from None
    if not records:
        size = os.path.getsize(path)
        raise InputsError(f"inputs file {path} holds no records" if not size else
                          f"inputs file {path} is neither an .npz nor a TFRecord file (no whole record in its "
                          f"{size} bytes)")
    out, others = {}, {}
    for key, fn in signatures.items():
        specs = fn.structured_input_signature[1]
        strings = [k for k, s in specs.items() if s.dtype == tf.string]
        if len(specs) != 1 or len(strings) != 1:
            others[key] = sorted(specs)  # synthesized, as without a file
            continue
        spec = specs[strings[0]]
        if not spec.shape.is_compatible_with([len(records)]):
            raise InputsError(f"a TFRecord inputs file feeds a vector of serialized tf.Examples; input "
                              f"{strings[0]!r} of signature {key!r} is {spec.shape}: use an .npz file")
        out[key] = {strings[0]: np.array(records, dtype=object)}
    if not out:
        key, names = next(iter(others.items()))
        raise InputsError(f"a TFRecord inputs file feeds a signature with one string input (serialized "
                          f"tf.Examples); signature {key!r} takes {names}: use an .npz file")
    return out


# ---------------------------------------------------------------------------
# What the graph knows about valid inputs


def _bound_functions(meta_graph):
    """(function, {argument: object-graph node id}) for each saved concrete
    function with bound inputs: its last arguments, bound to the objects it
    captured (constants, resources, variables)."""
    functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    for name, saved in meta_graph.object_graph_def.concrete_functions.items():
        fdef = functions.get(name)
        if fdef is None or not saved.bound_inputs:
            continue
        args = [a.name for a in fdef.signature.input_arg]
        yield fdef, dict(zip(args[len(args) - len(saved.bound_inputs):], saved.bound_inputs))


def _captured_constants(meta_graph):
    """{function: {argument: Const node}}: a TF2 SavedModel passes the constants
    a function captured (a vocabulary, say) as its last arguments, bound to
    object-graph constants that name Const nodes of the outer graph."""
    consts = {n.name: n for n in meta_graph.graph_def.node if n.op == "Const"}
    objects = meta_graph.object_graph_def
    out = {}
    for fdef, bound in _bound_functions(meta_graph):
        for arg, node_id in bound.items():
            node = objects.nodes[node_id]
            if node.WhichOneof("kind") == "constant" and node.constant.operation in consts:
                out.setdefault(fdef.signature.name, {})[arg] = consts[node.constant.operation]
    return out


def _function_scope(fdef, captured):
    """{name: node} a reference in `fdef` may name: its nodes and the constants
    bound to its arguments."""
    by_name = dict(captured.get(fdef.signature.name, {}))
    by_name.update((n.name, n) for n in fdef.node_def)
    return by_name


def _all_nodes(meta_graph):
    """(node, resolver) for every node of the graph and its library functions;
    resolver maps an input reference to the node it names in the same scope
    (a captured constant for a function's bound argument)."""
    graph_def = meta_graph.graph_def
    captured = _captured_constants(meta_graph)
    scopes = [({n.name: n for n in graph_def.node}, list(graph_def.node))]
    for fdef in graph_def.library.function:
        scopes.append((_function_scope(fdef, captured), list(fdef.node_def)))
    for by_name, nodes in scopes:

        def resolve(ref, by_name=by_name):
            return by_name.get(ref.lstrip("^").split(":")[0])

        for node in nodes:
            yield node, resolve


def _init_keys(fdef, by_name, functions=None, depth=0):
    """The constant keys a table initializer in `fdef` imports, or None. A
    SavedModel loaded and saved again wraps each initializer in a call of
    the original, its constants passed as the call's inputs: calls are
    followed, their arguments standing for what the caller passes."""
    for node in fdef.node_def:
        if node.op in _TABLE_INIT_OPS and len(node.input) > 1:
            keys = _const_value(by_name.get(node.input[1].split(":")[0]))
            if keys is not None and keys.size:
                return keys.ravel()
    for node in fdef.node_def:
        callee = (functions or {}).get(node.attr["f"].func.name) if "f" in node.attr else None
        if callee is None or depth >= 4:
            continue
        scope = {arg.name: by_name.get(ref.split(":")[0])
                 for arg, ref in zip(callee.signature.input_arg, node.input) if not ref.startswith("^")}
        scope.update((n.name, n) for n in callee.node_def)
        keys = _init_keys(callee, scope, functions, depth + 1)
        if keys is not None:
            return keys
    return None


def _lookup_vocabularies(meta_graph, delimiters=None):
    """{argument name: vocabulary} for each LookupTableFindV2 of a function
    whose keys are an argument of the function and whose table is a tracked
    resource (a StaticHashTable, a Keras lookup's table): the keys its
    `_initialize` function imports. Keras names those arguments after the
    model's inputs, which a FunctionDef's argument names lower-case (`sC`
    becomes `sc`): each argument goes by its `_user_specified_name`.
    `delimiters`: a dict that gets {argument name: what to join its ids
    with} for each argument a string split reads (see _id_list_delimiter)."""
    graph_def, objects = meta_graph.graph_def, meta_graph.object_graph_def
    functions = {f.signature.name: f for f in graph_def.library.function}
    captured = _captured_constants(meta_graph)

    def function_keys(name):
        fdef = functions.get(name)
        return None if fdef is None else _init_keys(fdef, _function_scope(fdef, captured), functions)

    def table_keys(node_id):
        node = objects.nodes[node_id]
        if node.WhichOneof("kind") != "resource":
            return None
        for child in node.children:
            if child.local_name != "_initialize":
                continue
            init = objects.nodes[child.node_id]
            kind = init.WhichOneof("kind")
            names = (list(init.function.concrete_functions) if kind == "function" else
                     [init.bare_concrete_function.concrete_function_name] if kind == "bare_concrete_function" else [])
            for name in names:
                keys = function_keys(name)
                if keys is not None:
                    return keys
        return None

    out = {}

    def visit(fdef, inputs, handles, depth):
        """Table reads in `fdef` whose keys are one of `inputs` (argument ->
        the model's input name) and whose table is one of `handles`
        (argument -> object node), and in the functions it calls: a
        rewritten model's signature calls its body, the function that Keras'
        `serve` became calls the signature."""
        inputs = _through_pass_throughs(fdef, inputs)
        scope = _function_scope(fdef, captured)
        for node in fdef.node_def:
            split = node.input[0].split(":")[0] if node.op in _SPLIT_OPS and len(node.input) > 1 else None
            if delimiters is not None and split in inputs:
                delimiter = _id_list_delimiter(node.op, _const_value(scope.get(node.input[1].split(":")[0])))
                if delimiter is not None:
                    delimiters.setdefault(inputs[split], delimiter)
            for handle, keys in _table_reads(node):
                if keys in inputs and handle in handles and inputs[keys] not in out:
                    vocabulary = table_keys(handles[handle])
                    if vocabulary is not None:
                        out[inputs[keys]] = vocabulary
            callee = functions.get(node.attr["f"].func.name) if "f" in node.attr else None
            if callee is None or depth >= 4:
                continue
            passed = [(arg.name, ref.split(":")[0]) for arg, ref in zip(callee.signature.input_arg, node.input)]
            visit(callee, {arg: inputs[ref] for arg, ref in passed if ref in inputs},
                  {arg: handles[ref] for arg, ref in passed if ref in handles}, depth + 1)

    for fdef, bound in _bound_functions(meta_graph):
        inputs = {a.name: _user_specified_name(fdef, i) or a.name
                  for i, a in enumerate(fdef.signature.input_arg) if a.name not in bound}
        visit(fdef, inputs, bound, 0)
    return out


def _through_pass_throughs(fdef, inputs):
    """`inputs` ({name: input name}) with the nodes of `fdef` that pass the
    values of one of them on (Identity; the rewrite's EnsureShape of a feed
    and Reshape of keys to a vector)."""
    inputs = dict(inputs)
    grown = True
    while grown:
        grown = False
        for node in fdef.node_def:
            if node.op in ("Identity", "EnsureShape", "Reshape") and node.name not in inputs and node.input:
                source = node.input[0].split(":")[0]
                if source in inputs:
                    inputs[node.name] = inputs[source]
                    grown = True
    return inputs


# Ops that find keys in a table: (table handle input, keys input).
_TABLE_READS = {"LookupTableFindV2": (0, 1), "CtrVocabEmbedding": (0, 1), "CtrVocabMultiHot": (0, 1),
                "CtrVocabIndicator": (0, 2), "CtrVocabEmbeddingLookup": (0, 3)}


def _table_reads(node):
    """(table handle, keys) argument names `node` reads, for each table it finds keys in."""
    if node.op == "CtrConcatVocabEmbedding":
        n = node.attr["N"].i
        pairs = [(i, n + i) for i in range(n)]
    else:
        pairs = [_TABLE_READS[node.op]] if node.op in _TABLE_READS else []
    return [(node.input[h].split(":")[0], node.input[k].split(":")[0]) for h, k in pairs
            if k < len(node.input) and not node.input[k].startswith("^")]


def _user_specified_name(fdef, index):
    attr = fdef.arg_attr[index].attr.get("_user_specified_name") if index in fdef.arg_attr else None
    return attr.s.decode() if attr is not None and attr.s else None


def _const_value(node):
    if node is None or node.op != "Const":
        return None
    return tf.make_ndarray(node.attr["value"].tensor)


def _asset_vocabularies(model_dir):
    """{file name: its keys} for each text file in the SavedModel's assets/
    (each line's first tab-separated field, as TextFileIndex.WHOLE_LINE
    tables and Keras' vocabulary files read them)."""
    folder = os.path.join(model_dir, "assets")
    vocabularies = {}
    if not os.path.isdir(folder):
        return vocabularies
    for name in sorted(os.listdir(folder)):
        try:
            with open(os.path.join(folder, name), "rb") as f:
                lines = [line.rstrip(b"\r\n").split(b"\t")[0] for line in f.read(1 << 20).splitlines()]
        except OSError:
            continue
        lines = [line for line in lines if line]
        if lines:
            vocabularies[name] = np.array(lines, dtype=object)
    return vocabularies


def _integers(lines):
    """The lines as int64 values, or None where one is not an integer."""
    try:
        return np.array([int(line) for line in lines], np.int64)
    except (ValueError, OverflowError):
        return None


class GraphFacts:
    """Vocabularies and example specs read off a SavedModel's MetaGraphDefs."""

    def __init__(self, meta_graphs, model_dir=None):
        self.string_vocabularies, self.int_vocabularies, self.example_specs = [], [], []
        self.input_vocabularies = {}  # input name -> the vocabulary of the lookup that reads it
        self.example_vocabularies = {}  # tf.Example feature key -> the vocabulary of the lookup that reads it
        # signature key -> its SparseTensor inputs (TF1), which no synthesized values could fit
        self.sparse_inputs = {}
        self.delimiters = []  # what the graph's string splits split on, other than ","
        self.input_delimiters = {}  # input name -> what the split that reads it splits on, other than ","
        for meta_graph in meta_graphs:
            for key, signature in meta_graph.signature_def.items():
                sparse = sorted(k for k, info in signature.inputs.items() if info.WhichOneof("encoding") == "coo_sparse")
                if sparse:
                    self.sparse_inputs.setdefault(key, sparse)
            for name, vocabulary in _lookup_vocabularies(meta_graph, self.input_delimiters).items():
                self.input_vocabularies.setdefault(name, vocabulary)
            for node, resolve in _all_nodes(meta_graph):
                if node.op in _TABLE_INIT_OPS and len(node.input) > 1:
                    keys = _const_value(resolve(node.input[1]))
                    if keys is not None and keys.size:
                        target = self.string_vocabularies if keys.dtype.kind in "OSU" else self.int_vocabularies
                        target.append(keys.ravel())
                elif node.op in _PARSE_EXAMPLE_OPS:
                    spec = _example_spec(node, resolve)
                    if spec:
                        self.example_specs.append(spec)
                elif node.op in _SPLIT_OPS and len(node.input) > 1:
                    delimiter = _id_list_delimiter(node.op, _const_value(resolve(node.input[1])))
                    if delimiter is not None and delimiter not in self.delimiters:
                        self.delimiters.append(delimiter)
        assets = _asset_vocabularies(model_dir) if model_dir else {}
        for meta_graph in meta_graphs:
            for key, vocabulary in _example_vocabularies(meta_graph, assets).items():
                self.example_vocabularies.setdefault(key, vocabulary)
        for vocabulary in assets.values():
            # A file's keys are text, an integer table's too (IntegerLookup's
            # vocabulary file): such a file is a vocabulary of both kinds.
            self.string_vocabularies.append(vocabulary)
            integers = _integers(vocabulary)
            if integers is not None:
                self.int_vocabularies.append(integers)

    def tokens(self):
        """A few string values, taken from the vocabularies when there are any."""
        picked = [v[0] for v in self.string_vocabularies]
        return [t if isinstance(t, bytes) else str(t).encode() for t in picked] or [b"1"]


_FILE_INIT_OPS = ("InitializeTableFromTextFileV2",)
_SPLIT_OPS = ("StringSplitV2", "StringSplit")


def _id_list_delimiter(op, sep):
    """What to join ids with for a `op` split on the constant `sep`, or None
    where "," does (or no join of ids 0 and 1 would: a digit). StringSplitV2
    splits on whitespace where sep is empty; v1's StringSplit on each
    character of its delimiter (its first is one)."""
    if sep is None or sep.size != 1:
        return None
    sep = sep.item() if isinstance(sep.item(), bytes) else str(sep.item()).encode()
    delimiter = (sep or b" ") if op == "StringSplitV2" else sep[:1]
    if delimiter == b"," or re.search(rb"\d", delimiter):
        return None
    return delimiter


def _example_vocabularies(meta_graph, assets):
    """{tf.Example feature key: vocabulary} where a LookupTableFindV2 finds
    the values a ParseExample node parsed for that key (TF1 feature columns
    look them up straight from the parse) in a table initialized from
    constant keys or from one of `assets` ({file name: keys})."""
    vocabularies, reads = {}, []
    for node, resolve in _all_nodes(meta_graph):
        if node.op in _TABLE_INIT_OPS + _FILE_INIT_OPS and len(node.input) > 1:
            table, _ = _through_identities(node.input[0], resolve)
            vocabulary = _init_vocabulary(node, resolve, assets)
            if table is not None and vocabulary is not None:
                vocabularies.setdefault(id(table), vocabulary)
        elif node.op == "LookupTableFindV2" and len(node.input) > 1:
            parse, ref = _through_identities(node.input[1], resolve)
            if parse is not None and parse.op in _PARSE_EXAMPLE_OPS:
                reads.append((_through_identities(node.input[0], resolve)[0], _parsed_key(parse, ref, resolve)))
    out = {}
    for table, key in reads:
        if key is not None and id(table) in vocabularies:
            out.setdefault(key, vocabularies[id(table)])
    return out


def _through_identities(ref, resolve):
    """(node, reference) that `ref` names once Identity nodes are passed."""
    node = resolve(ref)
    while node is not None and node.op == "Identity" and node.input:
        ref = node.input[0]
        node = resolve(ref)
    return node, ref


def _init_vocabulary(node, resolve, assets):
    """The keys table initializer `node` gives its table, or None."""
    if node.op in _TABLE_INIT_OPS:
        keys = _const_value(resolve(node.input[1]))
        return keys.ravel() if keys is not None and keys.size else None
    path = _const_value(_through_identities(node.input[1], resolve)[0])
    if path is None or path.size != 1:
        return None
    return assets.get(os.path.basename(path.item().decode(errors="replace")))


def _parsed_key(parse, ref, resolve):
    """The feature key whose values output `ref` of ParseExample node `parse`
    names, or None for another output (indices, shapes, row splits)."""
    spec = _example_spec(parse, resolve)
    if not spec:
        return None
    counts = {kind: sum(1 for _, k, _, _ in spec if k == kind) for kind in ("sparse", "dense", "ragged")}
    ns, nd = counts["sparse"], counts["dense"]
    parts = ref.split(":")
    if len(parts) == 3:  # a function's "node:output_arg:index"
        starts = {"sparse_values": ns, "dense_values": 3 * ns, "ragged_values": 3 * ns + nd}
        if parts[1] not in starts:
            return None
        index = starts[parts[1]] + int(parts[2])
    else:
        index = int(parts[1]) if len(parts) == 2 else 0
    for kind, start in (("sparse", ns), ("dense", 3 * ns), ("ragged", 3 * ns + nd)):
        if start <= index < start + counts[kind]:
            return [key for key, k, _, _ in spec if k == kind][index - start]
    return None


def _example_spec(node, resolve):
    """[(key, kind, dtype, dense shape or None)] of a ParseExample node; kind is
    "dense", "sparse" or "ragged"."""
    attr = node.attr
    if node.op == "ParseSingleExample":
        sparse_keys = list(attr["sparse_keys"].list.s)
        dense_keys = list(attr["dense_keys"].list.s)
        ragged_keys = []
    elif node.op == "ParseExample":
        ns, nd = attr["Nsparse"].i, attr["Ndense"].i
        refs = list(node.input)[2:2 + ns + nd]
        values = [_const_value(resolve(r)) for r in refs]
        if any(v is None for v in values):
            return None
        sparse_keys, dense_keys, ragged_keys = [v.item() for v in values[:ns]], [v.item() for v in values[ns:]], []
    else:
        lists = [_const_value(resolve(node.input[i])) for i in (2, 3, 4)]
        if any(v is None for v in lists):
            return None
        sparse_keys, dense_keys, ragged_keys = (list(v.ravel()) for v in lists)
    sparse_types = list(attr["sparse_types"].list.type)
    dense_types = list(attr["Tdense"].list.type)
    dense_shapes = [tf.TensorShape(s).as_list() if not s.unknown_rank else None for s in attr["dense_shapes"].list.shape]
    ragged_types = list(attr["ragged_value_types"].list.type) if "ragged_value_types" in attr else []
    spec = [(k, "sparse", t, None) for k, t in zip(sparse_keys, sparse_types)]
    spec += [(k, "dense", t, s) for k, t, s in zip(dense_keys, dense_types, dense_shapes)]
    spec += [(k, "ragged", t, None) for k, t in zip(ragged_keys, ragged_types)]
    return [(k if isinstance(k, bytes) else str(k).encode(), kind, tf.as_dtype(t), s) for k, kind, t, s in spec]


def _feature(dtype, count, row, tokens, id_high):
    if dtype == tf.string:
        return _bytes_feature([tokens[(row + i) % len(tokens)] for i in range(count)])
    if dtype.is_integer:
        # row 0 holds the top id; the others repeat small ones, as Zipf ids do
        ids = [id_high - 1 if row == 0 else (row + i) % min(id_high, 3) for i in range(count)]
        return tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
    return tf.train.Feature(float_list=tf.train.FloatList(value=[0.25 * (row + i + 1) for i in range(count)]))


def _bytes_feature(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[v if isinstance(v, bytes) else str(v).encode() for v in values]))


def _vocabulary_feature(vocabulary, start, count, slots, last_row, tokens):
    """Keys `start` to `start + count` of the `slots` keys a string feature
    has in the batch, spread over the `vocabulary` its lookup reads (the
    batch reaches later entries, not only the first); the last row's last
    key is one of `tokens` (other vocabularies' keys: a miss). Counts stay
    as other features' are: a weight feature has as many values as keys."""
    stride = max(1, len(vocabulary) // slots)
    values = [vocabulary[((start + i) * stride) % len(vocabulary)] for i in range(count)]
    if last_row:
        values[-1] = tokens[start % len(tokens)]
    return _bytes_feature(values)


def _counts(kind, shape, batch):
    """The number of values a feature has in each row of the batch."""
    if kind == "dense":
        return [1 if shape is None or any(d is None or d < 0 for d in shape) else int(np.prod(shape))] * batch
    return [1 + row % 2 for row in range(batch)]


def serialized_examples(specs, tokens, batch=BATCH, id_high=2, vocabularies=None):
    """`batch` serialized tf.Examples holding every feature of `specs`, their
    integers in [0, id_high) (an int, or a dict by feature key), their
    strings from `tokens`, or, for the keys of `vocabularies` ({feature key:
    vocabulary}), spread over the vocabulary their lookup reads."""
    counts = {key: _counts(kind, shape, batch) for spec in specs for key, kind, _, shape in spec}
    out = []
    for row in range(batch):
        features = {}
        for spec in specs:
            for key, kind, dtype, shape in spec:
                count = counts[key][row]
                high = id_high.get(key, 2) if isinstance(id_high, dict) else id_high
                vocabulary = (vocabularies or {}).get(key)
                features[key.decode(errors="replace")] = (
                    _vocabulary_feature(vocabulary, sum(counts[key][:row]), count, sum(counts[key]),
                                        row == batch - 1, tokens)
                    if vocabulary is not None and dtype == tf.string
                    else _feature(dtype, count, row, tokens, high))
        out.append(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return np.array(out, dtype=object)


# ---------------------------------------------------------------------------
# Synthesis, judged by the original model


# The plain strings: ids 0 and 1, valid in any table, in bags of 2, 5, 1 and 8.
ID_LISTS = (b"1,0", b"0,1,1,1,1", b"1", b"1,1,0,1,1,1,1,0")


def flattened_sparse(specs):
    """[(indices, values, dense_shape)] input names of the SparseTensors a
    TF2 signature takes: TF flattens a SparseTensorSpec argument `x` into
    the inputs x (indices, int64 [N, R]), x_1 (values, [N]) and x_2
    (dense_shape, int64 [R]), whose values must fit each other."""
    out = []
    for k, indices in specs.items():
        values, dense_shape = specs.get(f"{k}_1"), specs.get(f"{k}_2")
        if values is None or dense_shape is None:
            continue
        if (indices.dtype == tf.int64 and dense_shape.dtype == tf.int64 and indices.shape.rank == 2
                and values.shape.rank == 1 and dense_shape.shape.rank == 1
                and indices.shape.as_list()[1] == dense_shape.shape.as_list()[0]):
            out.append((k, f"{k}_1", f"{k}_2"))
    return out


def flattened_ragged(specs):
    """[(values, row_splits)] input names of the RaggedTensors (ragged_rank 1)
    a TF2 signature takes: TF flattens a RaggedTensorSpec argument `x` into
    the inputs x (values, [N, ...]) and x_1 (row_splits, int64 or int32
    [B + 1]), whose values must fit each other."""
    sparse = {k for parts in flattened_sparse(specs) for k in parts}
    out = []
    for k, values in specs.items():
        splits = specs.get(f"{k}_1")
        if splits is None or f"{k}_2" in specs or k in sparse or f"{k}_1" in sparse:
            continue
        if (splits.dtype in (tf.int32, tf.int64) and splits.shape.rank == 1 and values.shape.rank is not None
                and values.shape.rank >= 1 and values.shape.as_list()[0] is None):
            out.append((k, f"{k}_1"))
    return out


def sparse_structure_keys(specs):
    """The inputs that hold a SparseTensor's indices or dense_shape, or a
    RaggedTensor's row_splits: fixed by plain_inputs, never searched (a new
    value would not fit the rest)."""
    sparse = {k for indices, _, dense_shape in flattened_sparse(specs) for k in (indices, dense_shape)}
    return sparse | {splits for _, splits in flattened_ragged(specs)}


def _sparse_parts(indices_spec, values_spec, rng, dim):
    """(indices, values, dense_shape) of a [dim, 3, 1, ...] SparseTensor
    whose rows hold 1, 0, 2 and 3 entries in turn: an empty row among them."""
    rank = indices_spec.shape.as_list()[1] or 2
    counts = np.resize([1, 0, 2, 3], dim)
    rows = np.repeat(np.arange(dim), counts)
    columns = np.concatenate([np.arange(c) for c in counts]) if dim else np.zeros(0, np.int64)
    indices = np.zeros((rows.size, rank), np.int64)
    indices[:, 0] = rows
    indices[:, 1] = columns
    dense_shape = np.array([dim, 3] + [1] * (rank - 2), np.int64)
    dtype = tf.as_dtype(values_spec.dtype)
    if dtype == tf.string:
        values = _fill(np.array([b"1", b"0"], dtype=object), [rows.size])
    elif dtype.is_integer:
        values = rng.integers(0, 2, size=rows.size).astype(dtype.as_numpy_dtype)
    else:
        values = rng.standard_normal(rows.size).astype(dtype.as_numpy_dtype if dtype.is_floating else np.float32)
    return indices, values, dense_shape


def _plain_value(spec, rng, dim, first=None):
    """Values for one TensorSpec, its unknown dims `dim` (the first `first`
    when given)."""
    dims = spec.shape.as_list() if spec.shape.rank is not None else [None]
    shape = [first if i == 0 and first is not None else dim if d is None else d for i, d in enumerate(dims)]
    dtype = tf.as_dtype(spec.dtype)
    if dtype.is_integer:
        value = np.sort(rng.integers(0, 2, size=shape).ravel()).reshape(shape)
    elif dtype.is_floating:
        value = rng.standard_normal(shape)
    elif dtype == tf.string:
        value = _fill(np.array(ID_LISTS, dtype=object), shape)
    elif dtype == tf.bool:
        value = rng.integers(0, 2, size=shape).astype(bool)
    else:
        value = np.zeros(shape)
    return np.asarray(value).astype(dtype.as_numpy_dtype) if dtype != tf.string else value


def _ragged_parts(values_spec, splits_spec, rng, dim):
    """(values, row_splits) of `dim` ragged rows holding 1, 0, 2 and 3
    values in turn: an empty row among them."""
    splits = np.concatenate([[0], np.cumsum(np.resize([1, 0, 2, 3], dim))]).astype(
        tf.as_dtype(splits_spec.dtype).as_numpy_dtype)
    return _plain_value(values_spec, rng, dim, first=int(splits[-1])), splits


def plain_inputs(specs, rng, dim=BATCH):
    """Candidate 1: values from the TensorSpecs alone (the parts of each
    SparseTensor or RaggedTensor input fitting each other)."""
    out = {key: _plain_value(spec, rng, dim) for key, spec in specs.items()}
    for indices, values, dense_shape in flattened_sparse(specs):
        out[indices], out[values], out[dense_shape] = _sparse_parts(specs[indices], specs[values], rng, dim)
    for values, splits in flattened_ragged(specs):
        out[values], out[splits] = _ragged_parts(specs[values], specs[splits], rng, dim)
    return out


def _fill(values, shape):
    size = int(np.prod(shape)) if shape else 1
    flat = [values[i % len(values)] for i in range(size)]
    return np.array(flat, dtype=values.dtype if values.dtype.kind not in "OSU" else object).reshape(shape)


def _known_vocabularies(specs, facts):
    """{input: its lookup's vocabulary, as values of the input}."""
    return {k: _as_input(facts.input_vocabularies[k], s) for k, s in specs.items()
            if k in facts.input_vocabularies and _as_input(facts.input_vocabularies[k], s) is not None}


def _with_vocabulary_values(inputs, how, keys, specs, facts, run):
    """`inputs` with the vocabulary of each of `keys`' lookups, in order, at
    the even flat positions of that input (its other values stay), where the
    original accepts them: a lookup with out-of-vocabulary slots accepts the
    plain values, and a fused find compared on misses alone would be
    compared on its default row alone."""
    known = {k: v for k, v in _known_vocabularies(specs, facts).items() if k in keys}
    trial = dict(inputs)
    for k, vocabulary in known.items():
        flat = np.array(inputs[k], copy=True).reshape(-1)
        even = flat[::2]
        flat[::2] = [vocabulary[i % len(vocabulary)] for i in range(even.size)]
        trial[k] = flat.reshape(np.shape(inputs[k]))
    if not known or run(trial) is not None:
        return inputs, how
    return trial, f"{how}, vocabulary keys"


_ID_RANGES = (1000, 100, 10)
_NAMED_BOUND = re.compile(r"(?:is not in|out of range) \[0, ?(\d+)\)")
_PARTITION_INDEX = re.compile(r"partitions\[[\d, ]*\] = -?\d+ $")


def _named_bound(error):
    """The id bound an error names (a gather's or a lookup's range), or None.
    Not a DynamicPartition's partition count: a partitioned table splits its
    ids by it (`partitions[0] = 142 is not in [0, 3)`), and its ids' own
    range is wider."""
    for m in _NAMED_BOUND.finditer(error):
        if not _PARTITION_INDEX.search(error[:m.start()]):
            return int(m.group(1))
    return None


def _spread_ids(rng, high, shape):
    """Sorted ids in [0, high) of `shape`, small ones frequent (log-uniform,
    as CTR ids are skewed), with repeats and the top id high - 1."""
    size = int(np.prod(shape)) if shape else 1
    flat = np.sort(np.floor(np.power(float(high), rng.random(size))).astype(np.int64) - 1)
    if size:
        flat[-1] = high - 1
    return flat.reshape(shape)


_ID = re.compile(rb"\d+")


def _spread_id_lists(rng, high, id_lists):
    """`id_lists` (ID_LISTS, joined by whichever delimiter) with the same
    bags and delimiters, their ids spread over [0, high)."""
    flat = list(np.ravel(id_lists))
    ids = iter(_spread_ids(rng, high, (sum(len(_ID.findall(v)) for v in flat),))[::-1])  # the top id first
    out = [_ID.sub(lambda _: b"%d" % next(ids), v) for v in flat]
    return np.array(out, dtype=object).reshape(np.shape(id_lists))


def _joined_by(inputs, delimiter, keys):
    """`inputs` with the id lists of the string inputs `keys` joined by `delimiter`."""
    return dict(inputs, **{k: np.array([v.replace(b",", delimiter) for v in np.ravel(inputs[k])],
                                       dtype=object).reshape(np.shape(inputs[k])) for k in keys})


_BISECT_TRIES = 8


def _widest_ids(build, run):
    """(inputs, high) for the widest id range `high` whose `build(high)` the
    original accepts, or (None, None) when it accepts none of them."""
    ladder, refused, named = list(_ID_RANGES), None, {}
    while ladder:
        high = ladder.pop(0)
        trial = build(high)
        error = run(trial)
        if error is None:
            if high in named:
                return _past_named_bound(build, run, trial, high, named[high])
            return _bisect_ids(build, run, trial, high, refused)
        bound = _named_bound(error)
        if bound is not None and 2 < bound < high:
            ladder = [bound] + [r for r in ladder if r < bound]
            named[bound] = high
        else:
            refused = high  # a refusal naming no bound (an assert of the ids' range, say)
    return None, None


def _past_named_bound(build, run, trial, bound, refused):
    """The bound an error named may be one part's: a partitioned table's
    shard names its own rows (`indices[0] = 111 is not in [0, 4)` for id 333
    of 3 "mod" shards of 11 rows), and the merged table a rewrite makes must
    be compared on all of them. One more id tells: a table's own bound
    refuses it. Past a shard's, the range doubles (a table is a few shards)
    up to the one refused, then halving finds the widest accepted."""
    low, high = bound, bound + 1
    while high < refused:
        candidate = build(high)
        if run(candidate) is not None:
            refused = high
            break
        low, trial, high = high, candidate, 2 * high
    return _bisect_ids(build, run, trial, low, refused)


def _bisect_ids(build, run, trial, high, refused):
    """Between an accepted range and the next wider one refused without
    naming its bound (an identity column's assert: 30 buckets would keep ids
    below 10 on the ladder), the widest range accepted: ids of a well-formed
    range are accepted up to a bound, so a few halvings find it."""
    low = high
    for _ in range(_BISECT_TRIES):
        if refused is None or refused - low <= 1:
            break
        mid = (low + refused) // 2
        candidate = build(mid)
        if run(candidate) is None:
            low, trial = mid, candidate
        else:
            refused = mid
    return trial, low


def _with_wide_ids(inputs, how, specs, run, rng, vocabulary_keys, examples):
    """`inputs` (and `how`) with their plain ids widened; `examples`
    is None, or (string inputs, ParseExample specs, tokens, vocabularies) when
    those inputs hold serialized tf.Examples.

    First every id input at once, to the widest range all of them take; then
    each alone, holding the others there: a model whose tables differ in
    size (a weighted column of 11 buckets beside an identity column of 23)
    would otherwise be compared on the smallest table's ids only."""
    if examples is not None:
        keys, example_specs, tokens, vocabularies = examples
        parts = sorted({key for spec in example_specs for key, _, t, _ in spec if t.is_integer})

        def build(highs):
            serialized = serialized_examples(example_specs, tokens, id_high=highs, vocabularies=vocabularies)
            return dict(inputs, **{k: _fill(serialized, np.shape(inputs[k])) for k in keys})
    else:
        parts = _plain_batch_keys(specs, vocabulary_keys)
        drawn = {}  # the last ids drawn per (input, high): a part widens alone against fixed others

        def ids(k, high):
            if (k, high) not in drawn:
                drawn[k, high] = (_spread_id_lists(rng, high, inputs[k]) if inputs[k].dtype == object
                                  else _spread_ids(rng, high, np.shape(inputs[k])).astype(inputs[k].dtype))
            return drawn[k, high]

        def build(highs):
            return dict(inputs, **{k: ids(k, highs[k]) for k in parts})
    if not parts:
        return inputs, how
    widened, high = _widest_ids(lambda h: build(dict.fromkeys(parts, h)), run)
    if widened is None:
        return inputs, how
    highs = _widest_per_part(build, run, parts, high)
    if highs is None:
        return widened, f"{how}, ids in [0, {high})"
    wider = ", ".join(f"{k.decode(errors='replace') if isinstance(k, bytes) else k} [0, {h})"
                      for k, h in highs.items() if h > high)
    return build(highs), f"{how}, ids in [0, {high}) and wider where taken ({wider})"


_PER_PART_SECONDS = 60  # widening each id input alone; each try is one call of the original


def _widest_per_part(build, run, parts, common):
    """{part: high} where some part takes ids wider than `common` alone and
    all of them together, else None. Parts not reached in time keep
    `common`."""
    if len(parts) < 2 or common >= max(_ID_RANGES):
        return None
    highs = dict.fromkeys(parts, common)
    deadline = time.monotonic() + _PER_PART_SECONDS
    for part in parts:
        if time.monotonic() > deadline:
            break

        def alone(h, part=part):
            # At most `common`, every part is where they were all accepted.
            return build({**highs, part: h} if h > common else dict.fromkeys(parts, common))

        _, high = _widest_ids(alone, run)
        if high is not None and high > common:
            highs[part] = high
    if all(h == common for h in highs.values()) or run(build(highs)) is not None:
        return None
    return highs


def _plain_batch_keys(specs, vocabulary_keys):
    """The integer and string batch inputs whose values no vocabulary chose:
    those of an unknown batch, and fixed ones of rank 2 or more (a `[8, 5]`
    matrix of ids). A fixed vector of integers is more likely a shape or a
    count than ids."""
    return [k for k, s in specs.items() if k not in vocabulary_keys and s.shape.rank
            and (s.shape.as_list()[0] is None or s.shape.rank >= 2)
            and (tf.as_dtype(s.dtype).is_integer or s.dtype == tf.string)]


def _with_empty_strings(inputs, how, keys, run):
    """`inputs` with an empty string in each plain string input (an empty
    bag, where TF's splits differ most), where the original accepts it."""
    strings = [k for k in keys if inputs[k].dtype == object and inputs[k].size > 1]
    trial = dict(inputs)
    for k in strings:
        flat = inputs[k].ravel().copy()
        flat[1] = b""
        trial[k] = flat.reshape(inputs[k].shape)
    if not strings or run(trial) is not None:
        return inputs, how
    return trial, f"{how}, empty strings"


# Keys no vocabulary holds, or its mask: an empty string, a byte string no
# text has; 0, -1 and an id past any table for integer keys.
_STRING_MISSES = (b"", b"\x01tf-ctr-ops: not in any vocabulary")
_INT_MISSES = (0, -1, 2**40 + 7)
_MISS_SECONDS = 60  # each try is one call of the original


def _with_misses(inputs, how, keys, run):
    """`inputs` with keys outside their vocabulary in each of `keys` (the
    inputs a vocabulary filled), at its odd flat positions, each where the
    original accepts it with the others: filled with vocabulary keys alone,
    a lookup's out-of-vocabulary slots and mask would go uncompared. Inputs
    of one value are left alone."""
    trial, changed = dict(inputs), []
    deadline = time.monotonic() + _MISS_SECONDS
    for k in sorted(keys):
        flat = np.array(inputs[k], copy=True).reshape(-1)
        if flat.size < 2:
            continue
        misses = _STRING_MISSES if flat.dtype == object else _INT_MISSES
        at = 1
        for value in misses:
            if at >= flat.size or time.monotonic() > deadline:
                break
            candidate = flat.copy()
            candidate[at] = value
            if run(dict(trial, **{k: candidate.reshape(np.shape(inputs[k]))})) is None:
                flat, at = candidate, at + 2
        if at > 1:
            trial[k] = flat.reshape(np.shape(inputs[k]))
            changed.append(k)
    if not changed:
        return inputs, how
    return trial, f"{how}, out-of-vocabulary keys in {len(changed)} of {len(keys)} vocabulary inputs"


def _failure_site(message):
    """Where a run failed: the node TF names, else the message itself."""
    m = re.search(r"\{\{node ([^}]+)\}\}", message) or re.search(r"Detected at node '?([\w/.-]+)", message)
    return m.group(1) if m else message


def _as_input(vocabulary, spec):
    """`vocabulary` as values of the input `spec`, or None when its kind differs."""
    if spec.dtype == tf.string:
        return np.asarray(vocabulary).astype(object) if vocabulary.dtype.kind in "OSU" else None
    if tf.as_dtype(spec.dtype).is_integer and vocabulary.dtype.kind in "iu":
        return np.asarray(vocabulary).astype(tf.as_dtype(spec.dtype).as_numpy_dtype)
    return None


def synthesize(specs, run, facts, rng):
    """(inputs, how) for a signature with input `specs`, where `run(inputs)`
    returns None when the original accepts them, else the error's text.
    Raises InputsError when no candidate is accepted."""
    # By name: a loaded signature lists its inputs in another order in every
    # process, and the draws and the search follow the order.
    specs = dict(sorted(specs.items()))
    structure = sparse_structure_keys(specs)
    searched = {k: s for k, s in specs.items() if k not in structure}
    inputs, how, vocabulary_keys, examples = _accepted_inputs(specs, searched, run, facts, rng)
    inputs, how = _with_wide_ids(inputs, how, searched, run, rng, vocabulary_keys, examples)
    if examples is None:
        plain = _plain_batch_keys(searched, vocabulary_keys)
        inputs, how = _with_empty_strings(inputs, how, plain, run)
        inputs, how = _with_vocabulary_values(inputs, how, plain, searched, facts, run)
        if vocabulary_keys:
            inputs, how = _with_misses(inputs, how, vocabulary_keys, run)
    return inputs, how


def _accepted_inputs(specs, searched, run, facts, rng):
    """(inputs, how, the inputs a vocabulary chose, the tf.Example inputs or
    None), the candidates tried in the module's order. `searched`: the specs
    of the inputs whose values may change."""
    current = plain_inputs(specs, rng)
    specs = searched
    own = {k: d for k, d in sorted(facts.input_delimiters.items()) if k in specs and specs[k].dtype == tf.string}
    if own:
        # Each input's ids joined as its own split splits them: a pooling
        # of one token per bag would be all that "," gives a hash of split
        # tokens to compare.
        trial = current
        for k, delimiter in own.items():
            trial = _joined_by(trial, delimiter, [k])
        joined = ", ".join(f"{d.decode(errors='replace')!r} in {k}" for k, d in own.items())
        own_error = run(trial)
        if own_error is None:
            return trial, f"synthesized (id lists joined by {joined})", set(), None
    error = run(current)
    if error is None:
        return current, "synthesized", set(), None
    tried = [f"on plain values: {error.splitlines()[0]}"]
    if own:
        tried.append(f"on id lists joined by {joined}: {own_error.splitlines()[0]}")
    known = _known_vocabularies(specs, facts)
    string_inputs = [k for k, s in specs.items() if s.dtype == tf.string]
    for delimiter in facts.delimiters if string_inputs else ():
        trial = _joined_by(current, delimiter, string_inputs)
        trial_error = run(trial)
        if trial_error is None:
            return trial, f"synthesized (id lists joined by {delimiter.decode(errors='replace')!r})", set(), None
        tried.append(f"on id lists joined by {delimiter.decode(errors='replace')!r}: {trial_error.splitlines()[0]}")
        if _failure_site(trial_error) != _failure_site(error):  # that split is fed: another input fails now
            current, error = trial, trial_error
            break
    if facts.example_specs and string_inputs:
        # Keys spread over each feature's vocabulary first; then, where the
        # original refuses those, each vocabulary's first key in every feature.
        spread = len(facts.example_vocabularies)
        choices = [(facts.example_vocabularies, f"tf.Example from the ParseExample spec, vocabulary keys in {spread} "
                    "features", "tf.Examples of the ParseExample spec with vocabulary keys")] if spread else []
        choices.append(({}, "tf.Example from the ParseExample spec", "tf.Examples of the ParseExample spec"))
        for vocabularies, how, what in choices:
            examples = serialized_examples(facts.example_specs, facts.tokens(), vocabularies=vocabularies)
            trial = dict(current)
            for k in string_inputs:
                trial[k] = _fill(examples, np.shape(current[k]))
            example_error = run(trial)
            if example_error is None:
                return (trial, f"synthesized ({how})", set(string_inputs),
                        (string_inputs, facts.example_specs, facts.tokens(), vocabularies))
            tried.append(f"on {what}: {example_error.splitlines()[0]}")
    if known:
        trial = dict(current, **{k: _fill(v, np.shape(current[k])) for k, v in known.items()})
        trial_error = run(trial)
        if trial_error is None:
            return trial, "synthesized (vocabulary values)", set(known), None
        current, error = trial, trial_error
    candidates = {}
    for k, s in specs.items():
        pool = facts.string_vocabularies if s.dtype == tf.string else (
            facts.int_vocabularies if tf.as_dtype(s.dtype).is_integer else [])
        candidates[k] = [np.asarray(v).astype(object if s.dtype == tf.string else tf.as_dtype(s.dtype).as_numpy_dtype)
                         for v in pool]
    # TF names only the first lookup that fails, so inputs are fixed one at a
    # time: a vocabulary that moves the failure elsewhere is right for its
    # input, which is then left alone.
    deadline = time.monotonic() + _SEARCH_SECONDS
    fixed = set(known)  # read by their lookups: a change can only break them
    progressed = True
    while progressed and time.monotonic() < deadline:
        progressed = False
        for k, pool in candidates.items():
            if k in fixed:
                continue
            for vocabulary in pool:
                if time.monotonic() > deadline:
                    break
                trial = dict(current, **{k: _fill(vocabulary, np.shape(current[k]))})
                trial_error = run(trial)
                if trial_error is None:
                    return trial, "synthesized (vocabulary values)", fixed | {k}, None
                if _failure_site(trial_error) != _failure_site(error):
                    current, error, progressed = trial, trial_error, True
                    fixed.add(k)
                    break
    raise InputsError(f"no synthesized inputs that the original model accepts ({'; '.join(tried)})")
