"""GPU utilisation and memory in each step's metrics (``logger.monitor_gpus``), read through NVML.

NVML (the library behind ``nvidia-smi``, Python bindings in the ``nvidia-ml-py`` package, imported as
``pynvml``) is polled from a daemon thread every ``interval_s``: a snapshot taken when the step's
metrics are written would find the GPU idle between phases. Each :meth:`GpuMonitor.read` returns,
per device ``i`` and over the polls since the previous read:

- ``gpu<i>/utilization_pct``: mean percent of time a kernel ran (NVML's ``gpu`` utilisation rate);
- ``gpu<i>/memory_used_mb``: peak memory in use, and ``gpu<i>/memory_total_mb``.

On a machine without an NVIDIA driver (or without the package) :func:`open_gpu_monitor` raises
:class:`~gym_bridge.train.config.ConfigError` naming the key, so a run is refused at start-up instead
of logging nothing.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["GpuMonitor", "open_gpu_monitor"]

INSTALL_HINT = "pip install 'gym-bridge[gpu]' (the nvidia-ml-py package)"


class GpuMonitor:
    """Polls every NVML device; ``read`` gives the means and peaks since the previous read."""

    def __init__(self, nvml: Any, *, interval_s: float = 0.5, start: bool = True) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                raise RuntimeError("NVML sees no GPU")
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except BaseException:
            nvml.nvmlShutdown()
            raise
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._samples: list[list[tuple[float, float, float]]] = [[] for _ in self._handles]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def poll(self) -> None:
        """Take one sample of every device (the thread calls this every ``interval_s``)."""
        taken = []
        for handle in self._handles:
            utilization = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            taken.append((float(utilization.gpu), memory.used / 2**20, memory.total / 2**20))
        with self._lock:
            for samples, sample in zip(self._samples, taken, strict=True):
                samples.append(sample)

    def read(self) -> dict[str, float]:
        """Per-device mean utilisation and peak memory since the previous read (a fresh poll if none)."""
        with self._lock:
            empty = not any(self._samples)
        if empty:
            self.poll()
        with self._lock:
            samples, self._samples = self._samples, [[] for _ in self._handles]
        out: dict[str, float] = {}
        for i, device in enumerate(samples):
            out[f"gpu{i}/utilization_pct"] = sum(s[0] for s in device) / len(device)
            out[f"gpu{i}/memory_used_mb"] = max(s[1] for s in device)
            out[f"gpu{i}/memory_total_mb"] = device[-1][2]
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # a transient NVML error costs one sample, not the run
                continue

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.nvml.nvmlShutdown()


def open_gpu_monitor(interval_s: float = 0.5) -> GpuMonitor:
    """A started :class:`GpuMonitor`, or a ConfigError naming ``logger.monitor_gpus`` saying why not."""
    from gym_bridge.train.config import ConfigError

    try:
        import pynvml
    except ImportError:
        raise ConfigError([f"logger.monitor_gpus needs NVML's Python bindings: {INSTALL_HINT}"]) from None
    try:
        return GpuMonitor(pynvml, interval_s=interval_s)
    except Exception as err:
        raise ConfigError(
            [
                f"logger.monitor_gpus: no NVIDIA GPU to monitor on this machine ({type(err).__name__}: {err}); "
                "set logger.monitor_gpus=false on a CPU machine"
            ]
        ) from None
