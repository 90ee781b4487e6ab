"""Assemble vLLM's Mamba2 SSD prefill ops from the vLLM wheel into an ignored folder, for machines without vLLM.

    python scripts/assemble_vllm_ops.py [--wheel PATH] [--out DIR] [--version 0.33.0]

Without ``--wheel`` the wheel is fetched with ``pip download --no-deps --only-binary=:all: vllm==VERSION`` into a
temporary directory (a GPU runner without network takes ``--wheel`` or, better, the assembled folder itself: it is
a few hundred KiB). From the wheel only the modules that ``mamba_chunk_scan_combined_varlen`` (ssd_combined.py) and
``gather_initial_states`` need are extracted, found by following their imports; each is checked against the
wheel's RECORD hash and written unchanged. The rest of vLLM those modules import (``vllm.triton_utils``,
``vllm.platforms``, the logger, ...) is replaced by the small stand-in modules below: our code, written here.
Any vLLM import that is neither extracted, stood in nor listed as deliberately not followed stops the script with
the file and the import, so a different vLLM version cannot assemble into something silently incomplete.

The result, default ``.peers/vllm-VERSION/`` in the repository (ignored by git), is a directory to put on
``sys.path`` (``peers/vllm_ssd.py`` does that; ``SSD_HARNESS_VLLM_OPS`` names another one); with only torch and
triton installed, ``from vllm.model_executor.layers.mamba.ops.ssd_combined import
mamba_chunk_scan_combined_varlen`` works there. It also holds vLLM's LICENSE and ``ASSEMBLED.json`` (version,
wheel hash, each file's origin). Standard library and pip only; the import check at the end uses torch and triton
when this Python has them.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VERSION = "0.33.0"
OPS = "vllm.model_executor.layers.mamba.ops"
ENTRY_MODULES = (f"{OPS}.ssd_combined", f"{OPS}.gather_initial_states")
ENTRY_FUNCTIONS = {f"{OPS}.ssd_combined": "mamba_chunk_scan_combined_varlen",
                   f"{OPS}.gather_initial_states": "gather_initial_states"}

# Imports in the extracted modules that are deliberately not followed, with why. Each sits under a platform test
# that the stand-in ``current_platform`` answers False (it describes a CUDA, or interpreted, Triton platform).
NOT_FOLLOWED = {
    f"{OPS}.cpu.mamba_ssm": "the pure-PyTorch CPU implementation, imported only when current_platform.is_cpu()",
    "vllm._xpu_ops": "Intel XPU kernels, imported only when current_platform.is_xpu()",
}

# Package markers above the ops package: vLLM's own __init__ files import much of vLLM (model_executor's imports
# its parameter classes), which the SSD ops do not need.
PACKAGE_MARKER = '"""Stand-in package marker (ssd-harness): the real vLLM package is not installed here."""\n'

STANDINS = {
    "vllm": PACKAGE_MARKER,
    "vllm.model_executor": PACKAGE_MARKER,
    "vllm.model_executor.layers": PACKAGE_MARKER,
    "vllm.model_executor.layers.mamba": PACKAGE_MARKER,
    "vllm.utils": PACKAGE_MARKER,
    "vllm.v1": PACKAGE_MARKER,
    "vllm.v1.attention": PACKAGE_MARKER,
    "vllm.v1.attention.backends": PACKAGE_MARKER,
    "vllm.triton_utils": '''
        """Stand-in (ssd-harness) for vllm.triton_utils: the installed triton itself (vLLM's module re-exports it, or
        placeholders when triton is missing, which cannot run these ops anyway)."""
        import triton
        import triton.language as tl

        HAS_TRITON = True
        __all__ = ["HAS_TRITON", "triton", "tl"]
    ''',
    "vllm.platforms": '''
        """Stand-in (ssd-harness) for vllm.platforms: ``current_platform`` answers the questions the SSD ops ask,
        from torch. It describes a Triton GPU platform, so the Triton kernels run (under TRITON_INTERPRET=1 on CPU
        tensors): is_cpu() is False, unlike vLLM's CPU platform, which swaps in a pure-PyTorch implementation."""
        import torch


        class _TritonGpuPlatform:
            @staticmethod
            def is_cpu():
                return False

            @staticmethod
            def is_xpu():
                return False

            @staticmethod
            def is_rocm():
                return torch.version.hip is not None and torch.cuda.is_available()

            @staticmethod
            def is_cuda():
                return torch.version.cuda is not None and torch.cuda.is_available()

            @staticmethod
            def get_device_capability(device_id=0):
                if not torch.cuda.is_available():
                    return None
                return torch.cuda.get_device_capability(device_id)

            @classmethod
            def is_device_capability(cls, capability, device_id=0):
                """Exactly this capability: a (major, minor) tuple or major * 10 + minor, as vLLM spells it."""
                current = cls.get_device_capability(device_id)
                if current is None:
                    return False
                if isinstance(capability, tuple):
                    return tuple(current) == capability
                return current[0] * 10 + current[1] == capability

            @staticmethod
            def is_arch_support_pdl():
                """Programmatic dependent launch: CUDA devices of compute capability 9.0 and above."""
                if not (torch.version.cuda is not None and torch.cuda.is_available()):
                    return False
                return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9

            @staticmethod
            def get_device_name(device_id=0):
                return torch.cuda.get_device_name(device_id)


        current_platform = _TritonGpuPlatform()
    ''',
    "vllm.logger": '''
        """Stand-in (ssd-harness) for vllm.logger: standard logging, with vLLM's *_once helpers."""
        import logging


        class _Logger(logging.LoggerAdapter):
            _seen = set()

            def process(self, msg, kwargs):
                kwargs.pop("scope", None)
                return msg, kwargs

            def _once(self, level, msg, *args, **kwargs):
                key = (level, msg, args)
                if key not in self._seen:
                    self._seen.add(key)
                    self.log(level, msg, *args, **kwargs)

            def debug_once(self, msg, *args, **kwargs):
                self._once(logging.DEBUG, msg, *args, **kwargs)

            def info_once(self, msg, *args, **kwargs):
                self._once(logging.INFO, msg, *args, **kwargs)

            def warning_once(self, msg, *args, **kwargs):
                self._once(logging.WARNING, msg, *args, **kwargs)


        def init_logger(name):
            return _Logger(logging.getLogger(name), {})
    ''',
    "vllm.envs": '''
        """Stand-in (ssd-harness) for vllm.envs: vLLM's environment settings are not part of the SSD prefill path;
        reading one names it instead of guessing its default."""


        def __getattr__(name):
            raise AttributeError(f"vllm.envs.{name}: not available in the assembled SSD ops (stand-in vllm.envs); "
                                 "it belongs to a vLLM feature outside the SSD prefill path")
    ''',
    "vllm._custom_ops": '''
        """Stand-in (ssd-harness) for vllm._custom_ops: vLLM's compiled extension is not assembled (the SSD prefill
        ops are pure Triton); using one of its ops names it."""


        def __getattr__(name):
            raise AttributeError(f"vllm._custom_ops.{name}: vLLM's compiled ops are not part of the assembled SSD "
                                 "ops (stand-in vllm._custom_ops)")
    ''',
    "vllm.utils.platform_utils": '''
        """Stand-in (ssd-harness) for vllm.utils.platform_utils."""
        import re

        from vllm.platforms import current_platform


        def get_device_name_as_file_name(device_id=0):
            return re.sub(r"[\\s/]+", "_", current_platform.get_device_name(device_id))
    ''',
    "vllm.v1.attention.backends.utils": '''
        """Stand-in (ssd-harness) for vllm.v1.attention.backends.utils: the block id vLLM reserves as the null
        block (a default argument of the decode kernels next to the SSD ops)."""
        NULL_BLOCK_ID = 0
    ''',
}


def module_path(module: str, package: bool) -> str:
    parts = module.split(".")
    return "/".join(parts) + ("/__init__.py" if package else ".py")


class Wheel:
    """The wheel's files by path, with RECORD's hashes."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.names = set(self.zip.namelist())
        record = next((n for n in self.names if n.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise SystemExit(f"{path}: no .dist-info/RECORD in the wheel; is it a vLLM wheel?")
        self.record = record
        self.hashes = {}
        for line in self.zip.read(record).decode().splitlines():
            name, digest, _size = line.rsplit(",", 2)
            if digest:
                self.hashes[name] = digest

    def module_file(self, module: str) -> str | None:
        """The wheel path of ``module`` (a module file or a package __init__), or None."""
        for package in (False, True):
            path = module_path(module, package)
            if path in self.names:
                return path
        return None

    def read_verified(self, name: str) -> bytes:
        data = self.zip.read(name)
        algo, _, expected = self.hashes.get(name, "=").partition("=")
        if not expected:
            raise SystemExit(f"{self.path}: {name} has no hash in {self.record}")
        got = base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode()
        if got != expected:
            raise SystemExit(f"{self.path}: {name} does not match its {algo} in {self.record}; the wheel is damaged")
        return data

    def license(self) -> tuple[str, bytes] | None:
        for name in sorted(self.names):
            if ".dist-info/" in name and Path(name).name.upper().startswith("LICENSE"):
                return name, self.read_verified(name)
        return None


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import anywhere in ``source`` (module level, under
    a condition, or inside a function), relative imports resolved against ``module``."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return found


def defined_names(source: str) -> set[str]:
    """Top-level names a module defines (functions, classes, assignments, imports) plus ``*`` if it has a module
    ``__getattr__`` (every name resolves)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if "__getattr__" in names:
        names.add("*")
    return names


def standin_source(module: str) -> str:
    return textwrap.dedent(STANDINS[module]).lstrip("\n")


def resolve(wheel: Wheel, importer: str, base: str, names: list[str], line: int) -> list[str]:
    """The vLLM modules one import statement needs: ``from pkg import sub`` needs ``pkg.sub`` when that is a module
    (extracted or stood in), else ``pkg`` with ``sub`` as an attribute (checked for stand-ins)."""
    needed = []
    attrs = []
    for name in names or [None]:
        sub = f"{base}.{name}" if name else None
        if sub and (sub in STANDINS or sub in NOT_FOLLOWED or (sub.startswith(OPS) and wheel.module_file(sub))):
            needed.append(sub)
        elif name:
            attrs.append(name)
    if attrs or not names:
        needed.append(base)
        if base in STANDINS and attrs:
            missing = [a for a in attrs if not ({a, "*"} & defined_names(standin_source(base)))]
            if missing:
                raise SystemExit(f"{importer} line {line}: imports {missing} from {base}, which its stand-in does "
                                 f"not define; extend STANDINS[{base!r}] in {Path(__file__).name}")
    return needed


def closure(wheel: Wheel) -> tuple[dict[str, str], set[str], dict[str, str]]:
    """(module -> wheel path to extract, stand-ins used, not-followed imports met -> reason)."""
    extract: dict[str, str] = {}
    standins: set[str] = set()
    skipped: dict[str, str] = {}
    todo = list(ENTRY_MODULES)
    while todo:
        module = todo.pop()
        if module in extract:
            continue
        path = wheel.module_file(module)
        if path is None:
            raise SystemExit(f"{wheel.path}: no {module_path(module, False)} in the wheel; is this vLLM "
                             f"{DEFAULT_VERSION}'s layout?")
        extract[module] = path
        source = wheel.read_verified(path).decode()
        for base, names, line in imports_of(source, module, path.endswith("__init__.py")):
            if base != "vllm" and not base.startswith("vllm."):
                continue
            for needed in resolve(wheel, path, base, names, line):
                if needed in NOT_FOLLOWED:
                    skipped[needed] = NOT_FOLLOWED[needed]
                elif needed in STANDINS:
                    standins.add(needed)
                elif needed.startswith(OPS) and wheel.module_file(needed):
                    todo.append(needed)
                else:
                    raise SystemExit(
                        f"{path} line {line}: imports {needed}, which is neither one of the ops extracted from the "
                        f"wheel nor a stand-in; add a stand-in (STANDINS) or a reason (NOT_FOLLOWED) in "
                        f"{Path(__file__).name}")
    # Every package above an extracted or stood-in module must exist: the ops package's own __init__ comes from the
    # wheel, the ones above it are stand-in markers.
    for module in list(extract) + sorted(standins):
        parent = module.rpartition(".")[0]
        while parent:
            if parent not in extract and parent not in standins:
                if parent.startswith(OPS):
                    extract[parent] = wheel.module_file(parent) or ""
                    if not extract[parent]:
                        raise SystemExit(f"{wheel.path}: package {parent} has no __init__.py in the wheel")
                elif parent in STANDINS:
                    standins.add(parent)
                else:
                    raise SystemExit(f"package {parent} is neither in the wheel's ops nor a stand-in marker")
            parent = parent.rpartition(".")[0]
    return extract, standins, skipped


def download(version: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"vllm=={version}",
           "-d", str(into)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    wheels = sorted(into.glob(f"vllm-{version}-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"pip download left {[w.name for w in wheels]} in {into}; expected one vllm-{version} wheel")
    return wheels[0]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(wheel_path: Path, out: Path, version: str) -> list[tuple[str, str, int]]:
    """Write the folder (through a sibling temporary directory, swapped in at the end). Returns (path, origin,
    bytes) for every file written."""
    wheel = Wheel(wheel_path)
    wheel_version = Path(wheel_path).name.split("-")[1]
    if wheel_version != version:
        raise SystemExit(f"{wheel_path}: a vllm {wheel_version} wheel; expected {version} (--version)")
    extract, standins, skipped = closure(wheel)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    written: list[tuple[str, str, int]] = []
    try:
        for _module, path in sorted(extract.items()):
            data = wheel.read_verified(path)
            (staging / path).parent.mkdir(parents=True, exist_ok=True)
            (staging / path).write_bytes(data)
            written.append((path, f"vllm {version} wheel", len(data)))
        for module in sorted(standins):
            path = module_path(module, any(m.startswith(module + ".") for m in list(extract) + list(standins)))
            data = standin_source(module).encode()
            (staging / path).parent.mkdir(parents=True, exist_ok=True)
            (staging / path).write_bytes(data)
            written.append((path, "stand-in (ssd-harness)", len(data)))
        license_file = wheel.license()
        if license_file is not None:
            (staging / "LICENSE").write_bytes(license_file[1])
            written.append(("LICENSE", f"vllm {version} wheel ({license_file[0]})", len(license_file[1])))
        manifest = {
            "vllm_version": version,
            "wheel": Path(wheel_path).name,
            "wheel_sha256": sha256_file(Path(wheel_path)),
            "entry_points": ENTRY_FUNCTIONS,
            "files": {path: origin for path, origin, _ in written},
            "not_followed": skipped,
        }
        data = (json.dumps(manifest, indent=2) + "\n").encode()
        (staging / "ASSEMBLED.json").write_bytes(data)
        written.append(("ASSEMBLED.json", "manifest (ssd-harness)", len(data)))
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written


def import_check(out: Path) -> str:
    """Import both entry points from ``out`` alone in a fresh interpreter (TRITON_INTERPRET=1 where torch sees no
    GPU). Returns what happened; raises SystemExit when the import fails."""
    probe = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(out)!r})
        try:
            import torch
            import triton  # noqa: F401
        except ImportError as exc:
            print(f"not run: {{exc}}")
            raise SystemExit(0)
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        import vllm
        assert os.path.dirname(os.path.dirname(vllm.__file__)) == {str(out)!r}, vllm.__file__
        from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen  # noqa: F401
        from vllm.model_executor.layers.mamba.ops.gather_initial_states import gather_initial_states  # noqa: F401
        print("ok: both entry points import with torch " + torch.__version__ + ", triton " + triton.__version__)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=out)
    if done.returncode != 0:
        raise SystemExit(f"import check of {out} failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, help="an already downloaded vllm wheel (default: pip download it)")
    parser.add_argument("--version", default=DEFAULT_VERSION, help=f"vLLM version (default {DEFAULT_VERSION})")
    parser.add_argument("--out", type=Path, help="folder to write (default: .peers/vllm-VERSION in the repository)")
    args = parser.parse_args(argv)
    out = (args.out or REPO / ".peers" / f"vllm-{args.version}").resolve()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
        if args.wheel is not None:
            if not args.wheel.is_file():
                raise SystemExit(f"--wheel {args.wheel}: no such file")
            wheel = args.wheel
        else:
            wheel = download(args.version, Path(tmp))
        fetched = time.perf_counter()
        written = assemble(wheel, out, args.version)
    assembled = time.perf_counter()
    width = max(len(p) for p, _, _ in written)
    print(f"wrote {out}:")
    for path, origin, size in written:
        print(f"  {path:<{width}}  {size:>7} B  {origin}")
    total = sum(size for _, _, size in written)
    print(f"{len(written)} files, {total / 1024:.1f} KiB; wheel {'given' if args.wheel else 'downloaded'} in "
          f"{fetched - start:.1f} s, extracted in {assembled - fetched:.1f} s")
    print(f"import check: {import_check(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
