"""Builds tf-ctr-ops: one TF op library and one framework-free pybind11 module.

    pip install --no-build-isolation .        # TensorFlow must already be installed

Bazel is not used. The op library `tf_ctr_ops/_tf_ctr_ops.so` is compiled with
g++ and the flags of the installed TensorFlow (tf.sysconfig), so it is tied to
that exact TF version; the wheel pins it. `tf_ctr_ops._core` is the same C++
core (and CUDA launchers) without TensorFlow, for benchmarks and GPU tests.

CUDA: see `find_cuda_toolkit`. Environment switches:
  TF_CTR_OPS_CUDA=0|1         force CPU-only / require CUDA (default: auto)
  TF_CTR_OPS_CUDA_ARCHS=80;90 GPU architectures (default 80;90, PTX for the last)
  TF_CTR_OPS_SANITIZE=address,undefined   build with ASan/UBSan
  TF_CTR_OPS_JOBS=N           parallel compile jobs (default: CPU count)
  TF_CTR_OPS_PCH=0            do not precompile cc/tf_pch.h (slower, same code)
  TF_CTR_OPS_CORE_ONLY=1      build tf_ctr_ops._core alone, without TensorFlow (a GPU
                              machine testing the CUDA kernels: tools/gpu_check.sh)
"""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
VERSION = "0.1.0"
PCH_HEADER = "cc/tf_pch.h"


def log(msg):
    print(f"[tf-ctr-ops] {msg}", flush=True)


# --------------------------------------------------------------------------
# TensorFlow


def tensorflow_config():
    try:
        import tensorflow as tf  # noqa: F401 (heavy import, build time only)
    except ImportError as e:
        sys.exit(
            "tf-ctr-ops builds against the installed TensorFlow, and none was found "
            f"({e}). Install it first: pip install 'tensorflow==2.21.*', then "
            "pip install --no-build-isolation ."
        )
    info = tf.sysconfig.get_build_info()
    return {
        "version": tf.__version__,
        "compile_flags": tf.sysconfig.get_compile_flags(),
        "link_flags": tf.sysconfig.get_link_flags(),
        "cuda_version": str(info.get("cuda_version", "")) if info.get("is_cuda_build") else "",
    }


# --------------------------------------------------------------------------
# CUDA toolkit discovery


def _nvcc_version(nvcc):
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _toolkit_at(home, origin):
    """A usable toolkit has nvcc, the runtime headers and a static cudart.

    Static cudart keeps the op library loadable on machines without a GPU or
    a CUDA runtime: it only dlopens the driver when a GPU kernel first runs.
    """
    home = Path(home)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.exists():
        return None
    libdirs = [home / "lib64", home / "lib", home / "targets" / "x86_64-linux" / "lib"]
    static = next((d for d in libdirs if (d / "libcudart_static.a").exists()), None)
    if static is None or not (home / "include" / "cuda_runtime.h").exists():
        return None
    version = _nvcc_version(nvcc)
    if version is None:
        return None
    return {"home": home, "nvcc": nvcc, "libdir": static, "version": version, "origin": origin}


def _pip_nvcc_home():
    try:
        import nvidia.cuda_nvcc as pkg  # nvidia-cuda-nvcc-cu12, TF's [and-cuda] extra
    except ImportError:
        return None
    return Path(list(pkg.__path__)[0])


def find_cuda_toolkit(tf_cuda_version):
    """Looks in CUDA_HOME, then nvcc on PATH, then the nvidia-cuda-nvcc-cu12 wheel.

    Among usable toolkits, the one whose major version matches TF's CUDA
    runtime wins (TF 2.21 is built with CUDA 12.5), else the first found.
    Note: the nvidia-cuda-nvcc-cu12 wheels ship ptxas and headers but no nvcc
    driver, so on their own they cannot compile; they are still checked so a
    future wheel that has one is picked up.
    """
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append((os.environ["CUDA_HOME"], "CUDA_HOME"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append((Path(nvcc).resolve().parent.parent, "nvcc on PATH"))
    candidates.append(("/usr/local/cuda", "/usr/local/cuda"))
    pip_home = _pip_nvcc_home()
    if pip_home:
        candidates.append((pip_home, "nvidia-cuda-nvcc-cu12"))
    found, seen = [], set()
    for home, origin in candidates:
        key = str(Path(home).resolve())
        if key in seen:
            continue
        seen.add(key)
        tk = _toolkit_at(home, origin)
        if tk:
            found.append(tk)
    if not found:
        return None
    tf_major = int(tf_cuda_version.split(".")[0]) if tf_cuda_version else None
    matching = [tk for tk in found if tk["version"][0] == tf_major]
    return (matching or found)[0]


def cuda_choice(tf_cuda_version):
    mode = os.environ.get("TF_CTR_OPS_CUDA", "auto").strip().lower()
    if mode in ("0", "false", "no", "off"):
        log("building CPU-only (TF_CTR_OPS_CUDA=0)")
        return None
    tk = find_cuda_toolkit(tf_cuda_version)
    if tk is None:
        if mode in ("1", "true", "yes", "on"):
            sys.exit(
                "TF_CTR_OPS_CUDA=1 but no usable CUDA toolkit was found (looked at CUDA_HOME, "
                "nvcc on PATH, /usr/local/cuda and the nvidia-cuda-nvcc-cu12 wheel; a toolkit "
                "needs bin/nvcc, include/cuda_runtime.h and libcudart_static.a)."
            )
        log("no CUDA toolkit found: building CPU-only (set CUDA_HOME to build GPU kernels)")
        return None
    v = "%d.%d" % tk["version"]
    note = "" if tk["version"][0] == int((tf_cuda_version or "0").split(".")[0]) else (
        f" (TF was built with CUDA {tf_cuda_version}; GPU kernels need a driver for CUDA {v})")
    log(f"building with CUDA {v} from {tk['home']} ({tk['origin']}){note}")
    return tk


# --------------------------------------------------------------------------
# Compilation


def sources(pattern):
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))


class Toolchain:
    def __init__(self, tf, cuda, build_temp):
        self.tf = tf
        self.cuda = cuda
        self.build_temp = Path(build_temp)
        self.sanitize = os.environ.get("TF_CTR_OPS_SANITIZE", "").strip()
        common = ["-std=c++17", "-fPIC", f"-I{ROOT}", "-Wall", "-Wno-sign-compare",
                  "-Wno-deprecated-declarations", "-Wno-unused-function"]
        # -g1: line tables are all a sanitizer report needs; full debug info
        # of TF's headers only lengthens the build. -O0: it halves the
        # sanitized build's compile time against -O1 (the kernels' templates
        # dominate it), and the sanitized tests ran no slower on 2 cores.
        common += ["-O0", "-g1", "-fno-omit-frame-pointer", f"-fsanitize={self.sanitize}"] if self.sanitize else ["-O3"]
        if cuda:
            common += ["-DCTR_WITH_CUDA=1", f"-I{cuda['home'] / 'include'}"]
        self.cxx_core = common
        self.cxx_tf = common + [f for f in tf["compile_flags"] if not f.startswith("--std")]
        if "undefined" in self.sanitize.split(","):
            # g++ (12) cannot compile TF's bundled absl with these three UBSan
            # checks: they make absl's constexpr `hash_fn == nullptr` in
            # hash_policy_traits.h "not a constant expression". They are off
            # for the op library only; the core module (the same cc/core
            # code, no absl) keeps every UBSan check.
            self.cxx_tf += ["-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"]
        if "address" in self.sanitize.split(","):
            # The op library shares absl/protobuf objects with TF's prebuilt,
            # uninstrumented binaries. Under __SANITIZE_ADDRESS__ absl changes
            # the layout of its containers (swisstable "generations", FixedArray
            # redzones), so inline absl code compiled here would misread TF's
            # objects (it crashed in ~GraphProperties in the Grappler pass).
            # Without the macro the headers match TF's build; the code is still
            # instrumented by -fsanitize=address.
            self.cxx_tf += ["-U__SANITIZE_ADDRESS__"]
        self.headers_mtime = max(p.stat().st_mtime for ext in ("h", "cuh") for p in ROOT.glob(f"c*/**/*.{ext}"))

    def _obj(self, src, flavor):
        # Objects of other builds in this tree (CPU-only, CUDA, sanitized) were
        # compiled with other defines: never reuse them across variants.
        variant = ("cuda" if self.cuda else "cpu") + (f"-{self.sanitize.replace(',', '-')}" if self.sanitize else "")
        return self.build_temp / f"{flavor}-{variant}" / (src.replace("/", "_") + ".o")

    def _stale(self, src, obj):
        return not obj.exists() or obj.stat().st_mtime < max((ROOT / src).stat().st_mtime, self.headers_mtime)

    def _cmd(self, src, obj, flavor):
        if src.endswith(".cu"):
            archs = os.environ.get("TF_CTR_OPS_CUDA_ARCHS", "80;90").replace(",", ";").split(";")
            gencode = []
            for i, a in enumerate(archs):
                code = f"[sm_{a},compute_{a}]" if i == len(archs) - 1 else f"sm_{a}"
                gencode += ["-gencode", f"arch=compute_{a},code={code}"]
            host = "-fPIC" + (f",-fsanitize={self.sanitize}" if self.sanitize else "")
            return [str(self.cuda["nvcc"]), "-std=c++17", "-O3", f"-I{ROOT}", "--expt-relaxed-constexpr",
                    "-Xcompiler", host, *gencode, "-c", str(ROOT / src), "-o", str(obj)]
        flags = self.cxx_tf if flavor == "tf" else self.cxx_core + pybind_includes()
        if flavor == "tf" and self.pch:
            flags = [*flags, "-Winvalid-pch", "-include", str(self.pch)]
        return ["g++", *flags, "-c", str(ROOT / src), "-o", str(obj)]

    def _precompiled_header(self):
        """Where cc/tf_pch.h's precompiled copy goes, or None when off.

        g++ uses `X.gch` in place of `X` when a file is -include'd and both sit
        side by side, so the header is copied into the variant's build folder
        and compiled there; with other flags g++ would ignore the .gch (and say
        so: -Winvalid-pch) and parse the headers as usual."""
        if os.environ.get("TF_CTR_OPS_PCH", "1").strip() == "0":
            return None
        return self._obj(PCH_HEADER, "tf").with_suffix("")

    def _precompile(self):
        # g++ checks a .gch against the flags, not against the headers inside
        # it: the stamp (TF version and command) makes a new TensorFlow or new
        # flags rebuild it instead of compiling against stale headers.
        gch = self.pch.with_name(self.pch.name + ".gch")
        stamp = self.pch.with_name(self.pch.name + ".stamp")
        cmd = ["g++", *self.cxx_tf, "-x", "c++-header", str(self.pch), "-o", str(gch)]
        want = "\n".join([self.tf["version"], *cmd])
        if (gch.exists() and stamp.exists() and stamp.read_text() == want
                and gch.stat().st_mtime >= (ROOT / PCH_HEADER).stat().st_mtime):
            return
        self.pch.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / PCH_HEADER, self.pch)
        run(cmd, f"precompile {PCH_HEADER}")
        stamp.write_text(want)

    def compile(self, srcs_by_flavor):
        """Compiles the stale objects of every flavor ("cuda", "tf", "core") in
        one pool, so that nvcc and the core module overlap the op library
        instead of running after it; returns each flavor's objects."""
        objs, jobs = {}, []
        for flavor, srcs in srcs_by_flavor.items():
            objs[flavor] = [self._obj(src, flavor) for src in srcs]
            for src, obj in zip(srcs, objs[flavor]):
                obj.parent.mkdir(parents=True, exist_ok=True)
                if self._stale(src, obj):
                    jobs.append((src, obj, flavor))
        self.pch = self._precompiled_header() if any(f == "tf" for _, _, f in jobs) else None
        # The TF files wait for the precompiled header: the others go first.
        jobs.sort(key=lambda job: job[2] == "tf")
        workers = int(os.environ.get("TF_CTR_OPS_JOBS", os.cpu_count() or 2))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            pch_ready = pool.submit(self._precompile) if self.pch else None

            def build(src, obj, flavor):
                if flavor == "tf" and pch_ready:
                    pch_ready.result()
                run(self._cmd(src, obj, flavor), f"compile {src}")

            futures = [pool.submit(build, *job) for job in jobs]
            for f in concurrent.futures.as_completed(futures):
                f.result()
        return objs

    def link(self, objs, out, extra):
        cmd = ["g++", "-shared", *map(str, objs), "-o", str(out), *extra]
        if self.sanitize:
            cmd.append(f"-fsanitize={self.sanitize}")
        if self.cuda:
            cmd += [f"-L{self.cuda['libdir']}", "-lcudart_static", "-ldl", "-lrt", "-lpthread"]
        run(cmd, f"link {out.name}")


def pybind_includes():
    import pybind11

    return [f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}"]


def run(cmd, what):
    # Each step is logged when it ends, with its time: the slow translation
    # units of a 2-core CI build show in its log.
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log(f"{what} ({time.monotonic() - start:.1f} s)")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise RuntimeError(f"{what} failed:\n  {' '.join(cmd)}")


def write_build_info(tf, cuda, path):
    path.write_text(
        "# Generated by setup.py at build time; describes how this copy was built.\n"
        f"TF_VERSION = {tf['version']!r}\n"
        f"TF_CUDA_VERSION = {tf['cuda_version']!r}\n"
        f"WITH_CUDA = {bool(cuda)!r}\n"
        f"CUDA_VERSION = {('%d.%d' % cuda['version']) if cuda else ''!r}\n"
        f"CUDA_ARCHS = {os.environ.get('TF_CTR_OPS_CUDA_ARCHS', '80;90') if cuda else ''!r}\n"
        f"SANITIZE = {os.environ.get('TF_CTR_OPS_SANITIZE', '')!r}\n"
    )


def core_only():
    return os.environ.get("TF_CTR_OPS_CORE_ONLY", "").strip() not in ("", "0")


# What a core-only build knows of TensorFlow: nothing (the core never includes it).
NO_TENSORFLOW = {"version": "", "compile_flags": [], "link_flags": [], "cuda_version": ""}


class BuildCtrOps(build_ext):
    """Compiles both native modules with g++ (and nvcc) instead of distutils."""

    def run(self):
        if core_only():
            log("building tf_ctr_ops._core only (TF_CTR_OPS_CORE_ONLY=1): no op library, no TensorFlow")
            self.extensions = [e for e in self.extensions if e.name == "tf_ctr_ops._core"]
        self.tf = NO_TENSORFLOW if core_only() else tensorflow_config()
        self.cuda = cuda_choice(self.tf["cuda_version"])
        self.toolchain = Toolchain(self.tf, self.cuda, self.build_temp)
        for where in {Path(self.get_ext_fullpath(e.name)).parent for e in self.extensions}:
            where.mkdir(parents=True, exist_ok=True)
            write_build_info(self.tf, self.cuda, where / "_build_info.py")
        super().run()

    def get_ext_filename(self, fullname):
        if fullname.endswith("_tf_ctr_ops"):
            return os.path.join(*fullname.split(".")) + ".so"  # loaded by tf.load_op_library
        return super().get_ext_filename(fullname)

    def _flavor(self, ext):
        return "tf" if ext.name.endswith("_tf_ctr_ops") else "core"

    def _sources(self, flavor):
        if flavor == "cuda":
            return sources("cuda/*.cu") if self.cuda else []
        if flavor == "tf":
            srcs = sources("cc/ops/*.cc") + sources("cc/kernels/*.cc") + sources("cc/grappler/*.cc")
            return srcs if self.cuda else [s for s in srcs if not s.endswith("_gpu.cc")]
        srcs = sources("cc/python/*.cc")
        return srcs if self.cuda else [s for s in srcs if "gpu" not in s]

    def build_extensions(self):
        flavors = ["cuda"] + [self._flavor(e) for e in self.extensions]
        objs = self.toolchain.compile({f: self._sources(f) for f in flavors})
        for ext in self.extensions:
            out = Path(self.get_ext_fullpath(ext.name))
            out.parent.mkdir(parents=True, exist_ok=True)
            flavor = self._flavor(ext)
            extra = self.tf["link_flags"] if flavor == "tf" else []
            self.toolchain.link(objs[flavor] + objs["cuda"], out, extra)


def install_requires():
    """Pins the exact TensorFlow the op library was compiled against."""
    try:
        import tensorflow as tf

        tf_req = f"tensorflow=={tf.__version__}"
    except ImportError:
        tf_req = "tensorflow>=2.21,<2.22"
    return [tf_req, "numpy"]


setup(
    name="tf-ctr-ops",
    version=VERSION,
    description="Fused embedding and string-feature ops for TensorFlow CTR models (CPU and CUDA)",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tf_ctr_ops", "tf_ctr_ops.*"]),
    ext_modules=[
        Extension("tf_ctr_ops._tf_ctr_ops", sources=[]),
        Extension("tf_ctr_ops._core", sources=[]),
    ],
    cmdclass={"build_ext": BuildCtrOps},
    install_requires=install_requires(),
    extras_require={
        # atheris (tests/test_fuzz.py) has wheels for CPython >= 3.11 on Linux x86-64 only.
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6",
                 "atheris; python_version >= '3.11' and platform_system == 'Linux' and platform_machine == 'x86_64'"],
        "plot": ["matplotlib"],
    },
    entry_points={"console_scripts": ["tf-ctr-ops=tf_ctr_ops.__main__:main"]},
    zip_safe=False,
)
