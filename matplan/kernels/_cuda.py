"""Loading the ``.cu`` files beside the kernel modules as CuPy RawModules, once per device.

Kernel families call :func:`module` with the source file name and the template
instantiations they launch (``name_expressions``); the module is memoised per (file, names,
options, device) like CuPy's own kernel factories. It is loaded from a kept binary where one
fits (``_store``: the package's prebuilt kernels, then those compiled earlier on this machine);
otherwise NVRTC compiles it once for this GPU and it is kept for later processes.
"""
from __future__ import annotations

import contextlib
import ctypes
from concurrent.futures import ThreadPoolExecutor
import functools
import hashlib
import os
import re
import struct
import sys
import threading
import time

import numpy as np

from ..core.xp import cupy_module
from . import _nvrtc, _store

_HERE = os.path.dirname(os.path.abspath(__file__))
#: Options passed to NVRTC for every module.
NVRTC_OPTIONS = ("-std=c++17",)


#: cudaDeviceAttr values of the attributes read here, for runtimes whose bindings lack the name.
_ATTRIBUTE_ENUMS = {"MaxSharedMemoryPerBlockOptin": 97, "MultiProcessorCount": 16, "L2CacheSize": 38}


@functools.lru_cache(maxsize=None)
def device_attribute(name: str, device_id: int) -> int:
    """One CUDA device attribute (a key of ``_ATTRIBUTE_ENUMS``), read once per device and
    process: ``Device().attributes`` queries every attribute, tens of microseconds a call."""
    rt = cupy_module().cuda.runtime
    return int(rt.deviceGetAttribute(getattr(rt, "cudaDevAttr" + name, _ATTRIBUTE_ENUMS[name]), device_id))


@functools.lru_cache(maxsize=None)
def source(filename: str) -> str:
    with open(os.path.join(_HERE, filename), encoding="utf-8") as fh:
        return fh.read()


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


@functools.lru_cache(maxsize=None)
def headers(filename: str) -> tuple:
    """The quoted ``#include`` files ``filename`` reads, directly or through other headers, as
    paths relative to the kernels folder, in first-seen order."""
    seen: list = []
    todo = [filename]
    while todo:
        name = todo.pop(0)
        for inc in _INCLUDE.findall(source(name)):
            path = os.path.normpath(os.path.join(os.path.dirname(name), inc))
            if path not in seen:
                seen.append(path)
                todo.append(path)
    return tuple(seen)


def compiled_source(filename: str) -> str:
    """The text handed to NVRTC: the .cu, then a comment with its headers' digest, because CuPy's
    on-disk cache keys on this text and would reuse a stale binary after a header-only change."""
    digest = hashlib.sha256("".join(source(h) for h in headers(filename)).encode()).hexdigest()
    return f"{source(filename)}\n// headers {digest}\n"


def _module(filename: str, name_expressions: tuple, options: tuple, device_id: int):
    key = (filename, name_expressions, options, device_id)
    got = _LOADED.get(key)
    if got is None:
        got = _LOADED.setdefault(key, _load(*key))
    return got


#: Loaded modules by (file, instantiations, options, device).
_LOADED: dict = {}


def _kept(filename: str, name_expressions: tuple, options: tuple, device_id: int):
    """(the kept unit fitting this GPU, or None; the source's digest; the GPU's own target)."""
    major, minor = cupy_module().cuda.Device(device_id).compute_capability
    return _kept_for(filename, name_expressions, options, (int(major), int(minor)))


def _kept_for(filename: str, name_expressions: tuple, options: tuple, cc: tuple):
    """:func:`_kept` for a GPU of compute capability ``cc`` (major, minor)."""
    key = _store.digest(compiled_source(filename), NVRTC_OPTIONS + options)
    hit = _store.default_store().find(filename, key, name_expressions, _store.targets_for(cc))
    return hit, key, f"sm_{cc[0]}{cc[1]}"


def _load(filename: str, name_expressions: tuple, options: tuple, device_id: int):
    hit, key, target = _kept(filename, name_expressions, options, device_id)
    if hit is None:
        with _COMPILE_LOCK:   # one compilation of a module at a time in a process
            hit, key, target = _kept(filename, name_expressions, options, device_id)
            if hit is None:
                return _compile(filename, compiled_source(filename), key, name_expressions, options, target)
    path, lowered, _ = hit
    return Loaded(cupy_module().RawModule(path=str(path)), lowered)


def include(filename: str) -> tuple:
    """The -I option of ``filename``: a family's .cu includes its .cuh headers by name (NVRTC has no
    file path of its own)."""
    return ("-I" + os.path.dirname(os.path.join(_HERE, filename)),)


_COMPILE_LOCK = threading.Lock()
#: Modules compiled at run time in this process: (file, instantiations, target, seconds).
COMPILED: list = []


def _compile(filename: str, code: str, key: str, name_expressions: tuple, options: tuple, target: str):
    """Compile a module no kept binary holds, for this GPU, with NVRTC; keep it in the user's
    kernel cache (_store) and say so in one line. Without a libnvrtc of our own to drive, CuPy
    compiles it (and caches it its own way)."""
    cp = cupy_module()
    start = time.perf_counter()
    try:
        compiler = _nvrtc.Nvrtc()
    except (FileNotFoundError, OSError):
        compiler = None
    if compiler is None:
        mod = cp.RawModule(code=code, options=NVRTC_OPTIONS + include(filename) + options,
                           name_expressions=name_expressions)
        mod.compile()
        loaded = Loaded(mod, {n: n for n in name_expressions}, by_expression=True)
        where = "CuPy's kernel cache"
    else:
        binary, lowered = compiler.compile(code, os.path.basename(filename), name_expressions,
                                           NVRTC_OPTIONS + include(filename) + options, target)
        path = _store.default_store().add(filename, key, target, binary, lowered)
        loaded = Loaded(cp.RawModule(path=str(path)), lowered)
        where = str(path.parent)
    seconds = time.perf_counter() - start
    COMPILED.append((filename, name_expressions, target, seconds))
    sys.stderr.write(f"matplan: compiled {filename} ({len(name_expressions)} kernels, no prebuilt binary for "
                     f"{target}) with NVRTC in {seconds:.1f} s, once: kept in {where}\n")
    return loaded


def precompile(specs, compute_capability: tuple | None = None, workers: int | None = None) -> int:
    """Compile, in parallel threads, the modules of ``specs`` ((file, instantiations, options)
    each) that no kept binary holds for the current GPU (or one of ``compute_capability``), into
    the user's kernel cache without loading them; returns how many. A tuning run about to time
    many configs pays their compilations once over its cores instead of one after another
    (NVRTC runs outside the GIL: ctypes releases it). Without a libnvrtc of our own, none: each
    module compiles on first use as before."""
    if compute_capability is None:
        cp = cupy_module()
        if cp is None:
            return 0
        major, minor = cp.cuda.Device().compute_capability
        compute_capability = (int(major), int(minor))
    todo = {}
    for filename, names, options in specs:
        names, options = tuple(names), tuple(options)
        if (filename, names, options) not in todo:
            hit, key, target = _kept_for(filename, names, options, compute_capability)
            if hit is None:
                todo[(filename, names, options)] = (key, target)
    if not todo:
        return 0
    try:
        _nvrtc.Nvrtc()
    except (FileNotFoundError, OSError):
        return 0
    local = threading.local()

    def build(item):
        (filename, names, options), (key, target) = item
        compiler = getattr(local, "compiler", None) or _nvrtc.Nvrtc()
        local.compiler = compiler
        start = time.perf_counter()
        try:   # a module that fails is left to its first use, which raises for its own caller
            binary, lowered = compiler.compile(compiled_source(filename), os.path.basename(filename), names,
                                               NVRTC_OPTIONS + include(filename) + options, target)
        except RuntimeError:
            return None
        _store.default_store().add(filename, key, target, binary, lowered)
        return filename, names, target, time.perf_counter() - start

    start = time.perf_counter()
    threads = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    with ThreadPoolExecutor(threads) as pool:
        done = [d for d in pool.map(build, todo.items()) if d is not None]
    COMPILED.extend(done)
    sys.stderr.write(f"matplan: compiled {len(done)} of {len(todo)} module(s) ahead of use with NVRTC in "
                     f"{time.perf_counter() - start:.1f} s ({sum(d[3] for d in done):.1f} s of compilation over "
                     f"{threads} threads), kept in the kernel cache\n")
    return len(done)


class Loaded:
    """A loaded module whose kernels are looked up by name expression (``"k<float, 4>"``): a
    binary from file knows only lowered names."""

    def __init__(self, module, lowered: dict, by_expression: bool = False):
        self.module, self.lowered, self.by_expression = module, lowered, by_expression

    def get_function(self, name: str):
        return self.module.get_function(name if self.by_expression else self.lowered.get(name, name))


def available(filename: str, name_expressions, options=()) -> bool:
    """Whether the module of these instantiations loads for the current GPU without compiling:
    loaded already, or a kept binary fits."""
    names, options = tuple(name_expressions), tuple(options)
    cp = cupy_module()
    if cp is None:
        return False
    device = cp.cuda.Device().id
    return (filename, names, options, device) in _LOADED or _kept(filename, names, options, device)[0] is not None


def device_id(filename: str) -> int:
    cp = cupy_module()
    if cp is None:
        raise RuntimeError(f"{filename}: GPU kernels need CuPy and an NVIDIA GPU")
    return cp.cuda.Device().id


def module(filename: str, name_expressions, options=()):
    """The compiled RawModule of ``filename`` for the current device."""
    return _module(filename, tuple(name_expressions), tuple(options), device_id(filename))


def function(filename: str, name_expression: str, all_names, options=()):
    """One kernel of the module (all_names: every instantiation the module is compiled with).

    The handle is memoised per device: ``get_function`` is a driver call plus a mangled-name
    lookup, several microseconds that a launch path would otherwise pay on every call."""
    return _function(filename, name_expression, tuple(all_names), tuple(options),
                     device_id(filename))


@functools.lru_cache(maxsize=None)
def _function(filename, name_expression, all_names, options, device_id):
    return _module(filename, all_names, options, device_id).get_function(name_expression)


def driver_function(fn):
    """The compiled cuda Function a kernel handle stands for (a RawKernel holds it as ``.kernel``).
    Launching it directly skips RawKernel's wrapper (~2.4 us of host time a launch on an H100);
    cooperative launches, occupancy queries and attributes take it."""
    return getattr(fn, "kernel", fn)


def compiled(filename: str, name_expression: str, all_names, options=()):
    """:func:`function`'s kernel as its cuda Function (:func:`driver_function`)."""
    return driver_function(function(filename, name_expression, all_names, options))


def allow_dynamic_smem(fn, nbytes: int) -> None:
    """Let launches of ``fn`` (a kernel handle) ask for ``nbytes`` of dynamic shared memory, past
    the 48 KB a block gets without opting in; the driver is called once per kernel and size."""
    f = driver_function(fn)
    if _SMEM_LIMIT.get(f.ptr, 0) >= nbytes:
        return
    try:   # the driver call (RawKernel's own setter is deprecated in newer CuPy)
        from cupy_backends.cuda.api import driver
        driver.funcSetAttribute(f.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))
    except (ImportError, AttributeError):
        f.max_dynamic_shared_size_bytes = int(nbytes)
    _SMEM_LIMIT[f.ptr] = nbytes


_SMEM_LIMIT: dict = {}


def resident_blocks(fn, threads: int, smem: int = 0) -> int:
    """Blocks of ``fn`` (a kernel handle) one SM holds at once: the driver's occupancy query."""
    from cupy_backends.cuda.api import driver
    return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(driver_function(fn).ptr, threads, smem))


#: ctypes of the letters of a :class:`Launcher` signature: p a pointer (a CuPy array, an int
#: address or None), i int32, q int64, Q uint64, f float, d double.
PARAM_TYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
               "f": ctypes.c_float, "d": ctypes.c_double}
#: struct codes of the same letters (a pointer packed as a uint64 address).
_STRUCT_CODES = {"p": "Q", "i": "i", "q": "q", "Q": "Q", "f": "f", "d": "d"}


class Launcher:
    """``fn`` (a kernel handle) launched through the driver with its parameters packed in one
    buffer laid out as the C structure of its parameters.

    CuPy's launch converts every argument on each call (a NumPy scalar ~0.5 us): a kernel of 15
    parameters took 11-16 us of host time a launch on an H100 host, a packed launch 5.4;
    launch paths of several kernels (SpTRANS: four to six a call)
    are host-bound by it. The arguments are packed by one ``struct.pack_into`` (a field's
    ``setattr`` a parameter cost ~40% of spgemm's launch path under a line trace): pointers from
    CuPy arrays (``.data.ptr``), None (null) or integer addresses, scalars as Python or NumPy
    numbers (an integer parameter takes no float).
    ``signature`` has one letter a parameter (:data:`PARAM_TYPES`); a call checks the count, the
    packing the types and ranges. Each thread packs into its own buffer; the driver copies the
    parameters at the launch, so it is reused at once.
    """

    def __init__(self, fn, signature: str):
        bad = set(signature) - set(PARAM_TYPES)
        if bad:
            raise ValueError(f"signature {signature!r}: unknown letters {sorted(bad)}; expected {sorted(PARAM_TYPES)}")
        self.ptr = driver_function(fn).ptr
        self.signature = signature
        names = [f"a{i}" for i in range(len(signature))]
        self._struct = type("Params", (ctypes.Structure,),
                            {"_fields_": [(name, PARAM_TYPES[c]) for name, c in zip(names, signature)]})
        self._offsets = [getattr(self._struct, n).offset for n in names]
        fmt, at = "=", 0   # explicit padding to the C structure's offsets
        for off, c in zip(self._offsets, signature):
            fmt += "x" * (off - at) + _STRUCT_CODES[c]
            at = off + ctypes.sizeof(PARAM_TYPES[c])
        self._pack = struct.Struct(fmt).pack_into
        self.pointers = tuple(i for i, c in enumerate(signature) if c == "p")
        self._local = threading.local()

    def _buffers(self):
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = self.buffers()
        return buf

    def buffers(self):
        """A parameter buffer of its own: (the packed parameters, the address of the pointers to
        each, the pointer array); :meth:`pack` packs into this thread's."""
        params = ctypes.create_string_buffer(ctypes.sizeof(self._struct))
        base = ctypes.addressof(params)
        ptrs = (ctypes.c_void_p * len(self._offsets))(*[base + off for off in self._offsets])
        return params, ctypes.addressof(ptrs), ptrs

    def __call__(self, grid, block, args, shared_mem: int = 0, cooperative: bool = False) -> None:
        """Launch on the current stream; ``cooperative``: every block resident at once
        (cuLaunchCooperativeKernel, for kernels with grid barriers; never recorded for a graph)."""
        if len(args) != len(self.signature):
            raise TypeError(f"kernel of signature {self.signature!r}: {len(self.signature)} arguments, got {len(args)}")
        launch, current_stream, nd = _launch_api()
        values = list(args)
        for i in self.pointers:   # CuPy arrays to their addresses, None to null; addresses as they are
            a = values[i]
            if isinstance(a, nd):
                values[i] = a.data.ptr
            elif a is None:
                values[i] = 0
        ptrs = self.pack(values)
        grid, block = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
        log = getattr(_RECORD, "log", None)
        if cooperative:
            if log is not None:
                raise RuntimeError("a cooperative launch cannot be recorded for a CUDA graph")
            cupy_module().cuda.driver.launchCooperativeKernel(self.ptr, *grid, *block, int(shared_mem),
                                                             current_stream().ptr, ptrs)
            return
        if log is not None:   # recording (:func:`recording`): kept for a graph, not launched
            log.append(("launch", self, grid, block, int(shared_mem), values))
            return
        launch(self.ptr, *grid, *block, int(shared_mem), current_stream().ptr, ptrs, 0)

    def pack(self, values, buffers=None) -> int:
        """The address of the parameter pointers (``kernelParams``) of ``values`` (pointers as
        integer addresses) packed into ``buffers`` (:meth:`buffers`), by default this thread's
        (valid until its next pack)."""
        params, ptrs, _ = buffers or self._buffers()
        try:
            self._pack(params, 0, *values)
        except struct.error as e:
            raise TypeError(f"kernel of signature {self.signature!r}: arguments {values!r} do not pack: {e}") from None
        return ptrs


@functools.lru_cache(maxsize=None)
def _launch_api():
    """(the driver's launchKernel, the current-stream getter, cupy.ndarray), looked up once, not
    through attribute chains on every launch. A Launcher call took 7.1 us of host time on an H100
    host against 3.9 for the driver call alone and 0.7 for the packing; what this
    lookup saves of the rest was within that host's noise."""
    cp = cupy_module()
    return cp.cuda.driver.launchKernel, cp.cuda.get_current_stream, cp.ndarray


def zeroed(n: int, dtype):
    """A zeroed device array of n elements: ``cp.empty`` and one cudaMemsetAsync on the current
    stream. ``cp.zeros`` launches CuPy's fill kernel through its elementwise machinery, ~10 us of
    host time a call on an H100 host against ~6; launch paths that zero a few
    counters a call are host-bound by it."""
    cp = cupy_module()
    a = cp.empty(n, dtype=dtype)
    zero(a.data.ptr, a.nbytes)
    return a


def zero(ptr: int, nbytes: int) -> None:
    """Zero ``nbytes`` (a multiple of 4) at device address ``ptr`` on the current stream
    (cudaMemsetAsync), or record it while :func:`recording`."""
    if not nbytes:
        return
    log = getattr(_RECORD, "log", None)
    if log is not None:
        log.append(("zero", int(ptr), int(nbytes)))
        return
    cp = cupy_module()
    cp.cuda.runtime.memsetAsync(ptr, 0, nbytes, cp.cuda.get_current_stream().ptr)


def duplicate(a):
    """A copy of contiguous device array ``a`` by one cudaMemcpyAsync on the current stream:
    ``ndarray.copy()`` goes through CuPy's elementwise copy, a kernel compiled on first use."""
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        raise ValueError("duplicate: expected a contiguous array")
    cp = cupy_module()
    out = cp.empty_like(a)
    if a.nbytes:
        cp.cuda.runtime.memcpyAsync(out.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)
    return out


def hold(*objs) -> None:
    """Keep ``objs`` (a call's scratch allocations) alive as long as the graph of a :func:`recording`
    in progress, whose launches read and write them on every replay; nothing otherwise."""
    log = getattr(_RECORD, "log", None)
    if log is not None:
        log.extend(("hold", obj) for obj in objs)


_RECORD = threading.local()


@contextlib.contextmanager
def recording():
    """Record this thread's :class:`Launcher` launches and :func:`zero` calls instead of issuing
    them, in order, with what :func:`hold` keeps: yields the list of records (``("launch",
    launcher, grid, block, shared_mem, values)``, ``("zero", ptr, nbytes)``, ``("hold", obj)``) that
    ``_graph.KernelGraph`` builds a CUDA graph of. Allocations made meanwhile are real; a call
    recorded must have no other stream work (CuPy kernels, copies) and no host synchronisation."""
    prev = getattr(_RECORD, "log", None)
    _RECORD.log = log = []
    try:
        yield log
    finally:
        _RECORD.log = prev


_HOST = threading.local()


def read_back(a) -> np.ndarray:
    """A small contiguous device array's values on the host, a copy (:func:`read_at`)."""
    if not a.flags.c_contiguous:
        raise ValueError("read_back: expected a C-contiguous array")
    return read_at(a.data.ptr, a.size, a.dtype).reshape(a.shape)


def read_at(ptr: int, n: int, dtype) -> np.ndarray:
    """``n`` values of ``dtype`` at device address ``ptr`` on the host, a copy: one
    cudaMemcpyAsync into a pinned buffer kept per thread, then :func:`wait` on the current
    stream. ``ndarray.get()`` into pageable memory took ~15 us of host time for a few
    words on an H100 host; the launch paths wait on two such reads a call (spgemm's analysis and
    C's nnz), and an address needs no CuPy slice (~2 us of host time each) to name the words."""
    cp = cupy_module()
    dtype = np.dtype(dtype)
    nbytes = int(n) * dtype.itemsize
    held = _pinned(nbytes)
    stream = cp.cuda.get_current_stream()
    if nbytes:
        cp.cuda.runtime.memcpyAsync(held.ctypes.data, ptr, nbytes, cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        wait(stream)
    return held[:nbytes].view(dtype).copy()


#: How long :func:`wait` polls before it blocks: the kernels a plan or a launch path reads back
#: from take tens to hundreds of microseconds.
SPIN_S = 5e-4


def wait(stream) -> None:
    """Wait for the work queued on ``stream`` (a stream of the current device): an event recorded
    on it is polled for up to :data:`SPIN_S`, then synchronised (which releases the GIL). A
    blocking ``stream.synchronize()`` returned 30-80 us after a short kernel had finished where the
    GPU had idled a few hundred microseconds first (a plan's host work before its statistics call),
    on an H100 host."""
    events = getattr(_HOST, "events", None)
    if events is None:
        events = _HOST.events = {}
    cp = cupy_module()
    device = cp.cuda.runtime.getDevice()   # the current device's stream (the launch paths' only kind)
    ev = events.get(device)
    if ev is None:
        ev = events[device] = cp.cuda.Event(block=False, disable_timing=True)
    ev.record(stream)
    deadline = time.perf_counter() + SPIN_S
    while not ev.done:
        if time.perf_counter() > deadline:
            ev.synchronize()
            return


def _pinned(nbytes: int) -> np.ndarray:
    """This thread's pinned host buffer of at least ``nbytes`` (grown when short)."""
    held = getattr(_HOST, "buf", None)
    if held is None or held.size < nbytes:
        held = _HOST.buf = np.frombuffer(cupy_module().cuda.alloc_pinned_memory(max(nbytes, 4096)), dtype=np.uint8)
    return held


def read_words(ptrs, dtype) -> np.ndarray:
    """One value of ``dtype`` at each device address of ``ptrs`` on the host, a copy: a
    cudaMemcpyAsync each into the pinned buffer of :func:`read_at`, one :func:`wait`."""
    cp = cupy_module()
    dtype = np.dtype(dtype)
    nbytes = len(ptrs) * dtype.itemsize
    held = _pinned(nbytes)
    stream = cp.cuda.get_current_stream()
    for i, ptr in enumerate(ptrs):
        cp.cuda.runtime.memcpyAsync(held.ctypes.data + i * dtype.itemsize, int(ptr), dtype.itemsize,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    wait(stream)
    return held[:nbytes].view(dtype).copy()


def launcher(fn, signature: str) -> Launcher:
    """The :class:`Launcher` of ``fn`` (a kernel handle) and ``signature``, built once per kernel:
    its parameter structure is a ctypes type of its own."""
    return _launcher(driver_function(fn), signature)


@functools.lru_cache(maxsize=None)
def _launcher(function, signature):
    return Launcher(function, signature)


def packed(fn, filename: str, name_expression: str, **template_letters) -> Launcher:
    """The :class:`Launcher` of ``fn``, the kernel ``name_expression`` (``"k<float,int>"`` or
    ``"k"``) of ``filename``, its signature read from the kernel's declaration there
    (:func:`signature`; ``template_letters`` as that takes them)."""
    return launcher(fn, signature(filename, name_expression.split("<")[0], **template_letters))


#: Letters of the by-value parameter types a kernel declaration may use (:func:`signature`).
_TYPE_LETTERS = {"int": "i", "long long": "q", "unsigned long long": "Q", "float": "f", "double": "d"}


@functools.lru_cache(maxsize=None)
def signature(filename: str, kernel: str, **template_letters) -> str:
    """The :class:`Launcher` signature of ``kernel`` read from its declaration in ``filename``: a
    pointer is ``p``, a scalar the letter of its type (:data:`PARAM_TYPES`); ``template_letters``
    give the letter of a template parameter passed by value (``I="q"``). Raises ValueError when the
    kernel is not declared once there or a parameter type is not known: a launch path never packs
    arguments by a signature guessed from them."""
    text = re.sub(r"//[^\n]*", "", source(filename))
    decl = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*|[A-Z_][A-Z0-9_]*\s+)*"
                      + re.escape(kernel) + r"\s*\(([^)]*)\)")
    found = decl.findall(text)
    if len(found) != 1:
        raise ValueError(f"{filename}: kernel {kernel!r} is declared {len(found)} times; expected once")
    letters = []
    for param in found[0].split(","):
        words = [w for w in re.sub(r"\b(const|__restrict__|volatile)\b", " ", param).split()]
        if "*" in param:
            letters.append("p")
            continue
        kind = " ".join(words[:-1])
        letter = template_letters.get(kind, _TYPE_LETTERS.get(kind))
        if letter is None:
            raise ValueError(f"{filename}: {kernel} parameter {param.strip()!r}: type {kind!r} has no letter; "
                             f"known {sorted(_TYPE_LETTERS)} and the template letters {sorted(template_letters)}")
        letters.append(letter)
    return "".join(letters)


_INDEX_LETTERS = {np.dtype(np.int32): "i", np.dtype(np.int64): "q"}
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
           np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


def index_letter(dtype) -> str:
    """The :class:`Launcher` letter of a kernel parameter of this integer dtype (int32 / int64)."""
    return _INDEX_LETTERS[np.dtype(dtype)]


def ctype(dtype) -> str:
    """The CUDA C type of a NumPy dtype (float/double/int/long long)."""
    return _CTYPES[np.dtype(dtype)]


@functools.lru_cache(maxsize=None)
def cusparse_bindings(names: tuple):
    """(CuPy's low-level cuSPARSE bindings module, None), or (None, why it cannot be used: no CuPy
    with a GPU, the module does not import, or it lacks some of ``names``)."""
    if cupy_module() is None:
        return None, "no CuPy with a GPU"
    try:
        from cupy_backends.cuda.libs import cusparse as lib   # optional: CuPy is not required
    except Exception as exc:   # a CuPy build without cuSPARSE (ImportError, or a loader error)
        return None, f"CuPy's cuSPARSE bindings do not import: {type(exc).__name__}: {exc}"
    missing = [name for name in names if not hasattr(lib, name)]
    if missing:
        return None, f"CuPy's cuSPARSE bindings lack {', '.join(missing)}"
    return lib, None
