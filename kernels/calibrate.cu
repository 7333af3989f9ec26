// Clock calibration kernels (src/cuda/calibrate.rs compiles this with NVRTC).
//
// tgpu_calibrate: a ping-pong through pinned, device-mapped host memory. One
// thread spins on `cmd` (host memory, read over PCIe). Round i starts when the
// host writes i + 1 there; the thread then reads %globaltimer and writes it to
// ack[i], which the host is spinning on. Every poll that still saw the old
// value is a bound too: it reached host memory before the host's write, so the
// timer read just before issuing it is no later than the host stamp taken just
// after the write. The last such time of each round goes to stale[i] (0: none).
// The host reads stale[] after the kernel has finished.
//
// tgpu_timer_step: reads %globaltimer back to back and reports the smallest
// non-zero step seen, which is the timer's resolution (32 ns on Hopper).

typedef unsigned long long u64;

#define TGPU_CAL_STOP 0xffffffffffffffffull

__device__ __forceinline__ u64 tgpu_globaltimer() {
    u64 t;
    // "memory": the compiler must not move the poll's load across the read.
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

extern "C" __global__ void tgpu_calibrate(const volatile u64* cmd, volatile u64* ack, volatile u64* stale,
                                          unsigned int rounds) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    for (unsigned int i = 0; i < rounds; ++i) {
        const u64 seq = (u64)i + 1;
        u64 last_stale = 0;
        u64 v;
        for (;;) {
            const u64 issued = tgpu_globaltimer();
            v = *cmd;
            if (v >= seq) {
                break;
            }
            last_stale = issued;
        }
        if (v == TGPU_CAL_STOP) {
            return;
        }
        // Read after the poll's value arrived: the branch above depends on it.
        const u64 t = tgpu_globaltimer();
        ack[i] = t;
        stale[i] = last_stale;
    }
}

extern "C" __global__ void tgpu_timer_step(u64* out, unsigned int reads) {
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    u64 prev = tgpu_globaltimer();
    u64 first = prev;
    u64 step = ~0ull;
    unsigned int changes = 0;
    for (unsigned int i = 0; i < reads; ++i) {
        const u64 t = tgpu_globaltimer();
        if (t != prev) {
            const u64 d = t - prev;
            step = d < step ? d : step;
            ++changes;
            prev = t;
        }
    }
    out[0] = step;
    out[1] = changes;
    out[2] = prev - first;
}
