"""The CUDA side of the build: the kernel images NVRTC made (CUDA 12.9, read
with NVIDIA's cuobjdump: machine code for each architecture, PTX for one),
embedded byte for byte in libqnccl.so, which links the CUDA 12 runtime and
reports the same architectures (qncclCudaInfo, `qnccl info`); and the rule
`qnccl info` applies to say whether the installed driver runs them. Needs no
GPU."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpi import BUILD, REPO
from qnccl import _lib, cli

LIBQNCCL = BUILD / "lib" / "libqnccl.so"
# What the Makefile builds by default (CUDA_ARCHS, CUDA_PTX).
DEFAULT_SASS = ["70", "80", "90", "100", "120"]
DEFAULT_PTX = ["70"]


@pytest.mark.parametrize("runtime, driver, verdict", [
    (13000, 0, "no CUDA driver"),
    (13000, 12040, "no: the driver (CUDA 12.4) is older than the kernels' runtime (CUDA 13.0)"),
    (12090, 12000, "yes (CUDA 12.0 driver, CUDA 12.9 runtime; PTX from CUDA 12.9 does not JIT"),
    (12090, 12090, "yes (CUDA 12.9 driver, CUDA 12.9 runtime)"),
    (12090, 13010, "yes (CUDA 13.1 driver, CUDA 12.9 runtime)"),
    (13000, 13000, "yes (CUDA 13.0 driver, CUDA 13.0 runtime)"),
])
def test_driver_verdict(runtime, driver, verdict):
    """A driver runs the machine code of any runtime of its major version or
    older (CUDA's minor version compatibility); PTX only up to its own version."""
    assert cli.driver_verdict(runtime, driver).startswith(verdict)


def cuda_info():
    ffi, lib = _lib.ffi(), _lib.lib()
    info = ffi.new("qncclCudaInfo_t*")
    _lib.check(lib.qncclCudaInfo(info))
    return info, ffi


def test_cuda_info_rejects_null():
    with pytest.raises(_lib.QncclError, match="info is NULL"):
        _lib.check(_lib.lib().qncclCudaInfo(_lib.ffi().NULL))


def cuobjdump():
    found = shutil.which("cuobjdump") or next(
        (str(p) for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump")),
        None)
    return found or pytest.fail("cuobjdump not found: run `make setup` (installs "
                                "nvidia-cuda-cuobjdump)")


MODULES = ("codec", "engine")  # Makefile: KERNEL_MODULES
TYPES = ("f32", "f16", "bf16")
# The kernels the host code launches by name (codec_cuda.cc, compute_cuda.cc).
KERNELS = {
    "codec": {f"qnccl_stats_{t}" for t in TYPES} | {f"qnccl_stats_many_{t}" for t in TYPES}
    | {f"qnccl_encode_{t}_{b}_{r}" for t in TYPES for b in range(1, 9)
       for r in ("nearest", "stochastic")}
    | {f"qnccl_decode_{t}_{b}_{m}" for t in TYPES for b in range(1, 9)
       for m in ("store", "accumulate")}
    | {f"qnccl_{k}_{t}_{b}" for k in ("reduce", "decode_many") for t in TYPES
       for b in range(1, 9)},
    "engine": {f"qnccl_{k}_{t}" for k in ("widen", "narrow", "rotate", "unrotate",
                                           "unrotate_stage") for t in TYPES}
    | {"qnccl_divide", "qnccl_residual", "qnccl_set_calls", "qnccl_take_call",
       "qnccl_rotation_masks", "qnccl_rotate_stage"},
}


def test_library_carries_the_architectures_it_reports():
    info, ffi = cuda_info()
    if not info.compiled:
        pytest.skip("libqnccl.so was built without CUDA")
    reported_sass = ffi.string(info.sass).decode().split(",")
    reported_ptx = ffi.string(info.ptx).decode().split(",")
    assert info.runtimeVersion // 1000 == 12, "the kernels must link a CUDA 12 runtime"
    library = LIBQNCCL.read_bytes()
    tool = cuobjdump()
    for module in MODULES:
        images = sorted((BUILD / "gen").glob(f"{module}.*"))
        cubins = [p for p in images if p.suffix == ".cubin"]
        ptxs = [p for p in images if p.suffix == ".ptx"]
        assert sorted(p.stem.split("sm_")[1] for p in cubins) == sorted(reported_sass), images
        assert sorted(p.stem.split("compute_")[1] for p in ptxs) == sorted(reported_ptx), images
        for cubin in cubins:  # machine code for its architecture, by CUDA 12, every kernel
            arch = cubin.stem.split("sm_")[1]
            elf = subprocess.run([tool, "-elf", str(cubin)], capture_output=True, text=True,
                                 check=True).stdout
            assert re.search(rf"sm={arch}, toolkit=12\.?\d\b", elf), elf[:300]  # 129 or 12.9
            assert set(re.findall(r"^\.nv\.info\.(qnccl_\w+)$", elf, re.M)) == KERNELS[module]
        for ptx in ptxs:
            text = ptx.read_text()
            assert re.search(r"^\.version 8\.\d", text, re.M), f"{ptx}: not PTX of CUDA 12"
            assert re.search(rf"^\.target sm_{ptx.stem.split('compute_')[1]}\b", text, re.M)
        for image in images:  # embedded unchanged
            assert image.read_bytes() in library, f"{image} is not inside {LIBQNCCL}"
    shown = subprocess.run([sys.executable, "-m", "qnccl", "info"], capture_output=True,
                           text=True, timeout=60).stdout
    row = re.search(r"^CUDA archs +(.*)$", shown, re.M)
    assert row and row.group(1) == " ".join(f"sm_{a}" for a in reported_sass) + ", PTX " + \
        " ".join(f"compute_{a}" for a in reported_ptx), shown
    assert re.search(r"^CUDA kernels +built in, CUDA 12\.\d runtime", shown, re.M), shown


def test_default_build_targets_every_supported_gpu():
    """`make` without CUDA_ARCHS builds sm_70 to sm_120 machine code (each major version's
    first minor one: a T4 (7.5) runs sm_70's, an sm_86 or sm_89 GPU sm_80's) and PTX of the
    oldest (compute_70), so one library loads on every GPU from V100 on, where PyTorch
    runs (the library test above then checks that a library carries what it says)."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CUDA_ARCHS \?= (.*)$", makefile, re.M).group(1).split() == DEFAULT_SASS
    assert re.search(r"^CUDA_PTX \?= (.*)$", makefile, re.M).group(1) == \
        "$(firstword $(CUDA_ARCHS))" and DEFAULT_PTX == DEFAULT_SASS[:1]


# PTX opcodes whose float results differ from the host codec's (codec_math.h computes every
# value with separately rounded IEEE operations): a fused multiply-add (fma, or mad on a
# float type), flushed subnormals (.ftz), approximate functions (.approx, rcp, div.full).
INEXACT = re.compile(r"^(fma\b|mad\.\S*f(16|32|64)|rcp\b|div\.full\b)|\.(ftz|approx)\b")
# A float add, sub or mul without an explicit rounding mode may be contracted into an FMA
# by ptxas, the machine-code compiler; with one (.rn) it may not (PTX ISA, "Floating Point
# Instructions"). So every one of them must name its rounding.
ROUNDED = re.compile(r"^(add|sub|mul)\.(f16|bf16|f32|f64)\b")


def changes_results(op):
    """Whether a PTX opcode (with its modifiers) may compute other floats than codec_math.h."""
    return bool(INEXACT.search(op) or (ROUNDED.match(op) and
                                       not re.search(r"\.(rn|rz|rm|rp)\b", op)))


def opcodes(ptx):
    """Each instruction of a PTX text: (line number, opcode with its modifiers)."""
    for number, line in enumerate(ptx.splitlines(), 1):
        m = re.match(r"\s*(?:@!?%\w+\s+)?([a-z][\w.]*)\s", line)
        if m and not line.lstrip().startswith((".", "//")):
            yield number, m.group(1)


@pytest.mark.parametrize("module", MODULES)
def test_ptx_keeps_the_host_codecs_float_semantics(module):
    """The kernels compute the host codec's bytes only if NVRTC keeps codec_math.h's
    operations as written (--fmad=false --prec-div=true --ftz=false): the generated PTX has
    no fused, flushed or approximate float instruction, and every float add, sub and mul
    names its rounding mode, so the machine-code compiler may not fuse them either. (The
    simulated GPU runs the same source with the same semantics on the CPU; what it cannot
    see, NVRTC's code generation, this checks.)"""
    ptxs = sorted((BUILD / "gen").glob(f"{module}.compute_*.ptx"))
    assert ptxs, f"no PTX of {module} in {BUILD / 'gen'}: build with `make`"
    for ptx in ptxs:
        text = ptx.read_bytes().rstrip(b"\0").decode("ascii")
        ops = list(opcodes(text))
        assert any(op.startswith("ld.") for _, op in ops), f"{ptx}: no instruction parsed"
        bad = [f"line {n}: {op}" for n, op in ops if changes_results(op)]
        assert not bad, f"{ptx}: instructions that change the float results: {bad[:10]}"


@pytest.mark.parametrize("op, inexact", [
    ("fma.rn.f32", True), ("mad.rn.f32", True), ("mad.lo.s32", False), ("rcp.rn.f32", True),
    ("div.full.f32", True), ("div.rn.f32", False), ("ex2.approx.f32", True),
    ("add.rn.ftz.f32", True), ("cvt.rzi.s32.f32", False), ("mul.rn.f32", False),
    ("mul.f32", True), ("sub.f16", True), ("add.s32", False)])
def test_ptx_check_recognizes_inexact_instructions(op, inexact):
    """The check above on single instructions, so that it cannot pass by matching nothing."""
    assert changes_results(op) == inexact
    assert list(opcodes(f"\t{op} \t%f1, %f2, %f3;\n\t@%p1 {op} %f1, %f2;")) == [(1, op), (2, op)]
