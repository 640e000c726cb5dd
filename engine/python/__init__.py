"""Python models: Triton's python-backend model.py, each slot in a worker process (backend.py, worker.py,
transport.py) and the `triton_python_backend_utils` module they import (docs/python-models.md)."""
