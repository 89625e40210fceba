"""Hand the C allocator's freed memory back to the operating system between a step's phases.

On CPU, torch's tensors come from glibc's ``malloc``. Memory a phase frees stays mapped in the
process: in the heap of the thread that allocated it (generation runs in sampler threads, each with
its own malloc arena, so the training pass cannot reuse it) or in the middle of the main heap, where
``free`` cannot shrink it. The resident size then grows to generation's peak *plus* training's peak.
``malloc_trim(0)`` returns every free page of every arena; called when one phase ends and the next
begins it keeps the peak at the larger phase's. Measured on the SmolLM2-135M LoRA recipe: see
:func:`gym_bridge.train.learner.update.optimizer_steps`. Elsewhere than glibc this does nothing.

Returned pages cost a page fault each when the next phase allocates again: on the tiny model's update
(tens of MiB of activations) three trims took a fifth of the step. So a caller may pass ``min_gain``:
the trim is skipped when the resident size grew less than that since the last trim, an upper bound
on what it could give back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

__all__ = ["release_freed_memory", "resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_resident_after_trim = 0


@functools.cache
def _glibc() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others have no malloc_trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def resident_bytes() -> int:
    """This process's resident set size (Linux's ``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def release_freed_memory(min_gain: int = 0) -> bool:
    """Return the allocator's free pages to the OS (glibc's ``malloc_trim(0)``); whether it did.

    With ``min_gain`` (bytes) it does so only when the resident size grew by at least that much since
    the last trim: less is not worth the page faults of allocating it again.
    """
    global _resident_after_trim
    libc = _glibc()
    if libc is None:
        return False
    if min_gain > 0 and resident_bytes() - _resident_after_trim < min_gain:
        return False
    libc.malloc_trim(0)
    _resident_after_trim = resident_bytes()
    return True
