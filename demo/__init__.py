"""Demo models for slotserve: `python -m demo.build_repository --output DIR` builds a Triton-style repository."""
