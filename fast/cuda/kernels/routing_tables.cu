// Routing tables of a chunk: cnt, off, slot, src (and order).
//
// Definition: strata_prefill.contract.routing.routing_tables (docs/numerics.md section 4). For ids [T, K] and
// pairs i = t*K + k, e = ids[i]:
//   cnt[e]  pairs routed to e;  off[e] = exclusive prefix sum of cnt over expert id;
//   for i ascending: slot[i] = off[e]++ (on a running copy); src[slot[i]] = i / K;
//   order = experts with cnt > 0 in id order (here: order[0 .. n_order) and -1 after it, E entries,
//   with n_order[0] = their number).
// The sequential `off[e]++` hands pair i the row off[e] + (number of earlier pairs of expert e):
// a stable per-expert rank, computed here in one block:
//   warp w owns the contiguous pairs [w*P, (w+1)*P); phase 1 counts its pairs per expert
//   (cw[w][e]); phase 2 turns the counts into per-warp bases off[e] + (pairs of e in warps < w);
//   phase 3 walks each warp's pairs in ascending order 32 at a time: __match_any_sync groups the
//   lanes of one expert, a lane's rank is the number of lower lanes in its group, and the
//   group's lowest lane advances the warp's base for the next 32.
// Dynamic shared memory: (warps + 2) * E ints. Expert ids must be in [0, E) (pairs outside are
// skipped and get no slot).
//
// row_experts -- definition: strata_prefill.contract.routing.row_experts: rexp[slot[i]] = ids[i] for the n pairs
// (the expert of each expert-sorted row, which the expert-bias kernels read: swiglu.cu,
// swiglu_q8_1.cu). A thread a pair.
//
// routed_row_tiles -- definition: strata_prefill.fast.tiles.routed_row_lists: the tile lists of
// a layer's tile-list MMQ launches (mmq.cu) cut on the device from cnt and off, so the host
// plans a layer's in-place products without reading the counts back (device_plan). The host
// hands one plan per tile configuration the mean rows per expert could call for: plans[p] =
// (tile_rows, bound, n_max, first entry of its list in tiles). The block counts the experts
// with woff[e] >= 0 and cnt[e] > 0 and their rows, picks the first plan with rows < bound *
// experts (bound 0: none), else the last (strata_prefill.fast.tiles.routed_choice), and cuts that list:
// every such expert, in id order, gets ceil(cnt / tile_rows) entries (row_begin, row_end, low
// and high 32 bits of woff[e]) of tile_rows rows each, the last what remains; the rest of every
// list is (0, 0, 0, 0). live[p]: the tiles of the chosen list, 0 for
// the others: mmq.cu built with MMQ_EMPTY_EXIT reads it, and the launches over the other lists
// load nothing. One block: each thread takes a contiguous run of experts, a block scan of their
// tile counts gives each run its first entry.

#include <stdint.h>

extern "C" __global__ void __launch_bounds__(1024)
routing_tables(const int* __restrict__ ids, int T, int K, int E, int* __restrict__ cnt,
               int* __restrict__ off, int* __restrict__ slot, int* __restrict__ src,
               int* __restrict__ order, int* __restrict__ n_order)
{
    extern __shared__ int sm[];
    const int nw = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    int* cw = sm;                  // [nw][E]
    int* tot = sm + nw * E;        // [E]
    int* soff = tot + E;           // [E]
    const long long N = (long long)T * K;
    const long long P = (N + nw - 1) / nw;
    const long long begin = (long long)warp * P;
    const long long end = min(begin + P, N);

    for (int i = threadIdx.x; i < nw * E; i += blockDim.x) cw[i] = 0;
    __syncthreads();

    // phase 1: per-warp counts
    for (long long base = begin; base < end; base += 32) {
        const long long i = base + lane;
        if (i < end) {
            const int e = ids[i];
            if (e >= 0 && e < E) atomicAdd(&cw[warp * E + e], 1);
        }
    }
    __syncthreads();

    // phase 2a: per-warp exclusive prefix over warps, totals
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < nw; ++w) {
            const int c = cw[w * E + e];
            cw[w * E + e] = run;
            run += c;
        }
        tot[e] = run;
        cnt[e] = run;
    }
    __syncthreads();

    // phase 2b: exclusive prefix over experts (off) and the compacted order, by warp 0
    if (warp == 0) {
        const int per = (E + 31) / 32;
        const int e0 = min(lane * per, E);
        const int e1 = min(e0 + per, E);
        int s = 0, f = 0;
        for (int e = e0; e < e1; ++e) {
            s += tot[e];
            f += tot[e] > 0;
        }
        int si = s, fi = f;  // inclusive warp scans
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, si, o);
            const int b = __shfl_up_sync(0xffffffffu, fi, o);
            if (lane >= o) {
                si += a;
                fi += b;
            }
        }
        int run = si - s, frun = fi - f;
        for (int e = e0; e < e1; ++e) {
            soff[e] = run;
            off[e] = run;
            run += tot[e];
            if (tot[e] > 0) order[frun++] = e;
        }
        const int nord = __shfl_sync(0xffffffffu, fi, 31);
        for (int j = nord + lane; j < E; j += 32) order[j] = -1;
        if (lane == 0) n_order[0] = nord;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nw * E; i += blockDim.x) cw[i] += soff[i % E];
    __syncthreads();

    // phase 3: stable ranks, 32 pairs at a time in ascending order
    for (long long base = begin; base < end; base += 32) {
        const long long i = base + lane;
        int e = (i < end) ? ids[i] : -1;
        const bool ok = (i < end) && e >= 0 && e < E;
        if (!ok) e = -1 - lane;  // a group of its own
        const unsigned mask = __match_any_sync(0xffffffffu, e);
        int s0 = 0;
        if (ok) s0 = cw[warp * E + e];
        __syncwarp();
        if (ok) {
            const int rank = __popc(mask & ((1u << lane) - 1u));
            if (lane == __ffs(mask) - 1) cw[warp * E + e] = s0 + __popc(mask);
            const int s = s0 + rank;
            slot[i] = s;
            src[s] = (int)(i / K);
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(256)
row_experts(const int* __restrict__ ids, const int* __restrict__ slot, long long n, int* __restrict__ rexp)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) rexp[slot[i]] = ids[i];
}

// the tiles routed_row_tiles gives expert rows of cnt rows at weight offset woff
__device__ __forceinline__ int routed_tiles_of(int cnt, long long woff, int tile_rows)
{
    return (woff >= 0 && cnt > 0) ? (cnt + tile_rows - 1) / tile_rows : 0;
}

// the block's sum of v (every thread returns it); red: 32 long longs of shared memory
__device__ __forceinline__ long long block_sum(long long v, long long* red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    long long t = 0;
    for (int w = 0; w < nw; ++w) t += red[w];
    __syncthreads();
    return t;
}

extern "C" __global__ void __launch_bounds__(256)
routed_row_tiles(const int* __restrict__ cnt, const int* __restrict__ off, const long long* __restrict__ woff,
                 int E, const int4* __restrict__ plans, int n_plans, int4* __restrict__ tiles,
                 int* __restrict__ live)
{
    __shared__ int warp_base[32];
    __shared__ int s_total;
    __shared__ long long red[32];
    const int nt = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int per = (E + nt - 1) / nt;
    const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
    long long my_exp = 0, my_rows = 0;
    for (int e = e0; e < e1; ++e) {
        const int c = cnt[e];
        if (woff[e] >= 0 && c > 0) {
            ++my_exp;
            my_rows += c;
        }
    }
    const long long n_exp = block_sum(my_exp, red), n_rows = block_sum(my_rows, red);
    int chosen = n_plans - 1;
    for (int p = n_plans - 1; p >= 0; --p)
        if (plans[p].y > 0 && n_rows < (long long)plans[p].y * n_exp) chosen = p;
    const int4 plan = plans[chosen];
    const int tile_rows = plan.x, n_max = plan.z;
    int4* list = tiles + plan.w;
    int mine = 0;
    for (int e = e0; e < e1; ++e) mine += routed_tiles_of(cnt[e], woff[e], tile_rows);
    int inc = mine;  // inclusive scan over the warp's lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += v;
    }
    if (lane == 31) warp_base[warp] = inc;
    __syncthreads();
    if (warp == 0) {  // exclusive scan over the warps' totals
        const int w = lane < nw ? warp_base[lane] : 0;
        int wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += v;
        }
        if (lane < nw) warp_base[lane] = wi - w;
        if (lane == 31) s_total = wi;
    }
    __syncthreads();
    int at = warp_base[warp] + inc - mine;
    for (int e = e0; e < e1; ++e) {
        const int rows = cnt[e];
        const long long w = woff[e];
        const int nrt = routed_tiles_of(rows, w, tile_rows);
        if (nrt == 0) continue;
        const int b0 = off[e], b1 = b0 + rows;
        const int lo = (int)(unsigned)(w & 0xffffffffll), hi = (int)(w >> 32);
        for (int k = 0; k < nrt && at < n_max; ++k, ++at) {
            const int b = b0 + k * tile_rows;
            list[at] = make_int4(b, min(b + tile_rows, b1), lo, hi);
        }
    }
    for (int i = s_total + tid; i < n_max; i += nt) list[i] = make_int4(0, 0, 0, 0);
    for (int p = 0; p < n_plans; ++p) {  // the lists not chosen: all empty, none live
        if (tid == 0) live[p] = p == chosen ? min(s_total, n_max) : 0;
        if (p == chosen) continue;
        const int4 q = plans[p];
        for (int i = tid; i < q.z; i += nt) tiles[q.w + i] = make_int4(0, 0, 0, 0);
    }
}
