"""Front-end prototypes for issue 24: slotserve's real core behind other gRPC front ends (bench only)."""
