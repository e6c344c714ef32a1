"""fast package."""
