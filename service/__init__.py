"""slotserve's server: admission, lifecycle, registry, residency, servicers and bootstrap.

Only this package and `client` import gRPC; the admission and lifecycle cores do not either (they live here
but are plain Python).
"""
