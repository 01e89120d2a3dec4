"""Every instruction-set build of the host codec writes the same bytes.

libqnccl.so carries the host codec once per instruction set (generic, and
avx2 and avx512 on x86-64) and runs the fastest the CPU has; QNCCL_HOST_ISA
picks another. The default run of test_codec.py checks the fastest against
the emulator; here each other build runs the same byte-for-byte tests, plus
the ones that touch buffer ends and padding, in a process of its own.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnccl import _lib

TESTS = Path(__file__).resolve().parent
BYTE_EXACT = ("test_library_matches_emulator_byte_for_byte or "
              "test_random_configurations_match_emulator or "
              "test_values_at_cubic_thresholds_match_emulator or "
              "test_stochastic_rounding_stays_inside_the_cubic_grid_at_its_ends or "
              "test_padding_bits_and_bytes_are_zero or "
              "test_buffers_are_not_accessed_past_their_ends or "
              "test_nonfinite_bucket or test_constant_buckets or test_error_bounds or "
              "test_rotated_codec or test_clipped_codec")


def isa_in_use(env_value):
    """The ISA a fresh process runs with QNCCL_HOST_ISA=env_value, or the error it reports."""
    code = ("import qnccl._lib as L; f = L.ffi(); p = f.new('const char**')\n"
            "r = L.lib().qncclHostCodecIsa(p)\n"
            "print(f.string(p[0]).decode() if r == 0 else "
            "'error: ' + f.string(L.lib().qncclGetLastError()).decode())")
    env = dict(os.environ, QNCCL_HOST_ISA=env_value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def fastest_isa():
    p = _lib.ffi().new("const char**")
    _lib.check(_lib.lib().qncclHostCodecIsa(p))
    return _lib.ffi().string(p[0]).decode()


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_each_instruction_set_matches_the_emulator(isa):
    if isa == fastest_isa():
        pytest.skip(f"{isa} is the default: test_codec.py covers it")
    used = isa_in_use(isa)
    if used.startswith("error"):
        pytest.skip(f"this CPU or build lacks {isa}: {used}")
    assert used == isa
    env = dict(os.environ, QNCCL_HOST_ISA=isa)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_codec.py"),
         "-k", BYTE_EXACT],
        env=env, capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, f"QNCCL_HOST_ISA={isa}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"


def test_unknown_instruction_set_fails_every_host_call_with_the_allowed_names():
    used = isa_in_use("sse9")
    assert used.startswith("error: QNCCL_HOST_ISA=sse9")
    assert "allowed:" in used and "generic" in used
    code = ("import numpy as np, qnccl.codec as c\n"
            "try:\n    c.quantize(np.ones(8, np.float32))\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = dict(os.environ, QNCCL_HOST_ISA="sse9")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.startswith("QncclError") and "QNCCL_HOST_ISA=sse9" in out
