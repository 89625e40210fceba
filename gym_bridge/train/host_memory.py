"""Hand the C allocator's freed memory back to the operating system between a step's phases.

On CPU, torch's tensors come from glibc's ``malloc``. Memory a phase frees stays mapped in the
process: in the heap of the thread that allocated it (generation runs in sampler threads, each with
its own malloc arena, so the training pass cannot reuse it) or in the middle of the main heap, where
``free`` cannot shrink it. The resident size then grows to generation's peak *plus* training's peak.
``malloc_trim(0)`` returns every free page of every arena; called when one phase ends and the next
begins it keeps the peak at the larger phase's. Measured on the SmolLM2-135M LoRA recipe: see
:func:`gym_bridge.train.update.optimizer_steps`. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

__all__ = ["release_freed_memory"]


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


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the OS (glibc's ``malloc_trim(0)``); whether it could."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
