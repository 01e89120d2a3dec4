"""src/include/nccl_abi.h against NVIDIA's nccl.h: every enumerator, macro,
type layout, struct field offset and function signature we declare must equal
the reference (nvidia-nccl-cu13, fetched by `make setup`).

The list of facts is generated from nccl_abi.h itself (parsed with pycparser),
then tests/abi/facts.cc is compiled once against each header and
tests/abi/compare.cc diffs the two (see tests/abi/facts.cc for why typeid names
compare signatures exactly).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pycparser import c_ast, c_parser

REPO = Path(__file__).resolve().parents[1]
ABI_DIR = REPO / "tests" / "abi"
OURS_INCLUDE = REPO / "src" / "include"
CXX = os.environ.get("CXX", "g++")
CXXFLAGS = ["-std=c++17", "-O0", "-Wall"]

# Types the preprocessed header uses without declaring (QNCCL_CDEF skips the
# system headers), for the parser only.
_PRELUDE_TYPES = {"size_t": "unsigned long", "uint64_t": "unsigned long", "int64_t": "long",
                  "uint32_t": "unsigned int", "int32_t": "int", "uint8_t": "unsigned char",
                  "uintptr_t": "unsigned long", "intptr_t": "long"}


def reference_include():
    env = os.environ.get("QNCCL_NCCL_REFERENCE_INCLUDE")
    return Path(env) if env else REPO / ".venv" / "nccl-reference" / "include"


def cuda_include():
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"


def requirements_missing():
    """Why the test cannot run here, or None."""
    if not (reference_include() / "nccl.h").is_file():
        return (f"no reference nccl.h in {reference_include()}: run `make setup` with network "
                "access (downloads nvidia-nccl-cu13) or set QNCCL_NCCL_REFERENCE_INCLUDE")
    if not (cuda_include() / "cuda_runtime.h").is_file():
        return (f"no CUDA headers in {cuda_include()} (nccl.h includes cuda_runtime.h): "
                "install the CUDA toolkit or set CUDA_HOME")
    if not shutil.which(CXX):
        return f"no C++ compiler {CXX!r}"
    return None


pytestmark = pytest.mark.skipif(requirements_missing() is not None,
                                reason=str(requirements_missing()))


def generate_facts(header):
    """The X-macro list (abi_facts.inc) of everything `header` declares."""
    pre = subprocess.run([CXX, "-E", "-P", "-x", "c", "-DQNCCL_CDEF", str(header)],
                         check=True, capture_output=True, text=True).stdout
    prelude = "".join(f"typedef {c} {name};\n" for name, c in _PRELUDE_TYPES.items())
    ast = c_parser.CParser().parse(prelude + pre, filename=str(header))

    lines = []
    for node in ast.ext:
        if isinstance(node, c_ast.Typedef):
            if node.name in _PRELUDE_TYPES:
                continue
            lines.append(f"ABI_TYPE({node.name})")
            inner = node.type.type if isinstance(node.type, c_ast.TypeDecl) else None
            if isinstance(inner, c_ast.Enum) and inner.values:
                lines.append(f"ABI_ENUM({node.name})")
                lines += [f"ABI_VALUE({e.name})" for e in inner.values.enumerators]
            elif isinstance(inner, c_ast.Struct) and inner.decls:
                lines += [f"ABI_FIELD({node.name}, {d.name})" for d in inner.decls]
        elif isinstance(node, c_ast.Decl) and isinstance(node.type, c_ast.FuncDecl):
            lines.append(f"ABI_FUNC({node.name})")
        else:
            raise AssertionError(f"generate_facts: unhandled declaration at {node.coord}; "
                                 "teach tests/test_abi.py to check it")

    # NVIDIA's object-like macros (NCCL_*; QNCCL_* ones are ours, checked in facts.cc).
    macros = subprocess.run([CXX, "-dM", "-E", "-x", "c", "-DQNCCL_CDEF", str(header)],
                            check=True, capture_output=True, text=True).stdout
    lines += [f"ABI_VALUE({m})" for m in re.findall(r"^#define (NCCL_\w+) ", macros, re.M)]
    return "\n".join(lines) + "\n"


def compile_facts(side, include_dirs, gen_dir, out, defines=()):
    flags = [f"-I{d}" for d in (gen_dir, ABI_DIR, *include_dirs)] + [f"-D{d}" for d in defines]
    build([CXX, *CXXFLAGS, f"-DABI_SIDE_{side}", *flags, "-c", str(ABI_DIR / "facts.cc"),
           "-o", str(out)])
    return out


def build(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"


def run_compare(ours_obj, ab):
    exe = ours_obj.with_suffix(".exe")
    build([CXX, str(ours_obj), str(ab["ref_obj"]), str(ab["compare_obj"]), "-o", str(exe)])
    return subprocess.run([str(exe)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    """The facts list and the objects that every comparison shares."""
    tmp = tmp_path_factory.mktemp("abi")
    inc = generate_facts(OURS_INCLUDE / "nccl_abi.h")
    (tmp / "abi_facts.inc").write_text(inc)
    ref_obj = compile_facts("REFERENCE", [reference_include(), cuda_include()], tmp,
                            tmp / "reference.o")
    compare_obj = tmp / "compare.o"
    build([CXX, *CXXFLAGS, f"-I{ABI_DIR}", "-c", str(ABI_DIR / "compare.cc"), "-o",
           str(compare_obj)])
    return {"tmp": tmp, "facts": inc, "ref_obj": ref_obj, "compare_obj": compare_obj}


def test_facts_cover_the_header(ab):
    # Guards the generator: a parse that silently found nothing would pass vacuously.
    facts = ab["facts"]
    for expected in ("ABI_VALUE(ncclMaxRedOp)", "ABI_VALUE(ncclNumOps)", "ABI_VALUE(ncclFloat8e5m2)",
                     "ABI_VALUE(ncclScalarHostImmediate)", "ABI_FIELD(ncclConfig_t, nvlsHostMode)",
                     "ABI_TYPE(ncclUniqueId)", "ABI_FUNC(ncclAllReduce)", "ABI_FUNC(ncclGroupEnd)",
                     "ABI_VALUE(NCCL_API_MAGIC)", "ABI_VALUE(NCCL_CONFIG_UNDEF_INT)",
                     "ABI_VALUE(NCCL_SPLIT_NOCOLOR)", "ABI_VALUE(NCCL_UNIQUE_ID_BYTES)"):
        assert expected in facts


# Both views of nccl_abi.h: the C/C++ one and the one the cffi binding parses.
@pytest.mark.parametrize("defines", [(), ("QNCCL_CDEF",)], ids=["c", "cffi"])
def test_nccl_abi_matches_reference(ab, defines):
    out = ab["tmp"] / f"ours_{'_'.join(defines) or 'c'}.o"
    result = run_compare(compile_facts("OURS", [OURS_INCLUDE], ab["tmp"], out, defines), ab)
    assert result.returncode == 0, result.stdout


# Deliberate mistakes in a copy of nccl_abi.h, each of which the check must catch.
MUTATIONS = {
    "enumerator": ("ncclAvg = 4,", "ncclAvg = 3,", "value ncclAvg"),
    "field order": ("int splitShare;\n  int trafficClass;", "int trafficClass;\n  int splitShare;",
                    "field ncclConfig_t.splitShare"),
    "signature": ("ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,"
                  " int peer,",
                  "ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,"
                  " unsigned peer,", "function ncclSend"),
    "macro": ("#define NCCL_API_MAGIC 0xcafebeef", "#define NCCL_API_MAGIC 0xcafebeee",
              "value NCCL_API_MAGIC"),
}


@pytest.mark.parametrize("kind", MUTATIONS)
def test_mismatch_is_caught(ab, kind):
    old, new, fact = MUTATIONS[kind]
    text = (OURS_INCLUDE / "nccl_abi.h").read_text()
    assert text.count(old) == 1, f"mutation {kind!r} no longer applies: update MUTATIONS"
    mutated = ab["tmp"] / kind.replace(" ", "_")
    mutated.mkdir()
    (mutated / "nccl_abi.h").write_text(text.replace(old, new))
    result = run_compare(compile_facts("OURS", [mutated], ab["tmp"], mutated / "ours.o"), ab)
    assert result.returncode == 1, result.stdout
    assert f"MISMATCH {fact}\n" in result.stdout, result.stdout


# The explicit-use mode (docs/install.md, "Using the package from C and C++") with NVIDIA's header: <nccl.h> first, then
# qnccl.h, whose nccl_abi.h then declares nothing NVIDIA's header has.
EXPLICIT_USE_SOURCE = r"""
#include <nccl.h>
#include "qnccl.h"

#include <string.h>

ncclResult_t quantized_sum(float* buf, size_t count, ncclComm_t comm, cudaStream_t stream,
                           double* bound) {
  qncclQuantizedOpConfig_t config;
  memset(&config, 0, sizeof config);
  config.allreduce.codec.bits = 4;
  config.allreduce.codec.bucketSize = 128;
  config.allreduce.codec.rounding = qncclRoundNearest;
  config.allreduce.algo = qncclAlgoAuto;
  config.reduction = ncclSum;
  int nranks = 0;
  ncclResult_t res = ncclCommCount(comm, &nranks);
  if (res != ncclSuccess) return res;
  res = qncclAllReduceErrorBound(count, ncclFloat32, ncclSum, &config.allreduce, nranks, 1.0,
                                 bound);
  if (res != ncclSuccess) return res;
  ncclRedOp_t op;
  res = qncclRedOpCreateQuantized(&op, &config, comm);
  if (res != ncclSuccess) return res;
  res = ncclAllReduce(buf, buf, count, ncclFloat32, op, comm, stream);
  ncclRedOpDestroy(op, comm);
  return res;
}
"""


@pytest.mark.parametrize("language", ["c", "c++"])
def test_qnccl_h_compiles_after_nvidia_nccl_h(tmp_path, language):
    compiler = CXX if language == "c++" else os.environ.get("CC", "gcc")
    if not shutil.which(compiler):
        pytest.skip(f"no {language} compiler {compiler!r}")
    source = tmp_path / ("explicit.cc" if language == "c++" else "explicit.c")
    source.write_text(EXPLICIT_USE_SOURCE)
    build([compiler, "-Wall", "-Wextra", "-Werror", f"-I{reference_include()}",
           f"-I{cuda_include()}", f"-I{OURS_INCLUDE}", "-c", str(source), "-o",
           str(tmp_path / "explicit.o")])


HOST_CUDA_H = REPO / "src" / "host_backend" / "cuda.h"
ABI_CHECK = """#include <cuda.h>
#include <type_traits>
#include "host_backend/cuda.h"

using namespace qnccl::host;

/* Passed the same way: integers and enums of one size, pointers, in the same positions. */
template <class T>
constexpr int kind() {
  return std::is_pointer_v<T> ? 0 : std::is_integral_v<T> || std::is_enum_v<T> ? 1 : 2;
}
template <class A, class B>
constexpr bool same() { return sizeof(A) == sizeof(B) && kind<A>() == kind<B>(); }
template <class... A, class... B>
constexpr bool same_abi(CUresult (*)(A...), CuResult (*)(B...)) {
  if constexpr (sizeof...(A) != sizeof...(B)) return false;
  else return (same<A, B>() && ...);
}
"""


def test_host_backend_cuda_declarations_match_cuda_h(tmp_path):
    """src/host_backend/cuda.h declares the driver's values and function types by hand (the
    backend builds without CUDA): each value equals cuda.h's, each function pointer has the
    parameters of cuda.h's function (count, sizes, pointer or integer), against the CUDA 12
    headers `make setup` installs (the ABI version the backend asks cuGetProcAddress for)."""
    include = next((Path(p) / "nvidia" / "cuda_runtime" / "include"
                    for p in sys.path
                    if (Path(p) / "nvidia" / "cuda_runtime" / "include" / "cuda.h").is_file()),
                   None)
    if include is None:
        pytest.fail("the CUDA 12 runtime wheel's cuda.h is missing: run `make setup`")
    text = HOST_CUDA_H.read_text()
    values = re.findall(r"(kCu\w+) = \d+,\s*// (CU_\w+)", text)
    struct = text[text.index("struct Cuda {"):text.index("};", text.index("struct Cuda {"))]
    functions = re.findall(r"CuResult \(\*(\w+)\)\(", struct)
    assert len(values) >= 10 and len(functions) >= 15, (values, functions)
    checks = [f'static_assert({k} == {cu}, "{k} is not {cu}");' for k, cu in values]
    checks += [f'static_assert(same_abi(&cu{f[0].upper()}{f[1:]}, decltype(Cuda::{f}){{}}), '
               f'"Cuda::{f} is not declared as cu{f[0].upper()}{f[1:]}");' for f in functions]
    source = tmp_path / "cuda_abi.cc"
    source.write_text(ABI_CHECK + "\n".join(checks) + "\n")
    build([CXX, "-std=c++17", "-fsyntax-only", f"-I{include}", f"-I{REPO / 'src'}", str(source)])
