// Clock calibration kernels (src/cuda/calibrate.rs compiles this with NVRTC).
//
// tgpu_calibrate: a ping-pong through pinned, device-mapped host memory, one
// thread. Round i starts when the host writes i + 1 to `cmd` (host memory,
// read over PCIe); the thread, spinning on it with one read in flight, sees it,
// reads %globaltimer and writes the value to ack[i], which the host is spinning
// on. Every poll that still saw the old value is a bound too: it reached host
// memory before the host's write, so the timer read just before issuing it is
// no later than the host stamp taken just after the write. The last such time
// of each round goes to stale[i] (0: none); the host reads stale[] after the
// kernel has finished.
//
// tgpu_calibrate_pollers: the same with lane 0 of each warp of the block
// polling, staggered, and the first to see a round answering it. With one
// poller, the read that first sees the flag usually left just before the host
// wrote it (the host writes right after it sees the previous answer, which the
// poller's next read follows closely), so the forward path usually carries a
// whole read latency more (measured: docs/calibration.md); several staggered
// pollers keep a read arriving every latency/pollers.
//
// Neither uses shared memory: a kernel that does will not start on an SM whose
// running blocks use none until they end (the SM's split between L1 and shared
// memory must change first). Beside a long kernel without shared memory on every
// SM, the pollers' kernel, when it claimed rounds in shared memory, waited for that
// kernel to end, and, queued at the top priority, held back every kernel launched
// on the GPU after it (H200, 2026-12-04: docs/calibration.md). The claims live in
// global memory instead, one word per lane slot of the calibrator.
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

// The pollers' claims: the highest round answered, one per lane slot (slot < 32;
// calibrate.rs has LANES of them, which tests/calibrate.rs checks against this size).
__device__ u64 tgpu_cal_answered[32];

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

extern "C" __global__ void tgpu_calibrate_pollers(const volatile u64* cmd, volatile u64* ack, volatile u64* stale,
                                          unsigned int rounds, unsigned int slot) {
    // The slot's claim: no other kernel uses the slot until this one has ended.
    u64* answered = &tgpu_cal_answered[slot & 31u];
    if (threadIdx.x == 0) {
        *answered = 0;
    }
    __syncthreads();
    if (blockIdx.x != 0 || threadIdx.x % 32 != 0) {
        return;
    }
    // Stagger the pollers' first reads over about one read round trip (1 µs).
    const unsigned int pollers = (blockDim.x + 31) / 32;
    const u64 delay = (u64)(threadIdx.x / 32) * 1000 / pollers;
    const u64 t0 = tgpu_globaltimer();
    while (tgpu_globaltimer() - t0 < delay) {
    }
    u64 seq = 1;  // the round this poller waits for
    u64 last_stale = 0;
    while (seq <= rounds) {
        const u64 issued = tgpu_globaltimer();
        const u64 v = *cmd;
        if (v < seq) {
            last_stale = issued;
            continue;
        }
        if (v == TGPU_CAL_STOP) {
            return;
        }
        // Read after the poll's value arrived: the branch above depends on it.
        const u64 t = tgpu_globaltimer();
        // The host posts round v only once round v - 1 is answered, so v is
        // the newest round: whoever claims it first answers it.
        if (atomicMax(answered, v) < v) {
            ack[v - 1] = t;
            stale[v - 1] = last_stale;
        }
        seq = v + 1;
        last_stale = 0;
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
