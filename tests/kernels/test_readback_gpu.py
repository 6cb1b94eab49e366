"""Reading kernel results back: read_at / read_words wait for the stream's work (polling an event,
then blocking past SPIN_S) and return what the kernel wrote, for kernels shorter and longer than
the polling window."""
import time

import numpy as np
import pytest

from matplan.kernels import _cuda

pytestmark = pytest.mark.gpu

#: Thread 0 sleeps ``ns`` nanoseconds of the GPU's global timer, then the block writes
#: ``value + i`` to out[i] for i < n.
SLOW_WRITE = r"""
__device__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void slow_write(long long* out, long long n, long long value, long long ns) {
    if (threadIdx.x == 0) {
        const unsigned long long t0 = now();
        while (now() - t0 < (unsigned long long)ns) __nanosleep(1000);
    }
    __syncthreads();
    for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = value + i;
}
"""


@pytest.fixture
def slow_write(cp):
    return cp.RawKernel(SLOW_WRITE, "slow_write")


@pytest.mark.parametrize("wait_s", [0.0, 2 * _cuda.SPIN_S, 6 * _cuda.SPIN_S])
def test_read_at_waits_for_the_kernel(cp, slow_write, wait_s):
    out = cp.full(300, -1, dtype=cp.int64)   # poisoned: an unwritten word shows
    ns = int(wait_s * 1e9)
    slow_write((1,), (128,), (out, np.int64(300), np.int64(7), np.int64(ns)))
    t = time.perf_counter()
    got = _cuda.read_at(out.data.ptr, 300, np.int64)
    took = time.perf_counter() - t
    np.testing.assert_array_equal(got, 7 + np.arange(300))
    if wait_s:   # returned once the kernel was done, not before
        assert took >= 0.9 * wait_s


def test_read_words_waits_past_the_polling_window(cp, slow_write):
    out = cp.full(64, -1, dtype=cp.int64)
    slow_write((1,), (64,), (out, np.int64(64), np.int64(100), np.int64(int(4 * _cuda.SPIN_S * 1e9))))
    got = _cuda.read_words([out.data.ptr + 8 * i for i in (0, 5, 63)], np.int64)
    np.testing.assert_array_equal(got, [100, 105, 163])
