"""docker/Dockerfile and .dockerignore, read as the builders read them (no builder runs in
the suite: building the runtime image downloads PyTorch for CUDA, gigabytes). The recipe's
steps that can run here run elsewhere: the wheel it installs is built and installed in a
fresh venv by tests/test_package.py, and `qnccl run` is its entry point there too."""
import fnmatch
import os
import re
import subprocess
import sys

from mpi import REPO

DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def stages():
    """[(name, [instruction lines])] of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            out.append((m.group(1), []))
        elif out:
            out[-1][1].append(line)
    return out


def ignored(path):
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(prefix, p.removeprefix("**/")) or fnmatch.fnmatch(prefix, p)
               or fnmatch.fnmatch(prefix.split("/")[-1], p.removeprefix("**/"))
               for p in patterns for prefix in prefixes)


def test_the_context_leaves_out_what_a_working_tree_makes():
    for path in (".venv/bin/python", "build/lib/libqnccl.so", ".git/HEAD", "qnccl.egg-info/PKG-INFO",
                 "qnccl/_native/lib/libqnccl.so", "qnccl/__pycache__/cli.cpython-311.pyc",
                 "tests/__pycache__/mpi.cpython-311.pyc", ".pytest_cache/README.md"):
        assert ignored(path), path
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked and not [p for p in tracked if ignored(p)]


def test_runtime_is_the_default_target_and_test_stays_a_target():
    names = [name for name, _ in stages()]
    assert names == ["test", "wheel", "runtime"], names  # the last stage is the default
    steps = dict(stages())
    assert 'CMD ["make", "test"]' in steps["test"]
    assert 'ENTRYPOINT ["qnccl", "run"]' in steps["runtime"]
    assert any("COPY --from=wheel /wheels" in s for s in steps["runtime"])
    assert any("pip install" in s and "qnccl-*.whl" in s for s in steps["runtime"])


def test_the_wheel_is_built_with_setups_cuda_pins():
    """The build stage's `pip wheel` builds in isolation, where the build backend asks for
    exactly the CUDA toolkit wheels setup.sh pins (one list), and for none with CUDA=0."""
    run = next(s for s in dict(stages())["wheel"] if "pip wheel" in s)
    assert "--no-build-isolation" not in run
    assert re.search(r'build-backend = "build_backend"\nbackend-path = \["scripts"\]',
                     (REPO / "pyproject.toml").read_text())
    pins = subprocess.run(["bash", "scripts/setup.sh", "--cuda-pins"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.split("==")[0] for p in pins) == [
        "nvidia-cuda-cccl-cu12", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvrtc-cu12",
        "nvidia-cuda-runtime-cu12"]
    assert all(re.fullmatch(r"[a-z0-9-]+==12\.\d+\.\d+", p) for p in pins), pins
    asked = subprocess.run(
        [sys.executable, "-c", "import build_backend; print(*build_backend.cuda_wheels())"],
        cwd=REPO / "scripts", capture_output=True, text=True, check=True).stdout.split()
    assert asked == pins
    asked = subprocess.run(
        [sys.executable, "-c", "import build_backend; print(*build_backend.cuda_wheels())"],
        cwd=REPO / "scripts", capture_output=True, text=True, check=True,
        env=dict(os.environ, CUDA="0")).stdout.split()
    assert asked == []
