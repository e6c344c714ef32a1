// Spin: a busy wait of a given number of SM clock cycles (clock64()), for the cuda backend's
// stress mode (fast/cuda/stress.py, STRATA_PREFILL_STRESS=SEED). Queued before a copy on the
// copy stream, before the routing counts' copy back to the host and before a random share of
// the compute stream's launches, it makes copies land late and the two streams interleave in
// orders normal timing never shows, so a missing event wait gives wrong bytes on the real GPU.
//
// Definition: NumPy has none: the kernel computes nothing and writes nothing; it only takes
// time on its stream. Launched as one thread (grid 1, block 1).

#include <stdint.h>

extern "C" __global__ void spin(long long cycles)
{
    const long long t0 = clock64();
    // clock64() is volatile: the compiler keeps every read, so the loop cannot be folded away
    while (clock64() - t0 < cycles) {
    }
}
