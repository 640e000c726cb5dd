"""`make bench`: the benchmark script (run.py) and its parts. See bench/README.md."""
