"""Ours beside torch on the same shapes, in one run: the grouped MMQ against torch._int_mm and
the int8 attention against torch's SDPA (bf16). Skipped where torch or the GPU is missing.

    pytest bench/test_bench_torch_side_cuda.py        (or: python3 -m bench.test_bench_torch_side_cuda)

Each benchmark times ours with pytest-benchmark (CUDA events, bench/conftest.py) and torch's
with the same events, warm-up and rounds on torch's stream; extra_info holds torch's median and
ratio_vs_torch = ours / torch (below 1: ours is faster), and a table of the ratios prints last.
Shapes (strata preset):
- grouped gate/up at 8K tokens: 81,920 rows over 512 experts; ours: one launch per group of 16
  experts and matrix (Q8_0 and IQ2_XS weights); torch: one _int_mm per expert of its rows
  (int8 codes of the same routing) by an int8 2560 x 1280 matrix (gate | up).
- in-place gate/up at 1K and 8K tokens: ours one tile-list launch (gate and up) over a buffer
  of all 512 experts (the in_place walk); torch as above.
- dense 1,600 and 6,400 rows by 2560 -> 1280: ours mmq_dense (Q8_0), torch one _int_mm.
- attention, 32 heads over 4 KV heads, head_dim 128, causal, 4K and 32K tokens; ours over the
  int8 cache, torch scaled_dot_product_attention in bf16 (enable_gqa where torch has it, else
  the KV heads repeated once, untimed).
torch's int8 products stop at int32 sums and its SDPA computes in bf16: the comparison is of
time on equal shapes, not of equal work per value.
"""
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gguf import GGMLQuantizationType as QT  # noqa: E402

from bench.gpu_shapes import N_EMBD, N_EXPERT, N_FF, N_GROUPS, Routing  # noqa: E402
from bench.gpu_timing import TorchClock, measure  # noqa: E402
from strata_prefill.fast.cuda import products, runtime  # noqa: E402
from strata_prefill.contract import q8_1, quants  # noqa: E402
from strata_prefill.contract.constants import GROUP_TAIL_BYTES, MMQ_GROUP  # noqa: E402
from strata_prefill.verify.cases import kernel_rows  # noqa: E402

pytestmark = pytest.mark.gpu

ROUNDS, WARMUP = 5, 1
INT_MM_MIN_ROWS = 17  # torch._int_mm wants more than 16 rows: fewer are padded (and counted)


def q8_act(dev, rows_src, tokens, K, qt):
    """A q8_1 buffer of len(rows_src) rows of random tokens in qt's layout."""
    x = dev.upload(np.random.default_rng(tokens).standard_normal((tokens, K), dtype=np.float32))
    act = dev.empty((q8_1.buffer_nbytes(len(rows_src), K),), np.uint8)
    products.quantize_gather(dev, x, dev.upload(rows_src), n_rows=len(rows_src), K=K, layout=q8_1.layout_for(qt),
                             out=act)
    return act


def weights(qt, n_mat, N, K, what):
    vals, _ = quants.block_size(qt)
    blocks = quants.random_blocks(qt, n_mat * N * K // vals, np.random.default_rng(int(qt))).reshape(-1)
    return runtime.to_device(np.concatenate([blocks, np.zeros(GROUP_TAIL_BYTES, np.uint8)]), what)


@pytest.mark.parametrize("tname", ["Q8_0", "IQ2_XS"])
def test_grouped_gate_up(gpu_benchmark, torch_ratio, cuda_device, tname):
    dev, qt, tokens, K, N = cuda_device, QT[tname], 8192, N_EMBD, N_FF
    r = Routing(tokens)
    mat = quants.row_bytes(qt, K) * N
    w = weights(qt, 2 * MMQ_GROUP, N, K, "group weights")  # one group's buffer, reused by every group
    act = q8_act(dev, r.src, tokens, K, qt)
    bounds = dev.upload(r.bounds.reshape(-1))
    outs = [dev.empty((r.rows, N), np.float32) for _ in range(2)]

    def ours():
        for g in range(N_GROUPS):
            b = int(bounds.gpudata) + g * MMQ_GROUP * 8
            for j, out in enumerate(outs):
                products.mmq_group(dev, qt, int(w) + j * mat, w_stride=2 * mat, N=N, K=K, act=act, R_total=r.rows,
                                   bounds=b, n_exp=MMQ_GROUP, out=out, rows=int(r.group_rows[g]))

    t_ours = gpu_benchmark(ours, stream=dev.stream, counters=dev.counters, rounds=ROUNDS, warmup_rounds=WARMUP,
                           ops=4 * r.rows * N * K, tokens=tokens, rows=r.rows, type=tname)

    theirs, padded = torch_per_expert(r, K, 2 * N, seed=0)
    torch_ratio(t_ours, measure(TorchClock(), theirs, ROUNDS, WARMUP), torch_launches=N_EXPERT,
                torch_padded_experts=padded)


def torch_per_expert(r, K, N, seed):
    """torch's side of a grouped product: one _int_mm per expert of its rows (experts with
    fewer than INT_MM_MIN_ROWS rows padded to that many), int8 codes of the same routing."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randint(-127, 128, (r.rows, K), dtype=torch.int8, device="cuda", generator=gen)
    wt = torch.randint(-127, 128, (N_EXPERT, N, K), dtype=torch.int8, device="cuda", generator=gen)
    spans, padded = [], 0
    for e in range(N_EXPERT):
        lo, hi = r.expert_rows(e)
        if hi - lo < INT_MM_MIN_ROWS:
            padded += 1
            lo = min(lo, r.rows - INT_MM_MIN_ROWS)
            hi = lo + INT_MM_MIN_ROWS
        spans.append((lo, hi))

    def theirs():
        for e, (lo, hi) in enumerate(spans):
            torch._int_mm(a[lo:hi], wt[e].t())

    return theirs, padded


@pytest.mark.parametrize("tokens", [1024, 8192])
@pytest.mark.parametrize("tname", ["Q8_0", "IQ2_XS"])
def test_in_place_gate_up(gpu_benchmark, torch_ratio, cuda_device, tname, tokens):
    """The walk's in-place form: every routed expert's gate and up read where it lies in one
    buffer of all 512 experts (as the expert cache holds them), one tile-list launch."""
    dev, qt, K, N = cuda_device, QT[tname], N_EMBD, N_FF
    r = Routing(tokens)
    mat = quants.row_bytes(qt, K) * N
    w = weights(qt, 2 * N_EXPERT, N, K, "expert cache (gate | up)")
    act = q8_act(dev, r.src, tokens, K, qt)
    order = np.nonzero(r.counts)[0]
    bounds = np.stack([r.offsets[order], r.offsets[order + 1]], axis=1)
    mean = r.rows / len(order)
    tiles = products.row_tiles(bounds, order.astype(np.int64) * 2 * mat,
                               products.tile_rows_for(products.tile_config(mean)))
    tiles_dev = dev.upload(tiles)
    outs = [dev.empty((r.rows, N), np.float32) for _ in range(2)]

    def ours():
        products.mmq_tiles(dev, qt, w, N=N, K=K, act=act, R_total=r.rows, tiles=tiles_dev, n_tiles=len(tiles),
                           out=outs[0], tile_rows_mean=mean, pair=(mat, outs[1]))

    t_ours = gpu_benchmark(ours, stream=dev.stream, counters=dev.counters, rounds=ROUNDS, warmup_rounds=WARMUP,
                           ops=4 * r.rows * N * K, tokens=tokens, rows=r.rows, type=tname)
    theirs, padded = torch_per_expert(r, K, 2 * N, seed=3)
    torch_ratio(t_ours, measure(TorchClock(), theirs, ROUNDS, WARMUP), torch_launches=N_EXPERT,
                torch_padded_experts=padded)


@pytest.mark.parametrize("rows", [1600, 6400])
def test_dense(gpu_benchmark, torch_ratio, cuda_device, rows):
    dev, qt, K, N = cuda_device, QT.Q8_0, N_EMBD, 2 * N_FF
    w = weights(qt, 1, N, K, "dense weight")
    act = q8_act(dev, np.arange(rows, dtype=np.int32), rows, K, qt)
    out = dev.empty((rows, N), np.float32)

    def ours():
        products.mmq_dense(dev, qt, w, N=N, K=K, act=act, R=rows, out=out)

    t_ours = gpu_benchmark(ours, stream=dev.stream, counters=dev.counters, rounds=ROUNDS, warmup_rounds=WARMUP,
                           ops=2 * rows * N * K, rows=rows, N=N, K=K, type=qt.name)
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randint(-127, 128, (rows, K), dtype=torch.int8, device="cuda", generator=gen)
    wt = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda", generator=gen)
    torch_ratio(t_ours, measure(TorchClock(), lambda: torch._int_mm(a, wt.t()), ROUNDS, WARMUP))


def sdpa_call(q, k, v):
    """torch's causal SDPA over grouped KV heads: enable_gqa where this torch has it, else the
    KV heads repeated here (outside the timed call)."""
    F = torch.nn.functional
    try:
        F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], is_causal=True, enable_gqa=True)
    except TypeError:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)), False
    return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)), True


@pytest.mark.parametrize("case", kernel_rows("attention", timed=True), ids=lambda c: c.id)
def test_attention(gpu_benchmark, torch_ratio, attention_case, cuda_device, case):
    """The timed "attention" rows of verify/cases.py (a prefill from position 0)."""
    H, HKV, HD = case.shape["n_head"], case.shape["n_kv"], case.shape["hd"]
    tokens = len(case.shape["positions"])
    ours, _ = attention_case(tokens, case.shape)
    t_ours = gpu_benchmark(ours, stream=cuda_device.stream, counters=cuda_device.counters, rounds=ROUNDS,
                           warmup_rounds=WARMUP, case=case, tokens=tokens, heads=H, kv_heads=HKV)
    gen = torch.Generator(device="cuda").manual_seed(2)
    tq, tk, tv = (torch.randn((1, h, tokens, HD), dtype=torch.bfloat16, device="cuda", generator=gen)
                  for h in (H, HKV, HKV))
    theirs, gqa = sdpa_call(tq, tk, tv)
    torch_ratio(t_ours, measure(TorchClock(), theirs, ROUNDS, WARMUP), torch_enable_gqa=gqa)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", "--benchmark-columns=median,rounds",
                          *sys.argv[1:]]))
