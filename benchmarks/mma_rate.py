"""Throughput of mma.sync m16n8k8 TF32, cvt.rna.tf32.f32 and FP32 FMA on this GPU (registers only, no
memory traffic): the units tsm2_tc.cu leans on. Prints warp instructions a clock an SM.

    python3 benchmarks/mma_rate.py
"""
import cupy as cp, numpy as np
src = r'''
extern "C" __global__ void mma_loop(float* out, int iters) {
    float d[8][4];
    for (int a = 0; a < 8; ++a) for (int i = 0; i < 4; ++i) d[a][i] = 0.f;
    unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 ^ 5u, a3 = a0 + 7u, b0 = a0 * 11u, b1 = a0 + 1u;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int a = 0; a < 8; ++a)
            asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                : "+f"(d[a][0]), "+f"(d[a][1]), "+f"(d[a][2]), "+f"(d[a][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.f;
    for (int a = 0; a < 8; ++a) for (int i = 0; i < 4; ++i) s += d[a][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void cvt_loop(float* out, int iters) {
    float x[8];
    for (int a = 0; a < 8; ++a) x[a] = threadIdx.x * 1.000123f + a;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int a = 0; a < 8; ++a) {
            unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x[a]));
            x[a] = __uint_as_float(r) * 1.0000001f;
        }
    }
    float s = 0.f;
    for (int a = 0; a < 8; ++a) s += x[a];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
extern "C" __global__ void fma_loop(float* out, int iters) {
    float x[8];
    for (int a = 0; a < 8; ++a) x[a] = threadIdx.x * 1.000123f + a;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int a = 0; a < 8; ++a) x[a] = x[a] * 1.0000001f + 0.5f;
    }
    float s = 0.f;
    for (int a = 0; a < 8; ++a) s += x[a];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
'''
mod = cp.RawModule(code=src, options=("-std=c++17",))
dev = cp.cuda.Device()
sms = dev.attributes["MultiProcessorCount"]
clk = dev.attributes["ClockRate"] * 1e3   # Hz (max)
out = cp.empty(sms * 8 * 256, dtype=cp.float32)
iters = 4096
for name in ("mma_loop", "cvt_loop", "fma_loop"):
    f = mod.get_function(name)
    for blocks_per_sm in (4, 8):
        grid = sms * blocks_per_sm
        f((grid,), (256,), (out, np.int32(iters)))
        cp.cuda.Device().synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(); f((grid,), (256,), (out, np.int32(iters))); e.record(); e.synchronize()
        t = cp.cuda.get_elapsed_time(s, e) * 1e-3
        warp_ops = grid * 8 * iters * 8       # warps x iterations x 8 ops
        per_sm_clk = warp_ops / sms / (t * clk)
        extra = ""
        if name == "mma_loop":
            extra = f" = {per_sm_clk * 2048 * sms * clk / 1e12:.0f} TF32 TFLOPS (clock {clk/1e9:.2f} GHz)"
        print(f"{name} {blocks_per_sm} blocks/SM: {t*1e3:.3f} ms, {per_sm_clk:.3f} warp-ops/clk/SM ({1/per_sm_clk:.2f} clk each){extra}")
