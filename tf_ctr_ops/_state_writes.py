"""Which nodes of a graph write state that outlives the call: variables and
lookup tables. The rewrite must not merge partitions another function
writes, nor run a writing function twice in verification; both ask here.
Conservative: a node that may write counts as writing."""

_WRITE_PREFIXES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply",
                   "ResourceStridedSliceAssign")
_TABLE_WRITE_PREFIXES = ("LookupTableInsert", "LookupTableRemove", "LookupTableImport", "InitializeTable")


def writes_variable(node):
    """Whether NodeDef `node` may write a variable."""
    return node.op.startswith(_WRITE_PREFIXES)


def writes_state(node):
    """Whether NodeDef `node` may write a variable or a lookup table."""
    if writes_variable(node) or node.op.startswith(_TABLE_WRITE_PREFIXES):
        return True
    return node.op == "CtrHashTableFind" and node.attr["insert"].b


def all_nodes(graph_def):
    """The nodes of `graph_def` and of every function in its library."""
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
