"""The source tree keeps its layers (docs/design.md): each directory of src/
includes only its own headers and those of the layers below it, and every
exported qnccl* entry point of libqnccl.so is defined in src/api/api.cc."""
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
# Each layer and the layers it may include (besides itself and the public headers).
ALLOWED = {
    "common": set(),
    "codec": {"common"},
    "config": {"common"},
    "engine": {"common", "codec", "config"},
    "shim": {"common", "codec", "config", "engine"},
    "api": {"common", "codec", "config", "engine", "shim"},
    "host_backend": {"common", "codec"},  # the stand-in NCCL: errors, the type tables, the hash
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(layer):
    return sorted(p for p in (SRC / layer).iterdir() if p.suffix in (".h", ".cc", ".cu"))


def test_every_layer_is_known():
    dirs = {p.name for p in SRC.iterdir() if p.is_dir() and p.name != "include"}
    assert dirs == set(ALLOWED), f"layers not described here: {dirs ^ set(ALLOWED)}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_includes_only_layers_below(layer):
    bad = []
    for path in sources(layer):
        for header in INCLUDE.findall(path.read_text()):
            if "/" not in header:  # public headers (src/include) and same-directory ones
                continue
            other = header.split("/")[0]
            if other != layer and other not in ALLOWED[layer]:
                bad.append(f"{path.relative_to(SRC)} includes {header}")
    assert not bad, "\n".join(bad)


def test_qnccl_entry_points_live_in_the_api_file():
    declared = set(re.findall(r"\b(qnccl[A-Z]\w*)\s*\(", (SRC / "include" / "qnccl.h").read_text()))
    defined = {}
    for path in SRC.rglob("*.c*"):
        for name in re.findall(r"QNCCL_EXPORT\s+[\w\s\*]+?\b(qnccl[A-Z]\w*)\s*\(",
                               path.read_text()):
            defined.setdefault(name, []).append(path.relative_to(SRC).as_posix())
    assert declared, "no qnccl* functions found in qnccl.h"
    assert set(defined) == declared, f"declared, not defined: {declared - set(defined)}; " \
                                     f"defined, not declared: {set(defined) - declared}"
    elsewhere = {n: p for n, p in defined.items() if p != ["api/api.cc"]}
    assert not elsewhere, f"defined outside src/api/api.cc: {elsewhere}"
