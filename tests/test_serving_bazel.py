"""serving/: the Bazel package that links the op library into TF Serving's
ModelServer, and the script that builds the server with it.

Nothing here runs Bazel (our machines have none). What can be checked without
it is checked: serving/BUILD names exactly the C++ files setup.py compiles
into the op library and a dep for every TensorFlow/absl header they include,
and build_model_server.sh copies, edits and invokes bazel as it should
(on a fake TF Serving checkout with a fake bazel that records its arguments).
"""

import ast
import os
import re
import stat
import subprocess
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "serving" / "BUILD"
SCRIPT = ROOT / "serving" / "build_model_server.sh"
LABEL = "//tensorflow_serving/tf_ctr_ops:tf_ctr_ops_kernels"
TARGET = "tensorflow_serving/model_servers:tensorflow_model_server"
PROJECT_INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:cc|cuda)/[^"]+)"', re.M)
EXTERNAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:tensorflow|absl|xla)/[^"]+)"', re.M)


# --------------------------------------------------------------------------
# What setup.py compiles, by setup.py's own code


def _setup_sources(flavor, cuda):
    """Runs setup.py's `sources` and `BuildCtrOps._sources` (not the rest of
    setup.py, which calls setup()), so a change to its rule or a new file in
    the tree is seen here."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ("sources", "_sources"):
            assert node.name not in found, f"setup.py defines {node.name} twice: update this test"
            found[node.name] = node
    assert set(found) == {"sources", "_sources"}, "setup.py no longer has sources()/_sources(): update this test"
    namespace = {"ROOT": ROOT}
    exec(compile(ast.Module(body=[found["sources"], found["_sources"]], type_ignores=[]), "setup.py", "exec"),
         namespace)
    fake_build_ext = types.SimpleNamespace(cuda={"home": "/cuda"} if cuda else None)
    return namespace["_sources"](fake_build_ext, flavor)


def _include_closure(files):
    """The project headers (cc/..., cuda/...) the files include, transitively."""
    seen, todo = set(), list(files)
    while todo:
        for header in PROJECT_INCLUDE.findall((ROOT / todo.pop()).read_text()):
            assert (ROOT / header).is_file(), f"{header} is included but does not exist"
            if header not in seen:
                seen.add(header)
                todo.append(header)
    return seen


def _load_build(path):
    """The rules of a BUILD file, by name. serving/BUILD keeps to the part of
    Starlark that is also Python, so it can be evaluated here."""
    rules = {}

    def rule(kind):
        def record(**kwargs):
            assert kwargs["name"] not in rules, f"two rules named {kwargs['name']}"
            rules[kwargs["name"]] = dict(kwargs, kind=kind)
        return record

    namespace = {"package": lambda **kwargs: None, "cc_library": rule("cc_library"), "filegroup": rule("filegroup")}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return rules


@pytest.fixture(scope="module")
def rules():
    return _load_build(BUILD)


def test_setup_py_rule_is_read_as_setup_py_applies_it():
    # Guards the reading itself: the CPU list is the CUDA list without the
    # *_gpu.cc kernels, and both hold the op, kernel and Grappler sources.
    cpu, gpu = _setup_sources("tf", cuda=False), _setup_sources("tf", cuda=True)
    assert "cc/grappler/ctr_fusion_optimizer.cc" in cpu and "cc/ops/lookup_ops.cc" in cpu
    assert "cc/kernels/lookup_kernels.cc" in cpu
    assert sorted(set(gpu) - set(cpu)) == sorted(s for s in gpu if s.endswith("_gpu.cc")) != []
    assert _setup_sources("cuda", cuda=False) == [] and "cuda/lookup_kernels.cu" in _setup_sources("cuda", cuda=True)


def test_library_srcs_are_the_cpu_op_library_sources(rules):
    lib = rules["tf_ctr_ops_kernels"]
    assert lib["kind"] == "cc_library"
    assert len(lib["srcs"]) == len(set(lib["srcs"]))
    expected = _setup_sources("tf", cuda=False)
    missing, extra = sorted(set(expected) - set(lib["srcs"])), sorted(set(lib["srcs"]) - set(expected))
    assert not missing and not extra, (
        f"serving/BUILD :tf_ctr_ops_kernels srcs differ from what setup.py compiles into _tf_ctr_ops.so "
        f"(CPU build): add {missing}, remove {extra}")


def test_library_hdrs_are_the_headers_its_sources_include(rules):
    lib = rules["tf_ctr_ops_kernels"]
    assert len(lib["hdrs"]) == len(set(lib["hdrs"]))
    expected = _include_closure(lib["srcs"])
    missing, extra = sorted(expected - set(lib["hdrs"])), sorted(set(lib["hdrs"]) - expected)
    assert not missing and not extra, f"serving/BUILD :tf_ctr_ops_kernels hdrs: add {missing}, remove {extra}"


def test_gpu_filegroup_is_what_a_cuda_build_adds(rules):
    cpu_files = set(rules["tf_ctr_ops_kernels"]["srcs"]) | set(rules["tf_ctr_ops_kernels"]["hdrs"])
    gpu_sources = (set(_setup_sources("tf", cuda=True)) - set(_setup_sources("tf", cuda=False))
                   | set(_setup_sources("cuda", cuda=True)))
    expected = (gpu_sources | _include_closure(gpu_sources)) - cpu_files
    listed = rules["gpu_sources"]["srcs"]
    assert len(listed) == len(set(listed))
    missing, extra = sorted(expected - set(listed)), sorted(set(listed) - expected)
    assert not missing and not extra, f"serving/BUILD :gpu_sources: add {missing}, remove {extra}"


def test_library_is_alwayslink_and_found_from_its_package(rules):
    lib = rules["tf_ctr_ops_kernels"]
    # Static registrations are dropped by the linker without it.
    assert lib["alwayslink"] in (1, True)
    # The sources include "cc/..." from the package root.
    assert lib["includes"] == ["."]


def _bazel_target(header):
    """TensorFlow's and absl's target for a header, by their layout."""
    directory, name = header.rsplit("/", 1)
    stem = name.split(".")[0]
    if directory == "absl/container":
        return f"@com_google_absl//{directory}:{stem}"
    if directory.startswith("absl/"):
        return f"@com_google_absl//{directory}"
    if name.endswith(".pb.h") and directory in ("tensorflow/core/framework", "tensorflow/core/protobuf"):
        return "@org_tensorflow//tensorflow/core:protos_all_cc"
    simple = {"tensorflow/core/framework": "framework", "tensorflow/core/platform": "lib",
              "tensorflow/core/graph": "graph"}
    if directory in simple:
        return f"@org_tensorflow//tensorflow/core:{simple[directory]}"
    if directory.startswith("tensorflow/core/grappler") or directory == "tensorflow/core/kernels":
        return f"@org_tensorflow//{directory}:{stem}"
    raise AssertionError(f"no Bazel target known for {header}: add its target to serving/BUILD's deps and "
                         "a rule for it to tests/test_serving_bazel.py::_bazel_target")


def test_bazel_target_mapping():
    assert _bazel_target("tensorflow/core/framework/op_kernel.h") == "@org_tensorflow//tensorflow/core:framework"
    assert _bazel_target("tensorflow/core/protobuf/rewriter_config.pb.h") == (
        "@org_tensorflow//tensorflow/core:protos_all_cc")
    assert _bazel_target("tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h") == (
        "@org_tensorflow//tensorflow/core/grappler/optimizers:custom_graph_optimizer_registry")
    assert _bazel_target("absl/strings/str_cat.h") == "@com_google_absl//absl/strings"
    assert _bazel_target("absl/container/flat_hash_set.h") == "@com_google_absl//absl/container:flat_hash_set"
    with pytest.raises(AssertionError, match="no Bazel target known"):
        _bazel_target("xla/stream_executor/stream.h")


def test_library_deps_are_the_targets_of_the_headers_it_includes(rules):
    lib = rules["tf_ctr_ops_kernels"]
    assert len(lib["deps"]) == len(set(lib["deps"]))
    headers = set()
    for f in lib["srcs"] + lib["hdrs"]:
        headers.update(EXTERNAL_INCLUDE.findall((ROOT / f).read_text()))
    expected = {_bazel_target(h) for h in headers}
    # The two TF Serving's custom-op guide and every op library need.
    assert {"@org_tensorflow//tensorflow/core:framework", "@org_tensorflow//tensorflow/core:lib"} <= expected
    missing, extra = sorted(expected - set(lib["deps"])), sorted(set(lib["deps"]) - expected)
    assert not missing and not extra, f"serving/BUILD :tf_ctr_ops_kernels deps: add {missing}, remove {extra}"


# --------------------------------------------------------------------------
# build_model_server.sh on a fake checkout

# Shaped like tensorflow_serving/model_servers/BUILD of TF Serving 2.x: the
# ops list is an expression, not a bare list, and server_lib links it.
MODEL_SERVERS_BUILD = '''\
# Description: Model Server (a stand-in for the test)
load("//tensorflow_serving:tensorflow_version.bzl", "if_not_v2", "if_v2")

package(default_visibility = ["//tensorflow_serving:internal"])

SUPPORTED_TENSORFLOW_OPS = if_v2([]) + if_not_v2([
    "@org_tensorflow//tensorflow/contrib:contrib_kernels",
]) + [
    "@org_tensorflow_text//tensorflow_text:ops_lib",
    # a comment inside the list, as the real one has
    "@org_tensorflow_decision_forests//tensorflow_decision_forests/tensorflow/ops/inference:kernel_and_op",
]

cc_library(
    name = "server_lib",
    srcs = ["server.cc"],
    deps = [
        "@org_tensorflow//tensorflow/core:lib",
    ] + SUPPORTED_TENSORFLOW_OPS,
)
'''
ORIGINAL_OPS = [
    "@org_tensorflow_text//tensorflow_text:ops_lib",
    "@org_tensorflow_decision_forests//tensorflow_decision_forests/tensorflow/ops/inference:kernel_and_op",
]


def _supported_ops(build_text):
    """SUPPORTED_TENSORFLOW_OPS of a model_servers/BUILD, as a TF2 build sees it."""
    for node in ast.parse(build_text).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["SUPPORTED_TENSORFLOW_OPS"]:
            return eval(compile(ast.Expression(node.value), "BUILD", "eval"),
                        {"if_v2": lambda x: x, "if_not_v2": lambda x: []})
    raise AssertionError("no SUPPORTED_TENSORFLOW_OPS assignment")


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "serving"
    (root / "tensorflow_serving" / "model_servers").mkdir(parents=True)
    (root / "tensorflow_serving" / "model_servers" / "BUILD").write_text(MODEL_SERVERS_BUILD)
    (root / "WORKSPACE").write_text('workspace(name = "tf_serving")\n')
    return root


@pytest.fixture
def fake_bazel(tmp_path):
    """A `bazel` on PATH that appends its working directory and arguments to a
    log, a line each, and exits with $FAKE_BAZEL_RC."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "bazel.log"
    exe = bindir / "bazel"
    exe.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "cwd=$PWD" "$@" "--end--" >> "$FAKE_BAZEL_LOG"\n'
                   'exit "${FAKE_BAZEL_RC:-0}"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", FAKE_BAZEL_LOG=str(log))
    env.pop("BAZEL", None)
    return types.SimpleNamespace(env=env, log=log)


def _calls(log):
    if not log.exists():
        return []
    calls, current = [], []
    for line in log.read_text().splitlines():
        if line == "--end--":
            calls.append(current)
            current = []
        else:
            current.append(line)
    return calls


def _run(*args, env):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120)


def _listed_files(rules):
    lib = rules["tf_ctr_ops_kernels"]
    return lib["srcs"] + lib["hdrs"] + rules["gpu_sources"]["srcs"]


def test_script_copies_links_once_and_builds_the_server(checkout, fake_bazel, rules):
    ops_build = checkout / "tensorflow_serving" / "model_servers" / "BUILD"
    dest = checkout / "tensorflow_serving" / "tf_ctr_ops"
    first = _run(checkout, env=fake_bazel.env)
    assert first.returncode == 0, first.stdout + first.stderr

    assert (dest / "BUILD").read_bytes() == BUILD.read_bytes()
    for f in _listed_files(rules):
        assert (dest / f).read_bytes() == (ROOT / f).read_bytes(), f
    # The copied package is self-contained: every header its files include is there.
    assert _include_closure(_listed_files(rules)) <= {str(p.relative_to(dest)) for p in dest.rglob("*")}
    assert not (dest / "cc" / "python").exists()  # the pybind module is not part of the op library

    ops = _supported_ops(ops_build.read_text())
    assert ops.count(LABEL) == 1 and ops[1:] == ORIGINAL_OPS
    assert _calls(fake_bazel.log) == [[f"cwd={checkout}", "build", "-c", "opt", TARGET]]

    # A second run (say, after editing the C++) replaces the copy, keeps one
    # entry in the list and builds again.
    stale = dest / "cc" / "ops" / "removed_since.cc"
    stale.write_text("// from an older copy\n")
    edited_once = ops_build.read_text()
    second = _run(checkout, "--copt=-mavx2", env=fake_bazel.env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already in SUPPORTED_TENSORFLOW_OPS" in second.stdout
    assert ops_build.read_text() == edited_once
    assert not stale.exists()
    assert _calls(fake_bazel.log)[1] == [f"cwd={checkout}", "build", "-c", "opt", "--copt=-mavx2", TARGET]

    # The edit is the list prefix and a comment line, nothing else.
    restored = [line for line in edited_once.splitlines(keepends=True) if not line.startswith("# tf_ctr_ops:")]
    assert "".join(restored).replace(f'["{LABEL}"] + ', "") == MODEL_SERVERS_BUILD


def test_script_links_into_a_plain_list_too(checkout, fake_bazel):
    ops_build = checkout / "tensorflow_serving" / "model_servers" / "BUILD"
    ops_build.write_text('SUPPORTED_TENSORFLOW_OPS = ["//foo:bar"]\n')
    for _ in range(2):
        proc = _run("--no-build", checkout, env=fake_bazel.env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _supported_ops(ops_build.read_text()) == [LABEL, "//foo:bar"]


def test_no_build_copies_and_edits_without_bazel(checkout, tmp_path):
    env = dict(os.environ, BAZEL="no-such-bazel-for-tf-ctr-ops")
    proc = _run("--no-build", checkout, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (checkout / "tensorflow_serving" / "tf_ctr_ops" / "BUILD").is_file()
    assert LABEL in _supported_ops((checkout / "tensorflow_serving" / "model_servers" / "BUILD").read_text())
    assert f"no-such-bazel-for-tf-ctr-ops build -c opt {TARGET}" in proc.stdout


def _assert_untouched(checkout):
    assert (checkout / "tensorflow_serving" / "model_servers" / "BUILD").read_text() == MODEL_SERVERS_BUILD
    assert not (checkout / "tensorflow_serving" / "tf_ctr_ops").exists()


def test_missing_checkout_is_a_clear_error(tmp_path, fake_bazel):
    missing = tmp_path / "no-such-checkout"
    proc = _run(missing, env=fake_bazel.env)
    assert proc.returncode != 0
    assert "TF Serving checkout not found" in proc.stderr and str(missing) in proc.stderr
    assert not missing.exists() and _calls(fake_bazel.log) == []


def test_directory_that_is_not_a_checkout_is_a_clear_error(tmp_path, fake_bazel):
    proc = _run(tmp_path, env=fake_bazel.env)
    assert proc.returncode != 0
    assert "is not a TF Serving checkout" in proc.stderr and "model_servers/BUILD" in proc.stderr
    assert not (tmp_path / "tensorflow_serving").exists() and _calls(fake_bazel.log) == []


def test_no_arguments_prints_usage_with_the_version_pairing(fake_bazel):
    proc = _run(env=fake_bazel.env)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "TensorFlow 2.21" in proc.stderr and "2.20" in proc.stderr


def test_missing_bazel_is_a_clear_error_before_any_change(checkout):
    env = dict(os.environ, BAZEL="no-such-bazel-for-tf-ctr-ops")
    proc = _run(checkout, env=env)
    assert proc.returncode != 0
    assert "'no-such-bazel-for-tf-ctr-ops' not found on PATH" in proc.stderr and "--no-build" in proc.stderr
    _assert_untouched(checkout)


def test_build_file_without_the_ops_list_is_refused(checkout, fake_bazel):
    ops_build = checkout / "tensorflow_serving" / "model_servers" / "BUILD"
    ops_build.write_text("cc_library(name = 'server_lib')\n")
    proc = _run(checkout, env=fake_bazel.env)
    assert proc.returncode != 0
    assert "SUPPORTED_TENSORFLOW_OPS" in proc.stderr and LABEL in proc.stderr
    assert ops_build.read_text() == "cc_library(name = 'server_lib')\n"
    assert not (checkout / "tensorflow_serving" / "tf_ctr_ops").exists() and _calls(fake_bazel.log) == []


def test_a_folder_the_script_did_not_make_is_not_deleted(checkout, fake_bazel):
    theirs = checkout / "tensorflow_serving" / "tf_ctr_ops"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    proc = _run(checkout, env=fake_bazel.env)
    assert proc.returncode != 0 and "was not made by this script" in proc.stderr
    assert (theirs / "notes.txt").read_text() == "mine\n" and not (theirs / "BUILD").exists()
    assert (checkout / "tensorflow_serving" / "model_servers" / "BUILD").read_text() == MODEL_SERVERS_BUILD


def test_a_failed_bazel_build_fails_the_script(checkout, fake_bazel):
    proc = _run(checkout, env=dict(fake_bazel.env, FAKE_BAZEL_RC="3"))
    assert proc.returncode == 3
    assert "built " not in proc.stdout


def test_script_is_executable():
    assert os.access(SCRIPT, os.X_OK)
