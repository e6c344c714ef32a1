"""dev/mmq_occupancy.py without a GPU: the CTAs an SM each limit allows, the configurations it
names, and (where nvcc is on PATH) what it reads from a cubin against what the source declares."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from dev import mmq_occupancy as occ
from strata_prefill.fast.cuda import products, runtime


def test_a_q4_k_big_tile_is_one_cta_an_sm_for_its_shared_memory():
    """The figures an H100 showed (docs/results/2026-12-06-mmq-wgmma-core.md): 128 registers
    allow two CTAs of 256 threads, 123,904 + 1,424 bytes of shared memory one."""
    use = occ.KernelUse("mmq_q4_k", threads=256, registers=128, frame=0, dynamic_smem=123904, static_smem=1424)
    by = occ.ctas_an_sm(use, "sm_90")
    assert by == {"registers": 2, "shared memory": 1, "threads": 8, "all": 1}
    fits = occ.KernelUse("mmq_q8_0", threads=256, registers=128, frame=0, dynamic_smem=113664, static_smem=1424)
    assert occ.ctas_an_sm(fits, "sm_90")["all"] == 2


def test_registers_are_allocated_a_warp_in_units():
    """168 registers a thread: 5,376 a warp (a multiple of 256), 3 CTAs of 4 warps in 65,536."""
    use = occ.KernelUse("k", threads=128, registers=168, frame=0, dynamic_smem=0, static_smem=1024)
    by = occ.ctas_an_sm(use, "sm_90")
    assert by["registers"] == 3 and by["threads"] == 16 and by["all"] == 3
    few = occ.KernelUse("k", threads=32, registers=16, frame=0, dynamic_smem=0, static_smem=1024)
    assert occ.ctas_an_sm(few, "sm_90")["all"] == 32  # the CTA limit, not the others


def test_config_names_are_auto_configs_in_order():
    for i, name in enumerate(occ.CONFIG_NAMES):
        assert occ.parse_config(name) == (name, products._with_extra(products.AUTO_CONFIGS[i][1]))
    assert len(occ.CONFIG_NAMES) == len(products.AUTO_CONFIGS)
    assert occ.parse_config('{"MMQ_BN": 96}')[1] == {"MMQ_BN": 96}
    for bad in ("huge", "[1]", "{", '{"MMQ_BN": "96"}', '{"MMQ_BN": true}'):
        with pytest.raises(ValueError, match="--config"):
            occ.parse_config(bad)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_what_it_reads_from_a_cubin_is_what_the_source_declares(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(
        'extern "C" __device__ int probe_smem = 54321;\n'
        'extern "C" __global__ void __launch_bounds__(128) probe(float* o, int n) {\n'
        "    __shared__ float s[300];\n"
        "    s[threadIdx.x] = o[threadIdx.x] * n;\n"
        "    __syncthreads();\n"
        "    o[threadIdx.x] = s[(threadIdx.x + 1) % 128] + s[threadIdx.x + 128];\n"
        "}\n")
    cubin = tmp_path / "k.cubin"
    r = subprocess.run(["nvcc", "-cubin", f"-arch={runtime.DEFAULT_ARCH}", *runtime.NVCC_OPTIONS, "-Xptxas", "-v",
                        str(src), "-o", str(cubin)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    use = occ.kernel_use(str(cubin), "probe")
    assert use.dynamic_smem == 54321 and use.threads == 128
    assert use.code_bytes > 0 and use.code_bytes % 16 == 0  # sm_90 instructions are 16 bytes
    # the 1,200 static bytes, and the reservation sm_90 adds a CTA
    assert use.static_smem >= 1200 and use.static_smem % 16 == 0
    assert f"Used {use.registers} registers" in r.stderr
    with pytest.raises(KeyError, match="no kernel other"):
        occ.kernel_use(str(cubin), "other")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_k_quants_hold_the_ctas_the_big_tiles_ask(tmp_path):
    """The two K-quants nearest the two-CTA line at the big tiles (Q4_K with its block staged
    once for two chunks; Q5_K only with its block scale kept once a row: mmq.cu GeoOf) hold
    the MMQ_MINB CTAs an SM the configuration asks for."""
    from concurrent.futures import ThreadPoolExecutor

    from gguf import GGMLQuantizationType as QT

    from strata_prefill.contract import qformats

    _, cfg = occ.parse_config("big")
    asked = int(cfg["MMQ_MINB"])
    with ThreadPoolExecutor(2) as pool:
        uses = list(pool.map(lambda qt: occ.type_use(str(tmp_path), cfg, qformats.lookup(qt), runtime.DEFAULT_ARCH),
                             (QT.Q4_K, QT.Q5_K)))
    for u in uses:
        assert occ.ctas_an_sm(u, runtime.DEFAULT_ARCH)["all"] >= asked, u
