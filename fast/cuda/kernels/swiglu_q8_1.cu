// SwiGLU of a group's gate and up rows and the q8_1 quantize of the result (H) in one launch:
// the down product's input written straight from the two products.
//
// Definition: strata_prefill.contract.moe.swiglu (H = silu(gate) * up), then strata_prefill.contract.q8_1.quantize_rows of H's
// rows (the quantize that strata_prefill.contract.q8_1.gather_quantize applies row by row) in the layout the
// down type selects. The same bytes as swiglu.cu followed by quantize_q8_1.cu's q8_1_gather
// over H's rows in order: both take each value from strata_swiglu (strata_numerics.cuh) and
// each block from q8_1_block (q8_1_block.cuh); H never leaves registers, and with
// --fmad=false a float32 value kept in a register is the float32 value stored and reloaded.
//
// Rows r < rows of n values: g at + r * ldg, u at + r * ldu (pointers already offset to the
// first row of the range); row r of H goes to row r of the q8_1 buffer out (R_total rows,
// block (kb, r) at index kb * R_total + r; out already offset to the range's first row).
// One warp per (row, 128-value block), lane l computes values 4l..4l+3; values past n are
// the row's zero padding (0.0f, not SwiGLU of anything).
//
// swiglu_oai_q8_1 -- the same with gpt-oss's clamped SwiGLU and expert biases in place of
// strata_swiglu: each value is swiglu.cu's swiglu_oai_rows value (strata_prefill.contract.moe.swiglu_oai of the
// biased gate and up, strata_swiglu_oai), then the same q8_1 blocks. rexp (the expert of each row
// of the range, offset like g), bg, bu (bias rows, row e at + e * ldb): as swiglu_oai_rows; rexp
// NULL: no biases.
//
// swiglu_q8_1_mark, swiglu_oai_q8_1_mark -- the same two with the watch's mark: first NULL, none
// (the same code as the plain kernel). Else first = min(first, code_gate) where a gate value of
// the range holds a NaN or an Inf and min(first, code_up) where an up value does:
// strata_prefill.formats.nonfinite.mark of g's rows, then of u's rows, under those codes, exactly what two
// nonfinite.cu launches over the same rows would leave (the smaller code wins, in either
// order). Each lane tests the values it loaded inside the row (not the padding past n), before
// the biases (nonfinite.cuh's not_finite, on the bits); one vote a warp after its last task,
// one atomicMin a warp that saw one.

#include <cuda_fp16.h>
#include <stdint.h>
#include "strata_numerics.cuh"  // strata_swiglu, strata_swiglu_oai, q8_inv_scale, q8_round, q8_scale
#include "qformats.cuh"         // LAYOUT_D4, LAYOUT_DS4, LAYOUT_D2S6 (written from contract/q8_1.py)
#include "q8_1_block.cuh"       // q8_1_block, store_block, load4, for_each_block_task
#include "nonfinite.cuh"        // not_finite, mark_warp

#define SQ_WARPS 8


// Every kernel's body; kOai: gpt-oss's clamped SwiGLU with the expert biases (alpha, limit,
// rexp, bg, bu, ldb unused without it); kMark: the watch's mark (first, code_gate, code_up
// unused without it).
template <bool kOai, bool kMark>
__device__ __forceinline__ void swiglu_q8_1_body(
    const float* __restrict__ g, long long ldg, const float* __restrict__ u, long long ldu, int rows, int n,
    int layout, uint8_t* __restrict__ out, int R_total, float alpha, float limit, const int* __restrict__ rexp,
    const float* __restrict__ bg, const float* __restrict__ bu, long long ldb, unsigned long long* first,
    unsigned long long code_gate, unsigned long long code_up)
{
    const int lane = threadIdx.x & 31;
    unsigned int bad_g = 0, bad_u = 0;
    for_each_block_task<SQ_WARPS>(rows, ((n + 511) / 512) * 4, [&](int r, int kb) {
        const int c0 = kb * 128 + 4 * lane;
        float a[4], b[4];
        load4(g + (long long)r * ldg, c0, n, a);
        load4(u + (long long)r * ldu, c0, n, b);
        if constexpr (kMark) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned int in_row = c0 + i < n;
                bad_g |= in_row & not_finite(__float_as_uint(a[i]));
                bad_u |= in_row & not_finite(__float_as_uint(b[i]));
            }
        }
        if constexpr (kOai) {
            if (rexp != nullptr) {
                const long long e = rexp[r];
                float ba[4], bb[4];
                load4(bg + e * ldb, c0, n, ba);
                load4(bu + e * ldb, c0, n, bb);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    a[i] = __fadd_rn(a[i], ba[i]);
                    b[i] = __fadd_rn(b[i], bb[i]);
                }
            }
        }
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (kOai)
                v[i] = (c0 + i < n) ? strata_swiglu_oai(a[i], b[i], alpha, limit) : 0.0f;
            else
                v[i] = (c0 + i < n) ? strata_swiglu(a[i], b[i]) : 0.0f;
        }
        uint32_t hdr = 0;
        const uint32_t codes = q8_1_block(v[0], v[1], v[2], v[3], layout, lane, hdr);
        store_block(out, (long long)kb * R_total + r, lane, hdr, codes);
    });
    if constexpr (kMark) {  // a warp's tasks are whole-warp: every lane leaves the loop together
        mark_warp(first, bad_g, code_gate);
        mark_warp(first, bad_u, code_up);
    }
}

extern "C" __global__ void __launch_bounds__(32 * SQ_WARPS)
    swiglu_q8_1(const float* __restrict__ g, long long ldg, const float* __restrict__ u, long long ldu,
                int rows, int n, int layout, uint8_t* __restrict__ out, int R_total) {
    swiglu_q8_1_body<false, false>(g, ldg, u, ldu, rows, n, layout, out, R_total, 0.0f, 0.0f, nullptr, nullptr,
                                   nullptr, 0, nullptr, 0, 0);
}

extern "C" __global__ void __launch_bounds__(32 * SQ_WARPS)
    swiglu_oai_q8_1(const float* __restrict__ g, long long ldg, const float* __restrict__ u, long long ldu,
                    int rows, int n, int layout, uint8_t* __restrict__ out, int R_total, float alpha, float limit,
                    const int* __restrict__ rexp, const float* __restrict__ bg, const float* __restrict__ bu,
                    long long ldb) {
    swiglu_q8_1_body<true, false>(g, ldg, u, ldu, rows, n, layout, out, R_total, alpha, limit, rexp, bg, bu, ldb,
                                  nullptr, 0, 0);
}

extern "C" __global__ void __launch_bounds__(32 * SQ_WARPS)
    swiglu_q8_1_mark(const float* __restrict__ g, long long ldg, const float* __restrict__ u, long long ldu,
                     int rows, int n, int layout, uint8_t* __restrict__ out, int R_total, unsigned long long* first,
                     unsigned long long code_gate, unsigned long long code_up) {
    if (first == nullptr)
        swiglu_q8_1_body<false, false>(g, ldg, u, ldu, rows, n, layout, out, R_total, 0.0f, 0.0f, nullptr, nullptr,
                                       nullptr, 0, nullptr, 0, 0);
    else
        swiglu_q8_1_body<false, true>(g, ldg, u, ldu, rows, n, layout, out, R_total, 0.0f, 0.0f, nullptr, nullptr,
                                      nullptr, 0, first, code_gate, code_up);
}

extern "C" __global__ void __launch_bounds__(32 * SQ_WARPS)
    swiglu_oai_q8_1_mark(const float* __restrict__ g, long long ldg, const float* __restrict__ u, long long ldu,
                         int rows, int n, int layout, uint8_t* __restrict__ out, int R_total, float alpha,
                         float limit, const int* __restrict__ rexp, const float* __restrict__ bg,
                         const float* __restrict__ bu, long long ldb, unsigned long long* first,
                         unsigned long long code_gate, unsigned long long code_up) {
    if (first == nullptr)
        swiglu_q8_1_body<true, false>(g, ldg, u, ldu, rows, n, layout, out, R_total, alpha, limit, rexp, bg, bu,
                                      ldb, nullptr, 0, 0);
    else
        swiglu_q8_1_body<true, true>(g, ldg, u, ldu, rows, n, layout, out, R_total, alpha, limit, rexp, bg, bu,
                                     ldb, first, code_gate, code_up);
}
