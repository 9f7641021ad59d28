"""The repaired wheel installs into a fresh virtual environment and runs there.

scripts/build-wheel builds the wheel from the checkout's build folder and repairs it with
auditwheel (and vendors zlib); the test checks what the repaired extension links
(nothing outside glibc, libstdc++ and pyarrow's libraries, plus what the wheel carries), installs it into a
new venv (pip resolves pyarrow, numpy and pyyaml from the wheel's requirements), and runs
``braid demo`` there (before torch is installed: the core needs none) and, with torch, a
``braid.Loader`` loop, outside the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    not (VENV_BIN / "auditwheel").exists() or not (ROOT / "build" / "py").is_dir(),
    reason="needs auditwheel and the checkout's build folder (scripts/setup)")

# What the repaired extension may take from the system: glibc, libstdc++ and libgcc_s
# (zlib, which auditwheel's policy would allow too, is vendored), and pyarrow's libraries.
ALLOWED = re.compile(r"^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|librt|libpthread|"
                     r"libgcc_s|libstdc\+\+|libarrow\w*|libparquet)\.so")


def run(cmd, **kw):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=900, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run([ROOT / "scripts" / "build-wheel", out],
        env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"})
    wheels = sorted(out.glob("braid-*manylinux*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    return wheels[0]


def test_repaired_wheel_carries_its_libraries_and_pins_pyarrow_to_the_minor(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    vendored = [n for n in names if n.startswith("braid.libs/")]
    for lib in ("libyaml-cpp", "libsentencepiece", "libturbojpeg", "libspng", "libwebp",
                "libarchive", "libisal", "libz-"):
        assert any(Path(n).name.startswith(lib) for n in vendored), (lib, vendored)
    assert not any("arrow" in n or "parquet" in n for n in vendored)
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist")
                and "extra ==" not in line]
    assert any(re.search(r"pyarrow.*>=26\.0.*<26\.1|pyarrow.*<26\.1.*>=26\.0", r)
               for r in requires), requires
    assert not any("torch" in r for r in requires), requires  # `import braid` needs no torch


def test_fresh_venv_runs_braid_demo_and_a_loader(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    run([py, "-m", "pip", "install", "-q", wheel])  # pyarrow, numpy, pyyaml: no torch
    site = run([py, "-c", "import braid, os; print(os.path.dirname(braid.__file__))"],
               cwd=tmp_path).stdout.strip()
    assert site.startswith(str(venv)), site  # the installed wheel, not the checkout
    core = next(Path(site).glob("_core*.so"))
    ldd = run(["ldd", core]).stdout
    outside = []
    for line in ldd.splitlines():
        name = os.path.basename(line.strip().split()[0])
        target = line.split("=>")[1].strip() if "=>" in line else ""
        if "braid.libs" in target or ALLOWED.match(name):
            continue
        outside.append(line.strip())
    assert not outside, ldd
    assert "not found" not in ldd, ldd

    demo = run([venv / "bin" / "braid", "demo", "--dir", tmp_path / "demo", "--steps", "5"],
               cwd=tmp_path)
    assert "imbalance" in demo.stdout + demo.stderr
    assert run([py, "-c", "import importlib.util as u; print(u.find_spec('torch'))"]
               ).stdout.strip() == "None"  # braid and its command ran without torch
    run([py, "-m", "pip", "install", "-q", "torch==2.13.0"])  # braid.Loader's tensors
    config = next((tmp_path / "demo").rglob("*.yaml"))
    loop = run([py, "-c", (
        "import itertools, sys, braid\n"
        f"loader = braid.Loader({str(config)!r}, rank=0, world_size=None)\n"
        "n = sum(int(b['input_ids'].numel()) for b in itertools.islice(iter(loader), 6))\n"
        "print('tokens', n)\n")], cwd=tmp_path)
    assert int(loop.stdout.split()[-1]) > 0
