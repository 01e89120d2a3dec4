"""The installable package (setup.py, qnccl/_native.py): `pip wheel .` builds a wheel that
carries libqnccl.so, the host backend, the cffi declarations, the C headers and codec_bench,
versioned by qnccl.h; installed into a fresh virtual environment and used from a directory
outside the source tree, `qnccl info`, `qnccl run` and a quantize/dequantize round trip
work, the round trip bit for bit the emulator's. Where a compiled part is missing, the
message says what to do in each situation."""
import os
import re
import subprocess
import sys
import zipfile

import pytest

from mpi import REPO
from test_allreduce import built  # noqa: F401  (fails the module without a build)

NATIVE = ["lib/libqnccl.so", "host/libnccl.so.2", "include/qnccl_cdef.h", "include/qnccl.h",
          "include/nccl_abi.h", "bin/codec_bench"]


def header_version():
    text = (REPO / "src" / "include" / "qnccl.h").read_text()
    return ".".join(re.search(rf"#define QNCCL_{p} (\d+)", text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    made = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out)],
                          capture_output=True, text=True, timeout=1200)
    if made.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{made.stdout[-3000:]}\n{made.stderr[-3000:]}")
    (path,) = out.glob("qnccl-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh virtual environment (no system site packages) with the wheel installed, its
    dependencies from the package index."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    installed = subprocess.run([str(root / "bin" / "pip"), "install", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=900)
    if installed.returncode != 0:
        pytest.fail(f"installing the wheel failed (the index must be reachable for numpy and "
                    f"cffi):\n{installed.stderr[-3000:]}")
    return root


def outside(venv, tmp_path, *argv):
    """argv[0] from the venv's bin/, run from `tmp_path` with no QNCCL_* or PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("QNCCL_") and k not in ("PYTHONPATH", "LD_PRELOAD")}
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_the_compiled_parts(wheel):
    assert wheel.name.startswith(f"qnccl-{header_version()}-")
    assert wheel.name.endswith("linux_x86_64.whl")  # compiled code: platform-specific
    names = set(zipfile.ZipFile(wheel).namelist())
    for part in NATIVE:
        assert f"qnccl/_native/{part}" in names, part
    assert "qnccl/_ffi.py" in names and "qnccl/cli.py" in names
    assert not any(n.startswith(("tests/", "perf/", "src/")) for n in names)


def test_info_works_outside_the_tree(venv, tmp_path):
    result = outside(venv, tmp_path, "qnccl", "info")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"qnccl package  {header_version()}" in result.stdout
    assert re.search(rf"library +{re.escape(header_version())} at {re.escape(str(venv))}\S*"
                     r"/qnccl/_native/lib/libqnccl\.so", result.stdout), result.stdout
    assert "Traceback" not in result.stderr and "CUDA toolkit" not in result.stdout


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
