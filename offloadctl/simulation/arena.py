"""onnxruntime's BFC arena (``core/framework/bfc_arena.cc``), replayed: what its statistics say.

The arena serves every allocation from chunks of memory regions it asks the system for, and its
statistics (``AllocatorGetStats``: ``InUse``, ``MaxInUse``) count the *chunks* handed out, not the
bytes asked for:

- a request is rounded up to 256 bytes;
- the smallest free chunk that fits is taken (bins of power-of-two sizes, then by size and
  address); it is split only when it is at least twice the request or wastes at least
  ``max_dead_bytes_per_chunk`` (128 MiB): a freed 64 KiB chunk serves a 40 KiB request whole, and
  counts 64 KiB in use;
- a freed chunk merges with free neighbours;
- when no chunk fits, a new region is added: with ``kNextPowerOfTwo`` (the default) the region size
  starts at ``initial_chunk_size_bytes`` (1 MiB) and doubles as the arena grows, up to
  ``max_power_of_two_extend_bytes`` (1 GiB); with ``kSameAsRequested`` it is the request;
- ``Reserve`` (how initializers are placed) bypasses the chunks and counts its exact size.

Regions are laid out one after the other in address order (malloc's placement is not modelled;
it only breaks ties between equal free chunks).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["Arena", "ArenaConfig"]

_MIN = 256
_BINS = 21


@dataclass(frozen=True)
class ArenaConfig:
    """A BFC arena's settings (onnxruntime's defaults, as the CPU provider creates it)."""

    initial_chunk_size_bytes: int = 1 << 20
    max_dead_bytes_per_chunk: int = 128 << 20
    max_power_of_two_extend_bytes: int = 1 << 30
    extend_strategy: str = "kNextPowerOfTwo"  # or "kSameAsRequested"


def _rounded(n: int) -> int:
    return -(-n // _MIN) * _MIN


def _bin(size: int) -> int:
    return min(_BINS - 1, max(size, _MIN).bit_length() - 1 - 8)


@dataclass
class _Chunk:
    addr: int
    size: int
    used: bool = False
    prev: _Chunk | None = field(default=None, repr=False)
    next: _Chunk | None = field(default=None, repr=False)


class Arena:
    """The arena's state and statistics; `alloc` returns a handle that `free` takes back."""

    def __init__(self, config: ArenaConfig | None = None) -> None:
        self.config = config or ArenaConfig()
        self.in_use = 0
        self.max_in_use = 0
        self.allocations = 0
        self.extensions = 0
        self.reserved = 0
        self.region_bytes = 0
        self._next_region = _rounded(self.config.initial_chunk_size_bytes)
        self._end = 0  # address just past the last region
        self._bins: list[list[tuple[int, int, _Chunk]]] = [[] for _ in range(_BINS)]

    # ------------------------------------------------------------------ bins

    def _insert(self, c: _Chunk) -> None:
        bisect.insort(self._bins[_bin(c.size)], (c.size, c.addr, c))

    def _remove(self, c: _Chunk) -> None:
        b = self._bins[_bin(c.size)]
        i = bisect.bisect_left(b, (c.size, c.addr))
        assert b[i][2] is c
        del b[i]

    def _find(self, rounded: int) -> _Chunk | None:
        for b in range(_bin(rounded), _BINS):
            entries = self._bins[b]
            i = bisect.bisect_left(entries, (rounded, -1))
            if i < len(entries):
                c = entries[i][2]
                del entries[i]
                return c
        return None

    # ------------------------------------------------------------------ regions

    def _extend(self, rounded: int) -> None:
        cfg = self.config
        if cfg.extend_strategy == "kSameAsRequested":
            size = rounded
        else:
            grown = False
            while rounded > self._next_region:
                self._next_region *= 2
                grown = True
            size = self._next_region
            if not grown:
                if self._next_region * 2 < cfg.max_power_of_two_extend_bytes:
                    self._next_region *= 2
                else:
                    self._next_region = cfg.max_power_of_two_extend_bytes
        c = _Chunk(self._end, size)
        self._end += size
        self.region_bytes += size
        self.extensions += 1
        self._insert(c)

    # ------------------------------------------------------------------ the calls

    def alloc(self, nbytes: int) -> _Chunk | None:
        """Allocate ``nbytes`` (None for 0 bytes, which onnxruntime does not allocate)."""
        if nbytes <= 0:
            return None
        rounded = _rounded(nbytes)
        c = self._find(rounded)
        if c is None:
            self._extend(rounded)
            c = self._find(rounded)
            assert c is not None
        if c.size >= 2 * rounded or c.size - rounded >= self.config.max_dead_bytes_per_chunk:
            rest = _Chunk(c.addr + rounded, c.size - rounded, False, c, c.next)
            if c.next is not None:
                c.next.prev = rest
            c.next = rest
            c.size = rounded
            self._insert(rest)
        c.used = True
        self.in_use += c.size
        self.allocations += 1
        self.max_in_use = max(self.max_in_use, self.in_use)
        return c

    def free(self, c: _Chunk | None) -> None:
        if c is None:
            return
        assert c.used
        c.used = False
        self.in_use -= c.size
        nxt = c.next
        if nxt is not None and not nxt.used and nxt.addr == c.addr + c.size:
            self._remove(nxt)
            c.size += nxt.size
            c.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = c
        prv = c.prev
        if prv is not None and not prv.used and prv.addr + prv.size == c.addr:
            self._remove(prv)
            prv.size += c.size
            prv.next = c.next
            if c.next is not None:
                c.next.prev = prv
            c = prv
        self._insert(c)

    def reserve(self, nbytes: int) -> None:
        """``Reserve``: counted at its exact size, outside the chunks (never freed during a session)."""
        if nbytes > 0:
            self.reserved += nbytes
            self.in_use += nbytes
            self.allocations += 1
            self.max_in_use = max(self.max_in_use, self.in_use)
