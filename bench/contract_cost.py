#!/usr/bin/env python3
"""What the numerics contract's per-32 scale blocks cost in speed, and what a coarser block
would cost in accuracy: the measurements behind the contract changes of docs/performance.md
("Proposed contract changes"), and what attention contract v2 changed. NumPy only; runs
anywhere.

    python3 -m bench.contract_cost [--tokens 256] [--seed 0]

1. The MoE product: IQ2_XS expert weights (strata gate shape, 640 x 2560) times activations
   quantized to int8 with one scale per 32 values (the contract's q8_1 D4 layout) or per 128
   values (the proposal: one scale per q8_1 block). Error = relative RMS of the product
   against the same weights times the float activations (float64), so only the activation
   quantization differs.
2. Attention scores: Q and K quantized to int8 with one scale per 32 values (the first
   attention contract) or one per head row of 128 (the proposal), scores against float64
   q.k / sqrt(128); and the attention output against float64 attention over 1,024 keys.
3. The exponential: the contract's degree-7 polynomial (strata_prefill.contract.numerics.exp) against a 64-entry
   table of 2^(j/64) (float64, rounded) times a degree-3 polynomial (16 FMA-pipe instructions
   instead of 23 in attention's p), in ulps of float32 against float64, on every --exp-step-th
   float in [-87, 0].

4. Attention contract v2, adopted: the definition's own distance to a float64 forward,
   before (bench/attention_contract_v1.py, the retired per-32 int8 contract) and after
   (strata_prefill.contract.attention.attend, through a KVCache), on the same q, k, v (one KV
   head, --tokens queries at the last positions of the 1,024 keys): the scores (from each
   definition's quantized Q and K, in natural units) and the attention output, relative RMS;
   and exp2c's ulps against float64 2^x on every --exp-step-th float in [-125, 0], next to
   exp's on [-87, 0].

Activations are random normal with a few outlier channels (x12), as an RMSNorm output of a
real model has; keys and queries the same. Prints tables.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from gguf import GGMLQuantizationType as QT

import math

from bench import attention_contract_v1
from strata_prefill.contract import attention as attention_v2
from strata_prefill.contract import numerics, quants
from strata_prefill.contract.blockquant import quantize_blocks


def outlier_rows(rng, rows: int, n: int) -> np.ndarray:
    x = rng.standard_normal((rows, n)).astype(np.float32)
    cols = rng.choice(n, max(1, n // 256), replace=False)
    x[:, cols] *= np.float32(12.0)
    return x


def dequant(x: np.ndarray, block: int) -> np.ndarray:
    q, d = quantize_blocks(x, block)
    return (q.astype(np.float64).reshape(*x.shape[:-1], -1, block) * d[..., None].astype(np.float64)).reshape(x.shape)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b ** 2)))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ k.T / np.sqrt(q.shape[-1])
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


F32 = np.float32


def exp_table64(x: np.ndarray) -> np.ndarray:
    """The proposed exponential, float32 step by step: n = rint(x * 64 / ln 2); r = (x - n * hi)
    - n * lo (hi: ln 2 / 64 to 11 bits, so n * hi is exact); p = ((r / 6 + 1/2) r + 1) r + 1;
    y = (p * T[n mod 64]) * 2^(n div 64); 0 below -87."""
    x = x.astype(np.float32)
    c = math.log(2) / 64
    m, e = math.frexp(c)
    hi = F32(math.ldexp(round(m * 2 ** 11), e - 11))
    lo = F32(c - float(hi))
    n = np.rint(x * F32(64 / math.log(2)))
    r = (x - n * hi) - n * lo
    p = F32(1 / 6)
    for coef in (F32(0.5), F32(1.0), F32(1.0)):
        p = p * r + coef
    ni = n.astype(np.int64)
    j = ni & 63
    table = np.array([2.0 ** (i / 64) for i in range(64)]).astype(np.float32)
    pow2 = ((((ni - j) // 64) + 127).astype(np.int32) << 23).view(np.float32)
    y = (p * table[j]).astype(np.float32) * pow2
    return np.where(x < F32(-87.0), F32(0.0), y).astype(np.float32)


def ulps(y: np.ndarray, x: np.ndarray, base2: bool = False) -> np.ndarray:
    ref = (np.exp2 if base2 else np.exp)(x.astype(np.float64))
    return np.abs(y.astype(np.float64) - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)


def contract_scores(q: np.ndarray, k: np.ndarray, v2: bool) -> np.ndarray:
    """q.k / sqrt(hd) in float64 from each contract's quantized Q and K (v1: int8 blocks of 32;
    v2: per row at 255 and 511): the quantization's part of the score error."""
    if v2:
        qc, qd = attention_v2.quantize_rows(q, 255)
        kc, kd = attention_v2.quantize_rows(k, 511)
        qf = qc.astype(np.float64) * qd[:, None].astype(np.float64)
        kf = kc.astype(np.float64) * kd[:, None].astype(np.float64)
    else:
        qf, kf = dequant(q, 32), dequant(k, 32)
    return qf @ kf.T / np.sqrt(q.shape[-1])


def contract_output(mod, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A contract's attention output for queries at the last positions over all the keys."""
    n_keys, hd = k.shape
    cache = mod.KVCache(1, 1, hd)
    cache.write(0, np.arange(n_keys), k[:, None, :], v[:, None, :])
    pos = np.arange(n_keys - q.shape[0], n_keys)
    return mod.attend(cache, 0, q[:, None, :], pos)[:, 0, :]


def causal(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 attention of queries at the last positions (each sees keys up to its own)."""
    n_tok, n_keys = q.shape[0], k.shape[0]
    s = q @ k.T / np.sqrt(q.shape[-1])
    s[np.arange(n_keys)[None, :] > np.arange(n_keys - n_tok, n_keys)[:, None]] = -np.inf
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def attention_v1_v2(tokens: int, seed: int, hd: int = 128, n_keys: int = 1024) -> dict:
    """{"v1"|"v2": (scores relative RMS, output relative RMS)} against float64 (section 4), on
    one draw of outlier q and k and normal v from ``seed``."""
    rng = np.random.default_rng(seed)
    q, k = outlier_rows(rng, tokens, hd), outlier_rows(rng, n_keys, hd)
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s_exact = q64 @ k64.T / np.sqrt(hd)
    o_exact = causal(q64, k64, v64)
    return {name: (rel(contract_scores(q, k, name == "v2"), s_exact),
                   rel(contract_output(mod, q, k, v).astype(np.float64), o_exact))
            for name, mod in (("v1", attention_contract_v1), ("v2", attention_v2))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exp-step", type=int, default=53, help="every n-th float of [-87, 0] for the exponential")
    ap.add_argument("--attention-draws", type=int, default=5,
                    help="draws of q, k, v (seeds seed .. seed + n - 1) for the v1 -> v2 attention table")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    N, K = 640, 2560
    raw = quants.random_blocks(QT.IQ2_XS, N * K // 256, rng).reshape(N, -1)
    w = quants.dequantize(QT.IQ2_XS, raw).reshape(N, K).astype(np.float64)
    x = outlier_rows(rng, args.tokens, K)
    exact = x.astype(np.float64) @ w.T
    moe = {b: rel(dequant(x, b) @ w.T, exact) for b in (32, 128)}

    hd, n_keys = 128, 1024
    q = outlier_rows(rng, args.tokens, hd)
    k = outlier_rows(rng, n_keys, hd)
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    s_exact = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(hd)
    o_exact = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    att = {}
    for b in (32, 128):
        qd, kd = dequant(q, b), dequant(k, b)
        att[b] = (rel(qd @ kd.T / np.sqrt(hd), s_exact), rel(attention(qd, kd, v.astype(np.float64)), o_exact))

    xs = np.arange(0x80000000, 0xC2AE0000, args.exp_step, dtype=np.uint64).astype(np.uint32).view(np.float32)
    e_poly, e_table = ulps(numerics.exp(xs), xs), ulps(exp_table64(xs), xs)
    x2 = np.arange(0x80000000, 0xC2FA0001, args.exp_step, dtype=np.uint64).astype(np.uint32).view(np.float32)
    e2 = ulps(numerics.exp2c(x2), x2, base2=True)
    draws = [(args.seed + i, attention_v1_v2(args.tokens, args.seed + i)) for i in range(args.attention_draws)]

    print(f"{args.tokens} tokens, seed {args.seed}; relative RMS error against float64")
    print("| what | scale per 32 values (contract) | per 128 values (proposal) | ratio |")
    print("|---|---|---|---|")
    print(f"| MoE product, IQ2_XS 640 x 2560, activation quantization | {moe[32]:.2e} | {moe[128]:.2e} | "
          f"{moe[128] / moe[32]:.2f}x |")
    print(f"| attention scores, Q and K quantization | {att[32][0]:.2e} | {att[128][0]:.2e} | "
          f"{att[128][0] / att[32][0]:.2f}x |")
    print(f"| attention output (1,024 keys) | {att[32][1]:.2e} | {att[128][1]:.2e} | "
          f"{att[128][1] / att[32][1]:.2f}x |")
    print(f"\nexponential on {xs.size:,} floats in [-87, 0], ulps against float64")
    print("| form | max | mean |")
    print("|---|---|---|")
    print(f"| degree-7 polynomial (contract) | {e_poly.max():.3f} | {e_poly.mean():.3f} |")
    print(f"| 64-entry table x degree-3 polynomial (proposal) | {e_table.max():.3f} | {e_table.mean():.3f} |")
    print(f"| exp2c, base 2, degree-4 fma polynomial (attention contract v2), {x2.size:,} floats in [-125, 0] | "
          f"{e2.max():.3f} | {e2.mean():.3f} |")
    print(f"\nattention contract v1 -> v2 ({args.tokens} queries at the last positions of 1,024 keys, "
          "head_dim 128, one draw of q, k, v per seed); relative RMS against float64")
    print("| draw | scores v1 | scores v2 | ratio | output v1 | output v2 | ratio |")
    print("|---|---|---|---|---|---|---|")
    for seed, r in draws + [("mean", {n: tuple(np.mean([d[n][i] for _, d in draws]) for i in (0, 1))
                                     for n in ("v1", "v2")})]:
        print(f"| {seed} | {r['v1'][0]:.2e} | {r['v2'][0]:.2e} | {r['v2'][0] / r['v1'][0]:.2f}x "
              f"| {r['v1'][1]:.2e} | {r['v2'][1]:.2e} | {r['v2'][1] / r['v1'][1]:.2f}x |")
    print("v1: int8 Q and K per 32 values, exp, P codes by roundf, O = O * alpha + ob "
          "(bench/attention_contract_v1.py); v2: Q per row at 255, K at 511, base 2 with exp2c, "
          "P codes by rint, O by one fma (strata_prefill.contract.attention)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
