// The one parameter of mmq.cu's kernels, passed by value: its fields, their order and so their
// offsets are written here alone. fast/cuda/signatures.py reads this declaration (the fields,
// C's natural alignment, the tail padding) and fast/cuda/products.py packs the struct's bytes
// from the fields by name (_mmq_args); tests/test_mmq_args.py holds the layout it computes
// equal to nvcc's. What each field means: mmq.cu's first comment ("Launch").
// Include stdint.h and the CUDA vector types (int4) first.
#ifndef STRATA_MMQ_ARGS_CUH
#define STRATA_MMQ_ARGS_CUH

struct MmqArgs {
    const uint8_t* w;     // the weights (expert q's matrix at w + q * w_stride, or per tile)
    long long w_stride;   // bytes between the experts' matrices (bounds form)
    int N, K;             // weight rows, values a row
    const uint8_t* act;   // q8_1 activation rows (R_total of them)
    int R_total;
    const int* bounds;    // [n_exp][2] row bounds (bounds form; unused with tiles)
    int n_exp;
    float* out;           // float32 [R_total, ldo]
    long long ldo;
    const uint8_t* tab;   // the table buffer (sign masks, IQ grids)
    int tile_rows;        // cap on activation rows a CTA tile (bounds form)
    long long w_pair;     // byte offset of the second matrix of a pair (blockIdx.y == 1)
    float* out2;          // the second matrix's products (no __restrict__: may be out)
    const int4* tiles;    // the tile list (NULL: the bounds form)
    int n_tiles;
};

#endif
