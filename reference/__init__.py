"""The NumPy reference prefill: the definition the fast path must match byte for byte."""
from reference.model import ReferenceEngine

__all__ = ["ReferenceEngine"]
