"""verify package."""
