"""Box stability: how far the box itself can be trusted while it measures (docs/architecture.md)."""
