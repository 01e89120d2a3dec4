"""The installable package (setup.py, qnccl/_native.py): `pip wheel .` builds a wheel that
carries libqnccl.so with the CUDA kernels the build made, the host backend (libnccl.so.2, and
libnccl.so for -lnccl), the cffi declarations, nccl.h and qnccl.h, a pkg-config file, the
perf binaries and what `qnccl bench` runs, versioned by qnccl.h. Installed into a fresh
virtual environment and used from a directory outside the source tree: `qnccl info` (with
the CUDA architectures), `qnccl run`, a quantize/dequantize round trip bit for bit the
emulator's, a plain NCCL program compiled with `qnccl config`'s flags and run quantized on 2
ranks bit for bit the emulator, and `qnccl bench` writing under the current directory. Where
a compiled part is missing, the message says what to do in each situation.

The wheel is built from the tree's own build (BUILD=build, as `make` made it; the module
fails without one), without build isolation: a build from nothing (`pip install .`, which
fetches the CUDA wheels and compiles the kernels, minutes) is the same setup.py and make
rules with another folder."""
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mpi
from mpi import REPO
from test_allreduce import built  # noqa: F401  (fails the module without a build)
from test_interposer import PROGRAM_SOURCE, RUN_FLAGS, eligible, emulate, load_run, same_bytes

from qnccl import _native

# What a user of the wheel needs (written out, not taken from _native.PARTS, so that a part
# dropped there fails here): the library, the host backend and -lnccl's name for it, what
# the binding and a C program include, the perf binaries and what `qnccl bench` runs.
PERF_TOOLS = ["all_reduce_perf", "reduce_scatter_perf", "all_gather_perf", "alltoall_perf",
              "sendrecv_perf", "mpi_all_reduce_perf", "codec_bench"]
EXECUTABLES = [f"bin/{tool}" for tool in PERF_TOOLS] + ["bin/netlab"]
ELF = ["lib/libqnccl.so", "host/libnccl.so.2", "host/libnccl.so"] + \
    [f"bin/{tool}" for tool in PERF_TOOLS]
NATIVE = ELF + ["bin/netlab", "bin/torch_all_reduce_perf.py", "bin/gloo_ranks.py",
                "include/nccl.h", "include/nccl_abi.h", "include/qnccl.h",
                "include/qnccl_cdef.h", "lib/pkgconfig/qnccl.pc"]


def header_version():
    text = (REPO / "src" / "include" / "qnccl.h").read_text()
    return ".".join(re.search(rf"#define QNCCL_{p} (\d+)", text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def cuda_archs_row(info_output):
    row = re.search(r"^CUDA archs +(.+)$", info_output, re.M)
    return row and row.group(1)


@pytest.fixture(scope="module")
def tree_info():
    """`qnccl info` of the source tree's build: the CUDA architectures it carries."""
    result = subprocess.run([sys.executable, "-m", "qnccl", "info"], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    made = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out)],
                          env=dict(os.environ, BUILD="build"), capture_output=True, text=True,
                          timeout=1200)
    if made.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{made.stdout[-3000:]}\n{made.stderr[-3000:]}")
    (path,) = out.glob("qnccl-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh virtual environment (no system site packages) with the wheel installed and its
    `bench` extra (matplotlib), the dependencies from the package index."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    installed = subprocess.run([str(root / "bin" / "pip"), "install", "-q", f"{wheel}[bench]"],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        pytest.fail(f"installing the wheel failed (the index must be reachable for numpy, "
                    f"cffi and matplotlib):\n{installed.stderr[-3000:]}")
    return root


def clean_env():
    """The caller's environment without QNCCL_*, PYTHONPATH, LD_PRELOAD or LD_LIBRARY_PATH:
    what the installed package finds, it finds by itself."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("QNCCL_")
            and k not in ("PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH")}


def outside(venv, tmp_path, *argv, timeout=300):
    """argv[0] from the venv's bin/, run from `tmp_path` with clean_env()."""
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=timeout)


def test_the_wheel_carries_the_compiled_parts(wheel):
    assert wheel.name.startswith(f"qnccl-{header_version()}-")
    assert wheel.name.endswith("linux_x86_64.whl")  # compiled code: platform-specific
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    for part in NATIVE:
        assert f"qnccl/_native/{part}" in names, part
    for part in EXECUTABLES:  # the mode pip restores
        mode = archive.getinfo(f"qnccl/_native/{part}").external_attr >> 16
        assert mode & 0o111, f"{part} is not executable in the wheel ({oct(mode)})"
    assert "qnccl/_ffi.py" in names and "qnccl/cli.py" in names
    assert not any(n.startswith(("tests/", "perf/", "src/")) for n in names)
    # nccl.h is QNCCL's own declaration of the NCCL API, not NVIDIA's header
    nccl_h = archive.read("qnccl/_native/include/nccl.h").decode()
    assert '#include "nccl_abi.h"' in nccl_h and "NVIDIA" not in nccl_h
    assert archive.read("qnccl/_native/host/libnccl.so") == \
        archive.read("qnccl/_native/host/libnccl.so.2")


def test_the_wheel_carries_the_trees_modules_and_no_others(wheel):
    """Its Python modules are the tree's, exactly: none left over from an earlier build (a
    module since moved, like the old qnccl/bench.py) and none missing."""
    tree = subprocess.run(["git", "ls-files", "qnccl"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.split()
    want = {name for name in tree if name.endswith(".py")}
    got = {n for n in zipfile.ZipFile(wheel).namelist()
           if n.startswith("qnccl/") and n.endswith(".py") and not n.startswith("qnccl/_native/")}
    assert got == want, f"only in the wheel: {sorted(got - want)}; missing: {sorted(want - got)}"


def test_the_build_backend_serves_every_pep517_and_pep660_hook():
    """scripts/build_backend.py wraps setuptools' backend: a regular build, an sdist and an
    editable install (make setup's pip install -e .) each find their hooks."""
    code = ("import build_backend as b\n"
            "hooks = ['build_wheel', 'build_sdist', 'get_requires_for_build_wheel',\n"
            "         'get_requires_for_build_sdist', 'prepare_metadata_for_build_wheel',\n"
            "         'build_editable', 'get_requires_for_build_editable',\n"
            "         'prepare_metadata_for_build_editable']\n"
            "print(*[h for h in hooks if not callable(getattr(b, h, None))])\n")
    missing = subprocess.run([sys.executable, "-c", code], cwd=REPO / "scripts",
                             capture_output=True, text=True, check=True).stdout.split()
    assert missing == []


def test_a_build_without_the_cuda_toolkit_stops_and_says_how(tmp_path):
    """make: a library asked for with kernels (CUDA=1, the default) and no toolkit stops
    before compiling anything, naming the ways out; CUDA=0 builds on purpose without."""
    target = f"{tmp_path}/lib/libqnccl.so"
    stopped = subprocess.run(["make", "-n", f"BUILD={tmp_path}", "CUDA_ROOT=", target],
                             cwd=REPO, capture_output=True, text=True)
    assert stopped.returncode != 0
    assert "no CUDA 12 toolkit" in stopped.stderr and "make setup" in stopped.stderr
    assert "CUDA=0" in stopped.stderr
    planned = subprocess.run(["make", "-n", f"BUILD={tmp_path}", "CUDA=0", target], cwd=REPO,
                             capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert "QNCCL_WITH_CUDA" not in planned.stdout


def test_a_wheel_build_refuses_an_unknown_cuda_setting(tmp_path):
    """CUDA is 1 or 0: any other value stops the wheel's build, saying so, rather than
    building one or the other silently."""
    made = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path)],
                          env=dict(os.environ, CUDA="yes", BUILD=str(tmp_path / "build")),
                          capture_output=True, text=True, timeout=600)
    assert made.returncode != 0
    assert "CUDA='yes': must be 1" in made.stdout + made.stderr
    assert not list(tmp_path.glob("*.whl"))


def test_the_wheels_binaries_carry_no_debug_sections(wheel, tmp_path):
    """Its ELF files are stripped of -g's debug sections (two thirds of the library's size) and
    keep their symbols; the library keeps its CUDA images. Size: the parts' sum, no more."""
    zipfile.ZipFile(wheel).extractall(tmp_path)
    native = tmp_path / "qnccl" / "_native"
    for part in ELF:
        sections = subprocess.run(["readelf", "-S", "-W", str(native / part)],
                                  capture_output=True, text=True, check=True).stdout
        assert ".debug_info" not in sections, f"{part} still has debug sections"
        assert ".symtab" in sections or part != "lib/libqnccl.so", part
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(native / "lib/libqnccl.so")],
                             capture_output=True, text=True, check=True).stdout
    assert re.search(r" T ncclAllReduce$", symbols, re.M)
    assert re.search(r" T qncclQuantize$", symbols, re.M)
    unpacked = sum(f.stat().st_size for f in native.rglob("*") if f.is_file())
    from_build = sum((REPO / source).stat().st_size for source in _native.PARTS.values())
    assert unpacked < from_build, "the wheel's parts are not smaller than the build's"
    assert wheel.stat().st_size < unpacked  # compressed


def test_info_works_outside_the_tree(venv, tmp_path, tree_info):
    """`qnccl info` of the installed package: its library, and the CUDA architectures it
    carries, the same as the build the wheel came from."""
    result = outside(venv, tmp_path, "qnccl", "info")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"qnccl package  {header_version()}" in result.stdout
    assert re.search(rf"library +{re.escape(header_version())} at {re.escape(str(venv))}\S*"
                     r"/qnccl/_native/lib/libqnccl\.so", result.stdout), result.stdout
    assert "Traceback" not in result.stderr and "CUDA toolkit" not in result.stdout
    want = cuda_archs_row(tree_info)
    assert want and re.search(r"sm_\d+", want), tree_info  # the tree's build has kernels
    assert cuda_archs_row(result.stdout) == want, result.stdout


def test_config_prints_the_packages_flags(venv, tmp_path):
    result = outside(venv, tmp_path, "qnccl", "config", "--cflags", "--libs")
    assert result.returncode == 0, result.stderr
    native = next(venv.glob("lib/python3*/site-packages/qnccl/_native"))
    assert result.stdout.split() == [f"-I{native / 'include'}", f"-L{native / 'host'}",
                                     f"-Wl,-rpath,{native / 'host'}", "-lnccl"]
    pkg_config = shutil.which("pkg-config") or shutil.which("pkgconf")
    if pkg_config:  # the .pc file gives the same flags, relative to where it is
        path = outside(venv, tmp_path, "qnccl", "config", "--pkg-config-path").stdout.strip()
        flags = subprocess.run([pkg_config, "--cflags", "--libs", "qnccl"], capture_output=True,
                               text=True, env=dict(os.environ, PKG_CONFIG_PATH=path))
        assert flags.returncode == 0, flags.stderr
        assert [Path(f[2:]).resolve() for f in flags.stdout.split() if f.startswith("-I")] == \
            [native / "include"]
        assert "-lnccl" in flags.stdout.split()


def test_a_program_built_against_the_package_runs_quantized(venv, tmp_path):
    """tests/programs/nccl_allreduce.c (a plain NCCL + MPI program), copied out of the tree,
    compiled with `mpicc $(qnccl config --cflags --libs)` and run on 2 ranks as the README
    says, `qnccl run <flags> -- mpirun -np 2 ./prog`, from that folder, with nothing of the
    tree in the environment: every eligible call bit for bit the emulator's allreduce, every
    other call the program's plain run's bytes (linked to the package's host backend by the
    rpath of --libs alone)."""
    mpicc = shutil.which("mpicc") or pytest.fail("mpicc not found: run `make setup`")
    shutil.copy(PROGRAM_SOURCE, tmp_path / "prog.c")
    flags = outside(venv, tmp_path, "qnccl", "config", "--cflags", "--libs").stdout.split()
    compiled = subprocess.run([mpicc, "-std=c11", "-O2", "-Wall", "-Werror", "prog.c", *flags,
                               "-o", "prog"], cwd=tmp_path, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    runs = {}
    for name, launcher in (("plain", ()), ("quantized", (str(venv / "bin" / "qnccl"), "run",
                                                          *RUN_FLAGS, "--"))):
        (tmp_path / name).mkdir()
        with pytest.MonkeyPatch.context() as patch:
            for variable in [k for k in os.environ if k not in clean_env()]:
                patch.delenv(variable)
            job = mpi.run(2, ["./prog", name], timeout=180, cwd=tmp_path, launcher=launcher)
        runs[name] = load_run(tmp_path / name, nranks=2)
    assert "QNCCL INFO" in job.stdout and str(venv) in job.stdout  # the package's library
    number = 0
    for before, call in zip(runs["plain"], runs["quantized"]):
        if not eligible(call):
            assert all(same_bytes(a, b) for a, b in zip(call.outputs, before.outputs)), call.name
            continue
        expected = emulate(call, number)
        assert all(same_bytes(out, expected) for out in call.outputs), call.name
        assert not same_bytes(expected, before.outputs[0]), call.name  # quantized, not exact
        number += 1
    assert number >= 8


def test_bench_runs_from_the_package_and_writes_under_the_current_folder(venv, tmp_path):
    """`qnccl bench --sizes 1M:1M` (cut to one quantized row and its baseline) runs the
    package's perf binaries and netlab, and writes its results under the current folder."""
    result = outside(venv, tmp_path, "qnccl", "bench", "--sizes", "1M:1M", "--rates", "1gbit",
                     "--bits", "4", "--buckets", "128", "--algos", "sra", "--dtypes",
                     "float32", "--baselines", "mpi", "--rotated-rows", "off",
                     "--nodes-section", "off",
                     "--collectives-section", "off", "--shm-section", "off", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "qnccl-bench"
    for name in ("report.json", "summary.md", "busbw.png"):
        assert (out / name).is_file(), name
    site = next(venv.glob("lib/python3*/site-packages"))
    assert not list(site.rglob("report.json")), "bench wrote inside site-packages"
    report = (out / "report.json").read_text()
    assert f"{site}/qnccl/_native/bin/all_reduce_perf" in report
    assert f"{site}/qnccl/_native/bin/mpi_all_reduce_perf" in report


def test_round_trip_matches_the_emulator(venv, tmp_path):
    code = ("import numpy as np, qnccl, qnccl.codec as c\n"
            "from qnccl.emulate import codec as e\n"
            "x = np.random.default_rng(1).standard_normal(10000).astype(np.float32)\n"
            "q = c.quantize(x, bits=4, bucket_size=128, rounding='stochastic', seed=5)\n"
            "want = e.quantize(x, 4, 128, 'stochastic', seed=5)\n"
            "assert np.array_equal(q.data, want), 'bytes differ from the emulator'\n"
            "y = c.dequantize(q)\n"
            "assert np.array_equal(y, e.dequantize(want, x.size, 4, 128, 'float32'))\n"
            "print('OK', qnccl.__version__, qnccl.version(), qnccl.__file__)\n")
    result = outside(venv, tmp_path, "python", "-c", code)
    assert result.returncode == 0, result.stderr
    ok, package_version, library_version, where = result.stdout.split()
    assert package_version == library_version == header_version()
    assert where.startswith(str(venv))


def test_run_preloads_the_packaged_library(venv, tmp_path):
    result = outside(venv, tmp_path, "qnccl", "run", "--bits", "3", "--", "sh", "-c",
                     "echo $LD_PRELOAD $QNCCL_BITS")
    assert result.returncode == 0, result.stderr
    preload, bits = result.stdout.split()
    assert preload.startswith(str(venv)) and preload.endswith("/qnccl/_native/lib/libqnccl.so")
    assert bits == "3"


def test_missing_parts_say_what_to_do(monkeypatch, tmp_path):
    from qnccl import _native
    gone = tmp_path / "libqnccl.so"
    monkeypatch.setenv("QNCCL_LIB", str(gone))
    assert "QNCCL_LIB names it" in _native.missing(gone, "QNCCL_LIB")
    monkeypatch.delenv("QNCCL_LIB")
    assert "run `make` in" in _native.missing(gone, "QNCCL_LIB")  # a source tree
    monkeypatch.setattr(_native, "PACKAGED", tmp_path)  # an installed package
    assert "reinstall it" in _native.missing(gone, "QNCCL_LIB")


def test_info_finds_the_nccl_wheel_behind_an_nvidia_package(tmp_path):
    """`qnccl info`'s NCCL wheel: found along sys.path even where another folder on the path
    holds an nvidia/__init__.py, which hides the wheels' namespace package from an import (a
    copied CUDA runtime folder did so on a GPU machine, docs/gpu.md)."""
    lib = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    shadow = tmp_path / "cuda12" / "nvidia"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    path = os.pathsep.join(str(p) for p in (REPO, tmp_path / "cuda12", tmp_path / "site"))
    run = subprocess.run([sys.executable, "-c", "import qnccl.cli; print(qnccl.cli.nccl_wheel())"],
                         env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(lib / "libnccl.so.2")
