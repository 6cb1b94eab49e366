"""NVRTC through ctypes, for building the prebuilt kernels without a GPU (``matplan.prebuild``).

CuPy compiles with NVRTC at run time; this module drives the same compiler offline, for any
target architecture, and returns each template instantiation's lowered (mangled) name, which a
binary loaded from file is looked up by.
"""
from __future__ import annotations

import ctypes
import glob
import importlib
import os
import sysconfig

#: nvrtcResult NVRTC_SUCCESS.
_SUCCESS = 0


def library_path() -> str:
    """libnvrtc's path: $MATPLAN_NVRTC, cuda-pathfinder's answer, the nvidia-cuda-nvrtc wheel, or
    $CUDA_HOME (/usr/local/cuda)."""
    explicit = os.environ.get("MATPLAN_NVRTC")
    if explicit:
        return explicit
    try:   # where CuPy finds its CUDA libraries (CuPy 14 depends on cuda-pathfinder)
        found = importlib.import_module("cuda.pathfinder").load_nvidia_dynamic_lib("nvrtc").abs_path
        if found:
            return found
    except Exception:  # noqa: BLE001  not installed, or no NVRTC it knows of: look in the usual places
        pass
    site = sysconfig.get_paths()["purelib"]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for pattern in (f"{site}/nvidia/cu*/lib/libnvrtc.so.*", f"{site}/nvidia/cuda_nvrtc/lib/libnvrtc.so.*",
                    f"{cuda_home}/lib64/libnvrtc.so*"):
        found = sorted(p for p in glob.glob(pattern) if "alt" not in os.path.basename(p))
        if found:
            return found[0]
    raise FileNotFoundError("NVRTC not found: pip install 'nvidia-cuda-nvrtc==13.0.*', or set MATPLAN_NVRTC "
                            "to libnvrtc.so's path")


class Nvrtc:
    """One loaded libnvrtc: :meth:`compile` a source for one target."""

    def __init__(self, path: str | None = None):
        self.path = path or library_path()
        folder = os.path.dirname(self.path)
        for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*"))):
            if "alt" not in os.path.basename(builtins):   # NVRTC dlopens it by name: load it first
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(self.path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def version(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return f"{major.value}.{minor.value}"

    def _check(self, status: int, what: str, log: str = "") -> None:
        if status != _SUCCESS:
            message = self.lib.nvrtcGetErrorString(status).decode()
            raise RuntimeError(f"{what}: {message}" + (f"\n{log}" if log else ""))

    def compile(self, code: str, name: str, name_expressions, options, target: str) -> tuple[bytes, dict]:
        """(the binary, {name expression: lowered name}) of ``code`` for ``target`` ('sm_90' gives
        a cubin, 'compute_90' PTX)."""
        lib = self.lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for expr in name_expressions:
                self._check(lib.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
            opts = [o.encode() for o in (*options, f"-arch={target}")]
            status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            self._check(status, f"{name} for {target}", self._log(prog))
            kind = "CUBIN" if target.startswith("sm_") else "PTX"
            size = ctypes.c_size_t()
            self._check(getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
            buf = ctypes.create_string_buffer(size.value)
            self._check(getattr(lib, f"nvrtcGet{kind}")(prog, buf), f"nvrtcGet{kind}")
            lowered = {}
            for expr in name_expressions:
                out = ctypes.c_char_p()
                self._check(lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(out)),
                            f"nvrtcGetLoweredName({expr})")
                lowered[expr] = out.value.decode()
            return buf.raw, lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog) -> str:
        size = ctypes.c_size_t()
        if self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != _SUCCESS or size.value <= 1:
            return ""
        buf = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")
