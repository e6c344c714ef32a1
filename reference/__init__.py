"""The NumPy reference prefill: the definition the fast path must match byte for byte.

reference/model.py is the engine, one layer at a time. Each operation it calls from contract/ is
stated element by element, in the contract's order, in reference/scalar.py: the plain loops
to read for what a product, a quantization, the attention or the routing computes."""
from strata_prefill.reference.model import ReferenceEngine

__all__ = ["ReferenceEngine"]
