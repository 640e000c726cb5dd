"""Python models (Triton python-backend model.py files) the tests serve: repository/ is a model repository."""

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent / "repository"
