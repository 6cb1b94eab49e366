"""Device descriptions: a table of known GPUs and the GPU in use, measured once.

The planner's analytic models need a handful of hardware figures. For planning
without a GPU (CI, a laptop planning for a cluster) they come from
``KNOWN_GPUS``; on a GPU the properties are read from the driver, the peak
rates are taken from the table entry whose name matches, and the memory
bandwidth is measured once per process by a device-to-device copy.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np

from .timing import cuda_times_s
from .xp import cupy_module


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    name: str
    compute_capability: str
    sms: int
    smem_per_block: int          # bytes, the opt-in maximum for one block
    smem_per_sm: int             # bytes
    regs_per_sm: int
    max_threads_per_sm: int
    peak_flops_fp32: float       # FLOP/s, CUDA cores (no tensor cores)
    peak_flops_fp64: float
    mem_bandwidth: float         # bytes/s (datasheet, or measured copy bandwidth)
    mem_latency_cycles: int = 600
    fma_latency_cycles: int = 4
    clock_hz: float = 1.5e9
    source: str = "table"        # "table" | "measured"
    l2_bytes: int = 50 * 1024 * 1024  # L2 cache (the H100's where a record predates this field)
    copy_bandwidth: float = 0.0  # bytes/s, this model's measured copy bandwidth (0: none recorded)

    def peak_flops(self, dtype) -> float:
        return self.peak_flops_fp64 if _itemsize(dtype) == 8 else self.peak_flops_fp32

    def t2threshold(self, dtype) -> float:
        """TSM2's boundary between memory- and compute-bound k: peak FLOP/s x bytes per element / bandwidth."""
        return self.peak_flops(dtype) * _itemsize(dtype) / self.mem_bandwidth

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


KB = 1024
MB = 1024 * KB
# Datasheet figures. FLOP/s are CUDA-core peaks (an FMA counts two), the rates
# TSM2 can use; bandwidths are the vendor's peak memory bandwidth. copy_bandwidth: the
# device-to-device copy bandwidth our tuning runs measured on an H100 SXM and an H200.
KNOWN_GPUS = {
    "H100": DeviceSpec("NVIDIA H100 SXM5", "9.0", 132, 227 * KB, 228 * KB, 65536, 2048,
                       66.9e12, 33.5e12, 3.35e12, 650, 4, 1.98e9, l2_bytes=50 * MB,
                       copy_bandwidth=2.874e12),
    "H200": DeviceSpec("NVIDIA H200 SXM", "9.0", 132, 227 * KB, 228 * KB, 65536, 2048,
                       66.9e12, 33.5e12, 4.8e12, 650, 4, 1.98e9, l2_bytes=50 * MB,
                       copy_bandwidth=3.945e12),
    "A100": DeviceSpec("NVIDIA A100 SXM4 40GB", "8.0", 108, 163 * KB, 164 * KB, 65536, 2048,
                       19.5e12, 9.7e12, 1.555e12, 600, 4, 1.41e9, l2_bytes=40 * MB),
    "V100": DeviceSpec("Tesla V100 SXM2", "7.0", 80, 96 * KB, 96 * KB, 65536, 2048,
                       15.7e12, 7.8e12, 900e9, 500, 4, 1.53e9, l2_bytes=6 * MB),
    "P100": DeviceSpec("Tesla P100 PCIe 16GB", "6.0", 56, 48 * KB, 64 * KB, 65536, 2048,
                       9.3e12, 4.7e12, 732e9, 500, 6, 1.30e9, l2_bytes=4 * MB),
    "K40c": DeviceSpec("Tesla K40c", "3.5", 15, 48 * KB, 48 * KB, 65536, 2048,
                       4.29e12, 1.43e12, 288e9, 450, 9, 0.745e9, l2_bytes=int(1.5 * MB)),
    "M40": DeviceSpec("Tesla M40", "5.2", 24, 48 * KB, 96 * KB, 65536, 2048,
                      6.84e12, 0.213e12, 288e9, 450, 6, 1.11e9, l2_bytes=3 * MB),
}

#: Used when no GPU is present and none is named: the device the project targets.
DEFAULT_GPU = "H100"
#: A measured copy bandwidth within this fraction of the table's ``copy_bandwidth`` for the GPU
#: model is taken as that figure, so that every process plans with the same number: a process's
#: measurement moves by 1-3%, and the costs of two near-equal candidates with it (metis_copter2's
#: SpGEMM plan flipped between hash and cuSPARSE between 2.79 and 2.85 TB/s on an H100).
#: Figures further off (another SKU, a MIG slice, a throttled GPU) are used as measured.
COPY_BW_SNAP = 0.08


def known(name: str) -> DeviceSpec:
    """The table entry for ``name`` (case-insensitive key such as 'H100' or 'k40c')."""
    for key, spec in KNOWN_GPUS.items():
        if key.lower() == str(name).lower():
            return spec
    raise ValueError(f"device: unknown GPU {name!r}; expected one of {sorted(KNOWN_GPUS)}")


def _match_table(device_name: str):
    upper = device_name.upper()
    for key, spec in KNOWN_GPUS.items():
        if key.upper() in upper:
            return spec
    return None


#: Untimed copies run at least this long before the timed ones, and the figure is the second
#: fastest of the timed copies: on an H100 a process's first copies ran at about
#: 2.3 TB/s instead of 2.87, and the median of ten after the warm-up once at 1.93 (something else
#: slowed a few milliseconds); a copy cannot beat the memory, so the fast end is the measurement.
BANDWIDTH_WARMUP_S = 0.05


def measure_copy_bandwidth(nbytes: int = 1 << 28, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written): the second fastest
    of ``repeats`` timed copies (the fastest with fewer than 3) after BANDWIDTH_WARMUP_S of
    untimed ones."""
    cp = cupy_module()
    if cp is None:
        raise RuntimeError("measure_copy_bandwidth needs CuPy and a GPU")
    src = cp.empty(nbytes // 8, dtype=cp.float64)
    dst = cp.empty_like(src)
    rt = cp.cuda.runtime
    # a byte pattern, not cp.random (its 1 - x kernel compiles on a process's first use)
    rt.memsetAsync(src.data.ptr, 0x5A, src.nbytes, cp.cuda.get_current_stream().ptr)

    def copy():   # the runtime's device-to-device copy: no CuPy kernel to compile on first use
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, rt.memcpyDeviceToDevice,
                       cp.cuda.get_current_stream().ptr)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < BANDWIDTH_WARMUP_S:
        for _ in range(4):
            copy()
        cp.cuda.get_current_stream().synchronize()
    times = cuda_times_s(copy, repeats, warmup=0)
    return 2 * src.nbytes / times[1 if len(times) >= 3 else 0]


@functools.lru_cache(maxsize=None)
def _gpu_spec(device_id: int) -> DeviceSpec:
    cp = cupy_module()
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    matched = _match_table(name)
    base = matched or KNOWN_GPUS[DEFAULT_GPU]
    with cp.cuda.Device(device_id):
        bandwidth = planning_bandwidth(measure_copy_bandwidth(), matched.copy_bandwidth if matched else 0.0)
    return dataclasses.replace(
        base,
        name=name,
        compute_capability=f"{props['major']}.{props['minor']}",
        sms=int(props["multiProcessorCount"]),
        smem_per_block=int(props.get("sharedMemPerBlockOptin", base.smem_per_block)),
        smem_per_sm=int(props.get("sharedMemPerMultiprocessor", base.smem_per_sm)),
        regs_per_sm=int(props.get("regsPerMultiprocessor", base.regs_per_sm)),
        max_threads_per_sm=int(props.get("maxThreadsPerMultiProcessor", base.max_threads_per_sm)),
        l2_bytes=int(props.get("l2CacheSize", base.l2_bytes)),
        mem_bandwidth=bandwidth,
        source="measured",
    )


def planning_bandwidth(measured: float, nominal: float) -> float:
    """The bandwidth the planner uses: ``nominal`` (the table's measured figure for this GPU
    model) when ``measured`` is within COPY_BW_SNAP of it, else ``measured``."""
    if nominal > 0 and abs(measured / nominal - 1.0) <= COPY_BW_SNAP:
        return nominal
    return measured


def current(name: str | None = None) -> DeviceSpec:
    """The device to plan for: ``name`` from the table, else the GPU in use, else the default table entry."""
    if name is not None:
        return known(name)
    cp = cupy_module()
    if cp is None:
        return KNOWN_GPUS[DEFAULT_GPU]
    return _gpu_spec(cp.cuda.Device().id)


def host_bandwidth_estimate() -> float:
    """A rough host memory bandwidth (bytes/s) for costing the CPU path; measured once."""
    return _host_bw()


@functools.lru_cache(maxsize=None)
def _host_bw() -> float:
    a = np.random.default_rng(0).random(1 << 22)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best
