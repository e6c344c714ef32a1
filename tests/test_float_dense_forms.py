"""fast/cuda/dense.py's choice of float_dense.cu form, checked without a GPU: bad variants and
a token count past the tiled form's grid are refused with one line before anything launches;
`auto` falls back to the one-warp form there (and below 8 rows or tokens)."""
import pytest
from gguf import GGMLQuantizationType as QT

from strata_prefill.fast.cuda import dense
from strata_prefill.contract.errors import InputError


class Recorder:
    """Stands in for runtime.Device: records the launches instead of making them."""

    def __init__(self):
        self.launches = []

    def launch(self, f, what, grid, block, *args, **kw):
        self.launches.append((f, grid, block))


@pytest.fixture
def no_compile(monkeypatch):
    names = []
    monkeypatch.setattr(dense.runtime, "function", lambda module, name, fmt, defines=None: names.append(name) or name)
    monkeypatch.setattr(dense, "ptr", lambda a: 0)
    return names


def test_unknown_variant_is_refused():
    with pytest.raises(InputError, match="unknown variant 'tiles'"):
        dense.float_dense(Recorder(), QT.F32, None, 8, 64, None, 8, None, variant="tiles")


def test_tile_past_the_grid_is_refused(no_compile):
    T = 65536 * 32
    with pytest.raises(InputError, match="at most 2097120 tokens"):
        dense.float_dense(Recorder(), QT.F32, None, 512, 64, None, T, None, variant="tile")
    assert no_compile == []


@pytest.mark.parametrize("N,T,want", [(512, 8192, "float_dense_tile_bf16"), (1, 8192, "float_dense_bf16"),
                                      (512, 7, "float_dense_bf16"), (512, 65536 * 32, "float_dense_bf16"),
                                      (8, 8, "float_dense_tile_bf16")])
def test_auto_picks_the_form(no_compile, N, T, want):
    dev = Recorder()
    dense.float_dense(dev, QT.BF16, None, N, 64, None, T, None)
    assert no_compile == [want]
    grid = dev.launches[0][1]
    if "tile" in want:
        assert grid == (-(-N // 16), -(-T // 32), 1)
