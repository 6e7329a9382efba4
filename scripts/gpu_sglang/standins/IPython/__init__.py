"""Import stand-in for IPython (scripts/gpu_sglang/standins): ``sglang/utils.py`` imports ``IPython.display``'s HTML and
display at module level for notebooks; the GPU machine has no IPython."""
