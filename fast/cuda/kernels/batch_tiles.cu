// The tile list of a layer's in-place MMQ launches, built on the device from the routing tables,
// so that the host needs no routing counts for an all-resident layer.
//
// Definition: fast.cuda.products.row_tiles(bounds, woff, tile_rows) over the experts with rows,
// in id order (fast.walk.split_resident's batch when every expert is resident): expert e with
// rows = cnt[e] > 0 starting at off[e] is cut into nrt = ceil(rows / tile_rows) tiles of
// rpt = round_up_8(ceil(rows / nrt)) rows, the last one shorter; tile k is the int4
// (off[e] + k rpt, min(off[e] + (k + 1) rpt, off[e] + rows), low and high 32 bits of woff[e]).
// The experts' tiles follow one another in id order. n_tiles[0] = their number.
//
// One CTA of BT_THREADS threads: thread i takes experts i * per .. (i + 1) * per - 1, counts
// their tiles, an exclusive scan over the threads gives where its tiles start, then it writes
// them. Integer arithmetic only.
#include <stdint.h>

#define BT_THREADS 1024

extern "C" __global__ void __launch_bounds__(BT_THREADS)
batch_tiles(const int* __restrict__ cnt, const int* __restrict__ off, const long long* __restrict__ woff, int E,
            int tile_rows, int4* __restrict__ tiles, int* __restrict__ n_tiles)
{
    __shared__ int warp_sum[BT_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = (E + BT_THREADS - 1) / BT_THREADS;
    const int e0 = tid * per, e1 = min(E, e0 + per);
    int mine = 0;
    for (int e = e0; e < e1; ++e) mine += (cnt[e] + tile_rows - 1) / tile_rows;
    // exclusive scan of `mine` over the block: within each warp, then over the warps' sums
    int incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) warp_sum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = lane < BT_THREADS / 32 ? warp_sum[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += v;
        }
        if (lane < BT_THREADS / 32) warp_sum[lane] = w;  // inclusive over the warps
    }
    __syncthreads();
    int at = incl - mine + (warp ? warp_sum[warp - 1] : 0);
    for (int e = e0; e < e1; ++e) {
        const int rows = cnt[e];
        if (rows <= 0) continue;
        const int nrt = (rows + tile_rows - 1) / tile_rows;
        const int rpt = (((rows + nrt - 1) / nrt) + 7) / 8 * 8;
        const unsigned long long w = (unsigned long long)woff[e];
        for (int k = 0; k < nrt; ++k) {
            const int b = off[e] + k * rpt;
            tiles[at++] = make_int4(b, min(b + rpt, off[e] + rows), (int)(unsigned)(w & 0xffffffffu), (int)(unsigned)(w >> 32));
        }
    }
    if (tid == BT_THREADS - 1) *n_tiles = at;  // the last thread ends after every tile
}
