"""Fake CUDA on a machine without a GPU: ``cuda`` tensors with shapes, dtypes and storages but no
data and no memory (``FakeTensorMode``), so the real engine runs as one rank of a large job on a
laptop (holmes.trainer.dryrun), with torch's CPU wheel or its CUDA build alike.

Three gaps are filled here, and only here, in the dry run's own process:

- torch's Python bindings of some tensor methods (indexing, ``copy_``, ``to``, ``float()``)
  take a device guard for the tensor's device before dispatching, and a CPU build has no
  guard for ``cuda``: "PyTorch is not linked with support for cuda devices", even for a fake
  tensor. The library :func:`load_before_torch` builds (once, cached) registers c10's own
  ``FakeGuardImpl`` for CUDA: a guard that only remembers a device index.
- the autograd engine asks the accelerator hooks for the current stream of a ``cuda``
  gradient; the same library registers CUDA hooks that say "built, available, 8 devices" and
  nothing else. torch creates its hooks object once, while it is imported: hence *before
  torch* (a process that already imported torch cannot host a dry run).
- ``torch.cuda``'s Python functions (events, streams, RNG state) need a driver. Inside
  :func:`fake_cuda` they are replaced by stand-ins; every call that would make the host wait
  for the device (``Event.synchronize``, ``Stream.synchronize``, ``torch.cuda.synchronize``)
  is reported to ``on_host_sync``.

A CUDA build of torch registers its own guard (``libc10_cuda``) and hooks (``libtorch_cuda``),
which ask the CUDA driver. So there the real guard library is loaded first and the fake one after
it (a registration's last store wins), and the fake hooks are registered at a higher priority
than torch's (whose registration at import is then skipped: c10 prints "Higher priority item
already registered, skipping registration of CUDAHooks"); they report no cuDNN, which a CUDA
build's attention kernel choice asks for.

Nothing here changes what the engine computes or which collectives it issues.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

LIBRARY_SOURCE = """
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
namespace holmes_fake {
struct CUDAHooks : at::CUDAHooksInterface {
  CUDAHooks(at::CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return 8; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex current_device() const override { return 0; }
  int getNumGPUs() const override { return 8; }
  long versionCuDNN() const override { return 0; }
  long versionRuntimeCuDNN() const override { return 0; }
};
}  // namespace holmes_fake
namespace at {
C10_REGISTER_CLASS_WITH_PRIORITY(
    CUDAHooksRegistry, CUDAHooks, c10::REGISTRY_PREFERRED, holmes_fake::CUDAHooks);
}
"""

_loaded = False


class FakeCudaError(RuntimeError):
    """The fake CUDA device cannot be set up here; the message says what to do."""


def cache_dir() -> Path:
    base = os.environ.get("HOLMES_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "holmes")
    return Path(base) / "fakecuda"


def _torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise FakeCudaError("torch is not installed: make venv, or pip install holmes-train-trainer")
    return Path(list(spec.submodule_search_locations)[0])


def _build(root: Path) -> Path:
    version = (root / "version.py").read_text() if (root / "version.py").exists() else ""
    # the rpath names this torch's lib/: a library built for another (since deleted) venv fails
    key = hashlib.sha256((version + str(root) + LIBRARY_SOURCE).encode()).hexdigest()[:16]
    lib = cache_dir() / f"fakecuda_{key}.so"
    if lib.exists():
        return lib
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise FakeCudaError(
            "the dry run needs a C++ compiler once, to build a 30-line fake CUDA device for the "
            "CPU torch wheel: install g++ (Debian: apt-get install g++) or set CXX"
        )
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "fakecuda.cpp", Path(tmp) / "fakecuda.so"
        src.write_text(LIBRARY_SOURCE)
        inc = root / "include"
        cmd = [
            cxx,
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            f"-I{inc}",
            f"-I{inc / 'torch/csrc/api/include'}",
        ]
        cmd += [
            str(src),
            "-o",
            str(out),
            f"-L{root / 'lib'}",
            "-lc10",
            "-ltorch_cpu",
            f"-Wl,-rpath,{root / 'lib'}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise FakeCudaError(f"building the fake CUDA library failed:\n{done.stderr[-2000:]}")
        os.replace(out, lib)  # atomic: concurrent dry runs never load half a file
    return lib


def load_before_torch() -> None:
    """Build (once) and load the fake CUDA library; must run before ``import torch``."""
    global _loaded
    if _loaded:
        return
    if "torch" in sys.modules:
        raise FakeCudaError(
            "torch was imported before the fake CUDA device was set up: run the dry run in a "
            "process of its own (python -m holmes.trainer.dryrun, or holmes dryrun)"
        )
    root = _torch_root()
    lib = _build(root)
    real_guard = root / "lib" / "libc10_cuda.so"
    if real_guard.exists():  # a CUDA build: its own guard loaded first, so the fake one (later) wins
        ctypes.CDLL(str(real_guard), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    _loaded = True


# ---- torch.cuda's Python side ----------------------------------------------------------------


class _Event:
    def __init__(self, sync: Callable[[str], None], **_: Any):
        self._sync = sync

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:  # the device waits, not the host
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self._sync("cuda.Event.synchronize")

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class _Stream:
    def __init__(self, sync: Callable[[str], None]):
        self._sync = sync

    def synchronize(self) -> None:
        self._sync("cuda.Stream.synchronize")

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event


@contextlib.contextmanager
def fake_cuda(on_host_sync: Callable[[str], None] = lambda where: None) -> Iterator[Any]:
    """FakeTensorMode with a working ``cuda`` device; ``on_host_sync(what)`` hears every call of
    torch.cuda that blocks the host (tensor-level syncs are the dispatch mode's to see)."""
    if not _loaded:
        raise FakeCudaError("call fakecuda.load_before_torch() before importing torch")
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    cuda = torch.cuda
    rng = torch.zeros(16, dtype=torch.uint8)  # made before the mode: a real tensor
    stand_ins: dict[str, Any] = {
        "Event": lambda *a, **k: _Event(on_host_sync),
        "current_stream": lambda device=None: _Stream(on_host_sync),
        "default_stream": lambda device=None: _Stream(on_host_sync),
        "synchronize": lambda device=None: on_host_sync("cuda.synchronize"),
        "get_rng_state": lambda device="cuda": rng.clone(),
        "set_rng_state": lambda state, device="cuda": None,
        "get_rng_state_all": lambda: [rng.clone()],
        "set_rng_state_all": lambda states: None,
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "device_count": lambda: 8,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "device": lambda device=None: contextlib.nullcontext(),
    }
    saved = {name: getattr(cuda, name) for name in stand_ins}
    for name, fn in stand_ins.items():
        setattr(cuda, name, fn)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            yield mode
    finally:
        for name, fn in saved.items():
            setattr(cuda, name, fn)


def python_location(skip: tuple[str, ...] = ("fakecuda.py", "recording.py", "contextlib.py")) -> str:
    """file:line of the innermost frame that is neither torch's internals nor this tooling:
    where in the engine (or in torch.distributed.pipelining) a host sync comes from."""
    frame: FrameType | None = sys._getframe(1)
    fallback = ""
    while frame is not None:
        path = frame.f_code.co_filename
        name = os.path.basename(path)
        interesting = "holmes" in path or "pipelining" in path
        if interesting and name not in skip:
            return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
        if not fallback and name not in skip and "torch" not in path:
            fallback = f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return fallback or "?"
