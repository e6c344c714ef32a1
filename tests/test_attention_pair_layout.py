"""The pair attention kernel's layout (fast/cuda/kernels/attention_pair.cu, attend_pair_hd*)
emulated in NumPy, lane by lane, and checked against the definitions it must keep
(strata_prefill.contract.numerics.tree_sum, plain integer dots). Runs without a GPU. It covers the three
reorderings the kernel relies on:

- the key split: warp half h of a pair holds the keys kappa = 2*lambda + h, where lambda =
  8 nt + 2 tq + (e & 1) is its accumulator (nt, e) in lane (g, tq);
- the lsum tree in the kernel's order: in-thread nt pairs, lanes xor 2, xor 1, the e pair, then
  half 0 + half 1. It must give tree_sum's bits for any p;
- the fragments. K and V rows land in shared memory at row 32 (kappa & 1) + (kappa >> 1).
  Scores take K through ldmatrix. P.V takes P as each half's packed A fragment and V through
  ldmatrix.trans plus byte permutes (the even and odd dims of a 16-dim group), or (PAIR_VT,
  the default) plain ldmatrix of the cache's transposed V blocks (kernels/v_blocks.cuh, whose
  NumPy definition is strata_prefill.fast.cuda.attention.v_blocks_host) staged at a pitch of 80 bytes. These
  must give the plain integer dots, every key once.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from lsum_draws import block_p, block_p_over_magnitudes, generators

from strata_prefill.fast.cuda.attention import v_blocks_host
from strata_prefill.contract.numerics import tree_sum

F32 = np.float32
LANES = [(g, tq) for g in range(8) for tq in range(4)]  # lane = 4 g + tq


def lam(nt: int, tq: int, e: int) -> int:
    """Accumulator (nt, e) of lane tq: its lambda (the warp's key index 0..31)."""
    return 8 * nt + 2 * tq + (e & 1)


def kappa(lmb: int, h: int) -> int:
    """The block key (0..63) of warp half h's lambda."""
    return 2 * lmb + h


def smem_row(kap: int) -> int:
    """Shared-memory row of block key kappa (K and V alike)."""
    return 32 * (kap & 1) + (kap >> 1)


def test_rows_and_keys_are_one_to_one():
    assert sorted(smem_row(k) for k in range(64)) == list(range(64))
    assert sorted(kappa(lam(nt, tq, e), h) for h in range(2) for nt in range(4) for tq in range(4)
                  for e in range(2)) == list(range(64))
    for h in range(2):  # a warp's keys are its 32 consecutive rows, lambda in order
        assert [smem_row(kappa(m, h)) for m in range(32)] == list(range(32 * h, 32 * h + 32))


def pair_lsum(p: np.ndarray) -> np.float32:
    """lsum of one query row of 64 p values as the kernel adds them."""
    halves = []
    for h in range(2):
        # s[nt][e] of lane tq (one row: e in 0, 1)
        s = {(tq, nt, e): F32(p[kappa(lam(nt, tq, e), h)]) for tq in range(4) for nt in range(4) for e in range(2)}
        u = {(tq, e): (s[tq, 0, e] + s[tq, 2, e]) + (s[tq, 1, e] + s[tq, 3, e]) for tq in range(4) for e in range(2)}
        u = {(tq, e): u[tq, e] + u[tq ^ 2, e] for tq in range(4) for e in range(2)}  # shfl xor 2
        u = {(tq, e): u[tq, e] + u[tq ^ 1, e] for tq in range(4) for e in range(2)}  # shfl xor 1
        ls = [u[tq, 0] + u[tq, 1] for tq in range(4)]
        assert all(x.tobytes() == ls[0].tobytes() for x in ls)  # every lane of the quad agrees
        halves.append(ls[0])
    return F32(halves[0] + halves[1])




@settings(max_examples=300, deadline=None)
@given(block_p)
def test_lsum_halves_give_tree_sum_bits(p):
    assert pair_lsum(p).tobytes() == tree_sum(p).tobytes()


@settings(max_examples=100, deadline=None)
@given(generators)
def test_lsum_halves_give_tree_sum_bits_over_magnitudes(rng):
    p = block_p_over_magnitudes(rng)
    assert pair_lsum(p).tobytes() == tree_sum(p).tobytes()


def ldsm(mats: list[np.ndarray], trans: bool) -> list[dict]:
    """ldmatrix .x4 of four 8 x 8 b16 matrices (each uint16 [8, 8]): per matrix, lane (g, tq)'s
    32-bit word as 4 bytes. Plain: row g, elements 2tq, 2tq + 1; .trans: elements (2tq, g) and
    (2tq + 1, g)."""
    out = []
    for m in mats:
        words = {}
        for g, tq in LANES:
            lo, hi = (m[2 * tq, g], m[2 * tq + 1, g]) if trans else (m[g, 2 * tq], m[g, 2 * tq + 1])
            words[g, tq] = np.array([lo, hi], np.uint16).view(np.int8)
        out.append(words)
    return out


def b16_matrix(rows: np.ndarray, byte0: int) -> np.ndarray:
    """The 8 x 8 b16 matrix of 8 shared-memory rows (int8 [8, >= byte0 + 16]) at byte0."""
    return np.ascontiguousarray(rows[:, byte0:byte0 + 16]).view(np.uint16)


def prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    pool = np.concatenate([a, b])
    return np.array([pool[(sel >> (4 * i)) & 0xF] for i in range(4)], np.int8)


def mma_k32(a_frag: dict, b_frag: dict) -> np.ndarray:
    """m16n8k32 s8 from lane fragments: A regs (row g / g + 8, k 4tq.. and 16 + 4tq..), B regs
    (column g, k 4tq.. and 16 + 4tq..). Returns C int32 [16, 8]."""
    A = np.zeros((16, 32), np.int64)
    B = np.zeros((32, 8), np.int64)
    for g, tq in LANES:
        a = a_frag[g, tq]
        A[g, 4 * tq:4 * tq + 4], A[g + 8, 4 * tq:4 * tq + 4] = a[0], a[1]
        A[g, 16 + 4 * tq:20 + 4 * tq], A[g + 8, 16 + 4 * tq:20 + 4 * tq] = a[2], a[3]
        b = b_frag[g, tq]
        B[4 * tq:4 * tq + 4, g], B[16 + 4 * tq:20 + 4 * tq, g] = b[0], b[1]
    return A @ B


@settings(max_examples=40, deadline=None)
@given(generators, st.sampled_from([64, 128]))
def test_fragments_give_the_plain_dots(rng, hd):
    P = rng.integers(-127, 128, (16, 64)).astype(np.int8)   # P codes of 16 queries x 64 keys
    Q = rng.integers(-127, 128, (16, hd)).astype(np.int8)   # Q codes
    K = rng.integers(-127, 128, (64, hd)).astype(np.int8)   # the block's K and V codes by key
    V = rng.integers(-127, 128, (64, hd)).astype(np.int8)
    sK = np.zeros_like(K)
    sV = np.zeros_like(V)
    for k in range(64):
        sK[smem_row(k)], sV[smem_row(k)] = K[k], V[k]

    # scores of half h: B from ldmatrix .x4 of rows 32h + 8nt + r at bytes 64 bb + 16 j, matrix j
    # being block 2 bb + j / 2, register j % 2
    for h in range(2):
        for nt in range(4):
            kb = {}
            for bb in range(hd // 64):
                m = ldsm([b16_matrix(sK[32 * h + 8 * nt:32 * h + 8 * nt + 8], 64 * bb + 16 * j) for j in range(4)],
                         trans=False)
                for j in range(4):
                    kb[2 * bb + j // 2, j % 2] = m[j]
            acc = np.zeros((16, 8), np.int64)
            for b in range(hd // 32):
                a = {(g, tq): [Q[g, 32 * b + 4 * tq:32 * b + 4 * tq + 4], Q[g + 8, 32 * b + 4 * tq:32 * b + 4 * tq + 4],
                               Q[g, 32 * b + 16 + 4 * tq:32 * b + 20 + 4 * tq],
                               Q[g + 8, 32 * b + 16 + 4 * tq:32 * b + 20 + 4 * tq]] for g, tq in LANES}
                acc += mma_k32(a, {lane: (kb[b, 0][lane], kb[b, 1][lane]) for lane in LANES})
            for n in range(8):  # column n is lambda 8 nt + n
                want = Q.astype(np.int64) @ K[kappa(8 * nt + n, h)].astype(np.int64)
                assert np.array_equal(acc[:, n], want)

    # P.V of the dims of half hh: A = half ks's packed P codes, B = ldmatrix.trans of rows
    # 32 ks + 8 j + r at byte 16 G, then the even / odd dim permutes
    for hh in range(2):
        for gr in range(hd // 32):
            G = hh * (hd // 32) + gr
            acc = {0: np.zeros((16, 8), np.int64), 1: np.zeros((16, 8), np.int64)}
            for ks in range(2):
                a = p_frag(P, ks)
                R = ldsm([b16_matrix(sV[32 * ks + 8 * j:32 * ks + 8 * j + 8], 16 * G) for j in range(4)], trans=True)
                for eo, sel in ((0, 0x6420), (1, 0x7531)):
                    b = {lane: (prmt(R[0][lane], R[1][lane], sel), prmt(R[2][lane], R[3][lane], sel)) for lane in LANES}
                    acc[eo] += mma_k32(a, b)
            for eo in range(2):
                for n in range(8):  # column n of the even / odd tile is dim 16 G + 2 n + eo
                    d = 16 * G + 2 * n + eo
                    assert np.array_equal(acc[eo][:, n], P.astype(np.int64) @ V[:, d].astype(np.int64))


def p_frag(P: np.ndarray, ks: int) -> dict:
    """Lane (g, tq)'s packed P A fragment of k-step ks (the keys of half ks)."""
    a = {}
    for g, tq in LANES:
        code = lambda row, nt0: np.array([P[row, kappa(lam(nt0 + (i >> 1), tq, i & 1), ks)]
                                          for i in range(4)], np.int8)
        a[g, tq] = [code(g, 0), code(g + 8, 0), code(g, 2), code(g + 8, 2)]
    return a


@settings(max_examples=40, deadline=None)
@given(generators, st.sampled_from([64, 128]), st.integers(1, 3))
def test_transposed_v_blocks_give_the_plain_dots(rng, hd, n_blocks):
    """PAIR_VT: block c of v_blocks_host(v_codes), staged as hd rows of 64 bytes, read by
    ldmatrix .x4 (lane L: row 16 G + 8 ((L >> 4) & 1) + (L & 7), byte 32 ks + 16 ((L >> 3) & 1)),
    registers (R0, R1) the even-dim tile's B and (R2, R3) the odd one's: P.V of every block."""
    cap = 64 * n_blocks - int(rng.integers(0, 40))
    V = rng.integers(-127, 128, (1, cap, hd)).astype(np.int8)
    vt = v_blocks_host(V)
    assert vt.shape == (1, n_blocks, hd, 64)
    for c in range(n_blocks):
        keys = min(64, cap - 64 * c)
        P = rng.integers(-127, 128, (16, 64)).astype(np.int8)
        P[:, keys:] = 0  # keys past the cache: P codes 0 (invalid), whatever v_t holds there
        Vb = np.zeros((64, hd), np.int8)
        Vb[:keys] = V[0, 64 * c:64 * c + keys]
        rows = vt[0, c]  # [hd, 64], row vt_row(d)
        for G in range(hd // 16):
            acc = {0: np.zeros((16, 8), np.int64), 1: np.zeros((16, 8), np.int64)}
            for ks in range(2):
                mats = [b16_matrix(rows[16 * G + 8 * (m >> 1):16 * G + 8 * (m >> 1) + 8], 32 * ks + 16 * (m & 1))
                        for m in range(4)]
                R = ldsm(mats, trans=False)
                for eo in range(2):
                    acc[eo] += mma_k32(p_frag(P, ks), {lane: (R[2 * eo][lane], R[2 * eo + 1][lane]) for lane in LANES})
            for eo in range(2):
                for n in range(8):  # column n of the even / odd tile is dim 16 G + 2 n + eo, as before
                    d = 16 * G + 2 * n + eo
                    assert np.array_equal(acc[eo][:, n], P.astype(np.int64) @ Vb[:, d].astype(np.int64))


def test_transposed_v_blocks_hold_every_code_once():
    V = np.arange(2 * 128 * 64, dtype=np.int64).reshape(2, 128, 64)  # distinct "codes" (as int64)
    vt = v_blocks_host(V.astype(np.int8))  # the dtype check; values below from an index map
    idx = v_blocks_host((V % 251 - 125).astype(np.int8))
    assert vt.shape == idx.shape == (2, 2, 64, 64)
    # a permutation per block: the multiset of each block's codes is the block's
    for h in range(2):
        for c in range(2):
            assert sorted(idx[h, c].ravel().tolist()) == sorted((V[h, 64 * c:64 * c + 64] % 251 - 125).ravel().tolist())
