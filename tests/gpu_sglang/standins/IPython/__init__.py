"""Test-only stand-in for IPython (tests/gpu_sglang): ``sglang/utils.py`` imports ``IPython.display``'s HTML and
display at module level for notebooks; the GPU machine has no IPython."""
