"""Streamed weights handed to onnxruntime from page-locked host memory (`run --device cuda|ascend`).

A copy overlaps compute only from page-locked host memory: from pageable memory CUDA synchronises
the stream before it copies, and CANN returns only when the copy is done. onnxruntime allocates what
a MemcpyToHost writes page-locked already (``cudaMallocHost``, ``aclrtMallocHost``), but a weight the
rewrite streams in is an initializer, which onnxruntime reads into pageable memory. Handed to the
session with ``SessionOptions.add_initializer(name, OrtValue)`` over a buffer of the caller's, it is
used where it is (zero-copy: a change to the buffer after the session is made changes the result), so
a buffer allocated page-locked stays page-locked.

`hand_over` allocates one page-locked buffer per streamed weight with the device runtime's host
allocator (`HostAllocator`: ``cudaHostAlloc`` from ``libcudart``, ``aclrtMallocHost`` from
``libascendcl``), copies the weight in and adds it to the session options; the buffers live as long
as the `PageLocked` record that owns them. Where the runtime is missing or refuses, nothing is handed
over and the record says why, in one line. Other hosts do the same with their own runtime call and
``AddInitializer`` (docs/streams.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import onnx
from onnx import numpy_helper

from offloadctl.core.onnxutil import copy_kind

__all__ = ["HostAllocator", "PageLocked", "hand_over", "runtime_allocator", "streamed_weights"]


def streamed_weights(proto: onnx.ModelProto) -> list[str]:
    """The initializers of a rewrite that only host-to-device copies read: the weights it streams in."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return [
        init.name
        for init in proto.graph.initializer
        if readers.get(init.name) and all(copy_kind(n) == "h2d" for n in readers[init.name])
    ]


@dataclass
class HostAllocator:
    """A device runtime's page-locked host allocator: ``alloc(nbytes)`` gives an address (raising
    OSError with the runtime's error), ``free(address)`` gives it back."""

    name: str  # what the report names: the library and its call
    alloc: Callable[[int], int]
    free: Callable[[int], None]


#: device -> (the runtime's library names, its alloc and free calls, whether alloc takes flags)
_RUNTIMES: dict[str, tuple[tuple[str, ...], str, str, bool]] = {
    "cuda": (
        ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"),
        "cudaHostAlloc",
        "cudaFreeHost",
        True,
    ),  # fmt: skip
    "ascend": (("libascendcl.so",), "aclrtMallocHost", "aclrtFreeHost", False),
}


#: (device, status) -> what the runtime's error code means
_ERRORS = {
    ("cuda", 35): "no CUDA driver, or one older than the runtime",
    ("cuda", 100): "no CUDA device",
    ("cuda", 2): "out of memory",
}


def _library(names: Iterable[str], device: str) -> tuple[Any, str] | None:
    """The first of ``names`` the loader finds; for CUDA also in the nvidia pip packages' folders and
    wherever the loader's search finds ``cudart``."""
    candidates = list(names)
    if device == "cuda":
        for site in sys.path:
            candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
        found = ctypes.util.find_library("cudart")
        if found:
            candidates.append(found)
    for name in candidates:
        try:
            return ctypes.CDLL(name), os.path.basename(name)
        except OSError:
            continue
    return None


def runtime_allocator(device: str) -> HostAllocator | str:
    """The page-locked host allocator of ``device``'s runtime, or why there is none (one line)."""
    names, alloc_name, free_name, flags = _RUNTIMES[device]
    found = _library(names, device)
    if found is None:
        what = "the CUDA runtime (libcudart)" if device == "cuda" else "the CANN runtime (libascendcl.so)"
        return f"{what} is not installed here"
    lib, label = found
    alloc_fn, free_fn = getattr(lib, alloc_name), getattr(lib, free_name)
    alloc_fn.restype = free_fn.restype = ctypes.c_int

    def alloc(nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        args = (ctypes.byref(ptr), ctypes.c_size_t(nbytes), *((ctypes.c_uint(0),) if flags else ()))
        status = alloc_fn(*args)
        if status != 0 or not ptr.value:
            meaning = _ERRORS.get((device, status))
            raise OSError(f"{alloc_name} failed with error {status}" + (f" ({meaning})" if meaning else ""))
        return int(ptr.value)

    def free(address: int) -> None:
        free_fn(ctypes.c_void_p(address))

    return HostAllocator(f"{alloc_name} ({label})", alloc, free)


class PinnedDoc(TypedDict):
    """The page-locked hand-over of streamed weights in a ``--json`` document."""

    weights: int
    bytes: int
    allocator: str | None
    refused: str | None


@dataclass
class PageLocked:
    """What `hand_over` did: the weights handed over from page-locked buffers (which it owns until
    `close`), or why none were (``refused``)."""

    weights: int = 0
    nbytes: int = 0
    allocator: str | None = None
    refused: str | None = None
    _buffers: list[tuple[int, Any]] = field(default_factory=list, repr=False)
    _free: Callable[[int], None] | None = field(default=None, repr=False)

    def close(self) -> None:
        """Give the buffers back (after the session that reads them is gone)."""
        free, buffers = self._free, self._buffers
        self._buffers = []
        for address, _ in buffers:
            if free is not None:
                free(address)

    def to_json(self) -> PinnedDoc:
        return {"weights": self.weights, "bytes": self.nbytes, "allocator": self.allocator, "refused": self.refused}

    def text(self) -> str:
        if self.refused is not None:
            return self.refused
        return f"{self.weights} streamed weight(s) handed to onnxruntime from page-locked memory ({self.allocator})"


def hand_over(
    proto: onnx.ModelProto,
    sess_options: Any,
    allocator: HostAllocator | str,
    *,
    ort: Any,
    base_dir: str | os.PathLike[str] = "",
) -> PageLocked:
    """Add each weight ``proto`` streams in (`streamed_weights`) to ``sess_options`` from a page-locked
    buffer of ``allocator`` (`runtime_allocator`; a string: why there is none). Nothing is added
    when the allocator is missing or the first allocation fails: the record says why."""
    names = streamed_weights(proto)
    if not names:
        return PageLocked()
    if isinstance(allocator, str):
        return PageLocked(refused=_refusal(len(names), allocator))
    done = PageLocked(allocator=allocator.name, _free=allocator.free)
    inits = {init.name: init for init in proto.graph.initializer}
    handed: list[tuple[str, Any]] = []
    for name in names:
        array = numpy_helper.to_array(inits[name], base_dir=str(base_dir))
        if array.dtype.kind not in _PLAIN_KINDS:  # bfloat16, float8, ...: onnxruntime reads these itself
            continue
        try:
            address = allocator.alloc(max(array.nbytes, 1))
        except OSError as exc:
            done.close()
            return PageLocked(refused=_refusal(len(names), f"{allocator.name}: {exc}"))
        raw = (ctypes.c_uint8 * max(array.nbytes, 1)).from_address(address)
        locked = np.frombuffer(memoryview(raw), dtype=array.dtype, count=array.size).reshape(array.shape)
        locked[...] = array
        value = ort.OrtValue.ortvalue_from_numpy(locked)
        done._buffers.append((address, (raw, locked, value)))
        handed.append((name, value))
        done.weights += 1
        done.nbytes += array.nbytes
    for name, value in handed:
        sess_options.add_initializer(name, value)
    return done


#: numpy kinds OrtValue.ortvalue_from_numpy takes as they are
_PLAIN_KINDS = frozenset("biuf?")


def _refusal(count: int, why: str) -> str:
    return (
        f"could not page-lock the {count} streamed weight(s): {why}; onnxruntime reads them into pageable "
        "memory, so their copies do not overlap compute"
    )
