"""The documentation: README.md and docs/*.md. Generated parts are current, tables agree with the code, links
resolve. (Their runnable examples run in tests/interop/test_readme_examples.py.)"""
