"""De-quantised GGUF models kept as plain transformers directories, so only the first load pays.

Why: transformers de-quantises a GGUF file tensor by tensor on every load (SmolLM2-135M: about 30 s on
a quiet 2-core machine, minutes on a loaded one), and the de-quantised copy sits beside the model
while it is built (the trainer's peak memory was that load, 2.4 GiB, not training). The first load
saves model and tokenizer as safetensors under ``<cache root>/models/gguf/<file stem>-<content key>``;
later loads read that directory. The key hashes the GGUF file's bytes and the transformers version,
so a changed file or a new de-quantiser never reads a stale copy. The directory is written under a
temporary name and renamed into place, so a crash or two concurrent first loads never leave half a
model; a cache that cannot be written (read-only home) only costs the re-load.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["cached_dequantised", "gguf_cache_dir", "save_dequantised"]

MARKER = "gym_bridge_dequantised.json"
"""Written last into a complete cache directory: the GGUF file it came from and its key."""


def _content_key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    return _hashed_key(str(gguf_path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _hashed_key(path: str, size: int, mtime_ns: int) -> str:
    """The file's bytes hashed once per (path, size, modification time): a load looks the key up twice."""
    import transformers

    digest = hashlib.blake2b(digest_size=10)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    digest.update(f"transformers {transformers.__version__}".encode())
    return digest.hexdigest()


def gguf_cache_dir(gguf_path: Path, cache_root: Path | None = None) -> Path:
    """Where the de-quantised copy of ``gguf_path`` lives (whether or not it exists yet)."""
    from gym_bridge.models.tiny import default_cache_root

    root = cache_root if cache_root is not None else default_cache_root()
    return root / "models" / "gguf" / f"{gguf_path.stem}-{_content_key(gguf_path)}"


def cached_dequantised(gguf_path: Path, cache_root: Path | None = None) -> Path | None:
    """The complete de-quantised directory of ``gguf_path``, or None before the first load."""
    directory = gguf_cache_dir(gguf_path, cache_root)
    return directory if (directory / MARKER).is_file() else None


def save_dequantised(
    model: Any, tokenizer: Any, gguf_path: Path, cache_root: Path | None = None
) -> Path | None:
    """Save a just de-quantised ``model`` and its ``tokenizer`` for the next load; the directory, or
    None when the cache cannot be written (reported, not raised: the model in memory is fine)."""
    final = gguf_cache_dir(gguf_path, cache_root)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as err:
        print(
            f"note: could not cache the de-quantised model under {final.parent} ({err}); the next load de-quantises again"
        )
        return None
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"gguf_file": str(gguf_path), "key": final.name}) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(tmp, final)
        except OSError:
            if (final / MARKER).is_file():  # another process cached it first: theirs is the same
                return final
            raise
        return final
    except OSError as err:
        print(
            f"note: could not cache the de-quantised model in {final} ({err}); the next load de-quantises again"
        )
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
