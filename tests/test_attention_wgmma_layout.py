"""The warpgroup attention kernel's layout (fast/cuda/kernels/attention_wgmma.cu, attend_wgmma_hd*)
emulated in NumPy, lane by lane, and checked against the definitions it must keep
(strata_prefill.contract.numerics.tree_sum, plain integer dots). Runs without a GPU; the gate's
attention rows run the kernel itself. It covers what the kernel relies on:

- the key order: shared K row n holds the block's key sigma(n), so accumulator (nt, e) of lane
  quad tq holds key 16 (nt >> 1) + 4 tq + 2 (e & 1) + (nt & 1);
- the lsum tree in the kernel's order (nt with nt + 4, nt with nt + 2, lanes xor 2, xor 1, e,
  then nt 0 with nt 1) gives tree_sum's bits for any p;
- the operands: Q, K and the transposed V blocks (kernels/v_blocks.cuh, NumPy:
  strata_prefill.fast.cuda.attention.v_blocks_host) in the no-swizzle core-matrix layout, read
  as wgmma reads a K-major operand from its descriptor (start, LBO 128 between a row group's
  16-byte chunks, SBO between row groups of 8), and the P codes packed as the k32 A fragment.
  These must give the plain integer dots, and P.V's column n the dim the output store writes.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lsum_draws import block_p, block_p_over_magnitudes, generators

from strata_prefill.contract.numerics import tree_sum
from strata_prefill.fast.cuda.attention import v_blocks_host

F32 = np.float32
LANES = [(g, tq) for g in range(8) for tq in range(4)]  # lane = 4 g + tq
LBO = 128  # bytes between the 16-byte chunks (core matrices) of a row group


def sigma(n: int) -> int:
    """The block key that shared K row (and scale slot) n holds."""
    return 16 * (n >> 4) + 4 * ((n >> 1) & 3) + 2 * (n & 1) + ((n >> 3) & 1)


def key_of(nt: int, tq: int, e: int) -> int:
    """The block key of accumulator (nt, e) in lane quad tq (the kernel's key())."""
    return 16 * (nt >> 1) + 4 * tq + 2 * (e & 1) + (nt & 1)


def cm_off(row: int, chunk: int, rowb: int) -> int:
    """Byte of 16-byte chunk `chunk` of row `row` in the core-matrix layout of rows of rowb bytes."""
    return (row >> 3) * (8 * rowb) + chunk * LBO + (row & 7) * 16


def stage(rows: np.ndarray) -> np.ndarray:
    """Rows (any dtype, [R, rowb bytes]) laid out in shared memory as the kernel stages them."""
    raw = np.ascontiguousarray(rows).view(np.uint8)
    rowb = raw.shape[1]
    out = np.zeros(raw.size, np.uint8)
    for r in range(raw.shape[0]):
        for c in range(rowb // 16):
            o = cm_off(r, c, rowb)
            out[o:o + 16] = raw[r, 16 * c:16 * c + 16]
    return out


def operand(smem: np.ndarray, start: int, sbo: int, rows: int, kbytes: int) -> np.ndarray:
    """A K-major operand of `rows` rows and `kbytes` bytes of K as wgmma reads it from a
    no-swizzle descriptor: byte (m, k) at start + (m // 8) SBO + (k // 16) LBO + (m % 8) 16 + k % 16."""
    out = np.zeros((rows, kbytes), np.uint8)
    for m in range(rows):
        for k in range(kbytes):
            out[m, k] = smem[start + (m // 8) * sbo + (k // 16) * LBO + (m % 8) * 16 + k % 16]
    return out


def test_keys_are_one_to_one():
    assert sorted(sigma(n) for n in range(64)) == list(range(64))
    for nt in range(8):
        for tq in range(4):
            for e in range(4):  # accumulator column 8 nt + 2 tq + (e & 1) is shared row n
                assert key_of(nt, tq, e) == sigma(8 * nt + 2 * tq + (e & 1))


def wgmma_lsum(p: np.ndarray) -> np.float32:
    """lsum of one query row of 64 p values as the kernel adds them (row r0: e in 0, 1)."""
    s = {(tq, nt, e): F32(p[key_of(nt, tq, e)]) for tq in range(4) for nt in range(8) for e in range(2)}
    u = {(tq, nt, e): (s[tq, nt, e] + s[tq, nt + 4, e]) + (s[tq, nt + 2, e] + s[tq, nt + 6, e])
         for tq in range(4) for nt in range(2) for e in range(2)}
    u = {(tq, nt, e): u[tq, nt, e] + u[tq ^ 2, nt, e] for tq, nt, e in u}  # shfl xor 2
    u = {(tq, nt, e): u[tq, nt, e] + u[tq ^ 1, nt, e] for tq, nt, e in u}  # shfl xor 1
    ls = [(u[tq, 0, 0] + u[tq, 0, 1]) + (u[tq, 1, 0] + u[tq, 1, 1]) for tq in range(4)]
    assert all(x.tobytes() == ls[0].tobytes() for x in ls)  # every lane of the quad agrees
    return F32(ls[0])




@settings(max_examples=300, deadline=None)
@given(block_p)
def test_lsum_gives_tree_sum_bits(p):
    assert wgmma_lsum(p).tobytes() == tree_sum(p).tobytes()


@settings(max_examples=100, deadline=None)
@given(generators)
def test_lsum_gives_tree_sum_bits_over_magnitudes(rng):
    p = block_p_over_magnitudes(rng)
    assert wgmma_lsum(p).tobytes() == tree_sum(p).tobytes()


@settings(max_examples=25, deadline=None)
@given(generators, st.sampled_from([64, 128]))
def test_scores_from_the_core_matrix_layout(rng, hd):
    """Q.K: A = 64 Q rows, B = the block's K rows staged at row n = key sigma(n), both float16
    codes; k-step ks starts 256 ks bytes in (two chunks of 8 codes). Column n is key sigma(n)."""
    Q = rng.integers(-255, 256, (64, hd)).astype(np.float16)
    K = rng.integers(-511, 512, (64, hd)).astype(np.float16)
    sQ = stage(Q)
    sK = stage(np.stack([K[sigma(n)] for n in range(64)]))
    sbo = 8 * 2 * hd
    S = np.zeros((64, 64), np.int64)
    for ks in range(hd // 16):
        a = operand(sQ, 256 * ks, sbo, 64, 32).view(np.float16).astype(np.int64)
        b = operand(sK, 256 * ks, sbo, 64, 32).view(np.float16).astype(np.int64)
        S += a @ b.T
    want = Q.astype(np.int64) @ K.astype(np.int64).T
    assert np.array_equal(S, want[:, [sigma(n) for n in range(64)]])


def pack(codes: list) -> np.ndarray:
    return np.array(codes, np.int8)


def p_fragments(P: np.ndarray, w: int, ks: int) -> dict:
    """Lane (g, tq) of warp w: its k-step ks A fragment as the kernel packs it (pa[ks]) from its
    accumulators' P codes cb[nt][e] (rows 16 w + g for e < 2, + 8 for e >= 2)."""
    out = {}
    for g, tq in LANES:
        r0, r1 = 16 * w + g, 16 * w + g + 8
        cb = {(nt, e): P[r0 if e < 2 else r1, key_of(nt, tq, e)] for nt in range(8) for e in range(4)}
        out[g, tq] = [pack([cb[ks, 0], cb[ks, 1], cb[2 + ks, 0], cb[2 + ks, 1]]),
                      pack([cb[ks, 2], cb[ks, 3], cb[2 + ks, 2], cb[2 + ks, 3]]),
                      pack([cb[4 + ks, 0], cb[4 + ks, 1], cb[6 + ks, 0], cb[6 + ks, 1]]),
                      pack([cb[4 + ks, 2], cb[4 + ks, 3], cb[6 + ks, 2], cb[6 + ks, 3]])]
    return out


def a_matrix(frags_by_warp: list) -> np.ndarray:
    """The 64 x 32 A operand the four warps' register fragments hold (the m16n8k32 layout per
    warp: registers 0 / 1 rows g / g + 8 at k 4 tq .., 2 / 3 the same at k 16 + 4 tq ..)."""
    A = np.zeros((64, 32), np.int64)
    for w, frags in enumerate(frags_by_warp):
        for (g, tq), a in frags.items():
            A[16 * w + g, 4 * tq:4 * tq + 4], A[16 * w + g + 8, 4 * tq:4 * tq + 4] = a[0], a[1]
            A[16 * w + g, 16 + 4 * tq:20 + 4 * tq], A[16 * w + g + 8, 16 + 4 * tq:20 + 4 * tq] = a[2], a[3]
    return A


@settings(max_examples=25, deadline=None)
@given(generators, st.sampled_from([64, 128]))
def test_pv_from_the_transposed_blocks(rng, hd):
    """P.V: A = the P codes from registers, B = block 0 of v_blocks_host (hd rows of 64 key
    bytes) staged in the core-matrix layout, k-step ks at byte 256 ks; column n is dim
    16 (n >> 4) + 2 (n & 7) + ((n >> 3) & 1), which the store reads back as tile 2 G + eo."""
    P = rng.integers(0, 128, (64, 64)).astype(np.int8)
    V = rng.integers(-127, 128, (1, 64, hd)).astype(np.int8)
    sV = stage(v_blocks_host(V)[0, 0])
    acc = np.zeros((64, hd), np.int64)
    for ks in range(2):
        A = a_matrix([p_fragments(P, w, ks) for w in range(4)])
        B = operand(sV, 256 * ks, 8 * 64, hd, 32).view(np.int8).astype(np.int64)
        acc += A @ B.T
    want = P.astype(np.int64) @ V[0].astype(np.int64)
    dim = [16 * (n >> 4) + 2 * (n & 7) + ((n >> 3) & 1) for n in range(hd)]
    assert np.array_equal(acc, want[:, dim])
    # the store: lane tq's output dims 16 gr + 4 tq + k are tile 2 gr + (k & 1), element k >> 1
    for gr in range(hd // 16):
        for tq in range(4):
            for k in range(4):
                i, e = 2 * gr + (k & 1), k >> 1
                assert dim[8 * i + 2 * tq + e] == 16 * gr + 4 * tq + k
