"""The SavedModel on disk: its protocol buffer, and what a rewrite must carry over.

A TF1 SavedModel (written by `tf.compat.v1.saved_model.Builder`, as
Estimator exports are) has no object graph: its tables are initialized by
the main op or legacy init op, its vocabularies are asset files, and its
variables are restored by the `saver_def`. Loading it with the TF2 API and
saving it again loses those, so a TF1 model is rewritten at the level of its
MetaGraphDefs instead: each graph is optimized in place and everything else
(collections, signatures and their method names, the saver, `variables/`,
`assets/`) is copied as it is.
"""

import os
import shutil

from tensorflow.core.protobuf import saved_model_pb2
from google.protobuf import text_format

_COPIED_FOLDERS = ("variables", "assets", "assets.extra")


def read(model_dir):
    """The SavedModel proto of `model_dir` (saved_model.pb or .pbtxt)."""
    model_dir = os.fspath(model_dir)
    proto = saved_model_pb2.SavedModel()
    pb, pbtxt = os.path.join(model_dir, "saved_model.pb"), os.path.join(model_dir, "saved_model.pbtxt")
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            proto.ParseFromString(f.read())
    elif os.path.exists(pbtxt):
        with open(pbtxt) as f:
            text_format.Parse(f.read(), proto)
    elif not os.path.exists(model_dir):
        raise ValueError(f"{model_dir} is not a SavedModel: it does not exist")
    else:
        raise ValueError(f"{model_dir} is not a SavedModel: it has no saved_model.pb")
    return proto


def is_tf1(proto):
    """Whether no MetaGraphDef has an object graph (a TF1 Builder export)."""
    return all(len(m.object_graph_def.nodes) == 0 for m in proto.meta_graphs)


def serving_meta_graph(proto):
    """The MetaGraphDef tf.saved_model.load serves: the "serve" one, else the only one."""
    for meta in proto.meta_graphs:
        if "serve" in meta.meta_info_def.tags:
            return meta
    return proto.meta_graphs[0]


def write_tf1(src, dst, proto):
    """Writes `proto` as dst/saved_model.pb beside copies of src's variables and assets."""
    os.makedirs(dst, exist_ok=True)
    for folder in _COPIED_FOLDERS:
        if os.path.isdir(os.path.join(src, folder)):
            shutil.copytree(os.path.join(src, folder), os.path.join(dst, folder))
    with open(os.path.join(dst, "saved_model.pb"), "wb") as f:
        f.write(proto.SerializeToString())


def copy_assets_extra(src, dst):
    """Copies src's assets.extra (TF Serving's warmup requests, files the
    serving system reads and TF does not) into dst, which the TF2 saver
    wrote without it."""
    extra = os.path.join(src, "assets.extra")
    if os.path.isdir(extra):
        shutil.copytree(extra, os.path.join(dst, "assets.extra"))


def restore_method_names(original, model_dir):
    """Gives dst's signatures the method names (classify, regress, ...) they
    had in `original`; the TF2 saver writes every signature as predict."""
    names = {k: s.method_name for m in original.meta_graphs for k, s in m.signature_def.items()}
    proto = read(model_dir)
    changed = False
    for meta in proto.meta_graphs:
        for key, sig in meta.signature_def.items():
            if key in names and names[key] and sig.method_name != names[key]:
                sig.method_name = names[key]
                changed = True
    if changed:
        with open(os.path.join(model_dir, "saved_model.pb"), "wb") as f:
            f.write(proto.SerializeToString())
        # The fingerprint describes the proto as first written.
        fingerprint = os.path.join(model_dir, "fingerprint.pb")
        if os.path.exists(fingerprint):
            os.remove(fingerprint)
