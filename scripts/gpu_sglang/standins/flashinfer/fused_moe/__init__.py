"""Absent on purpose (flashinfer/__init__.py says why): SGLang's guarded import of it falls back."""
raise ImportError("flashinfer.fused_moe is not stood in (scripts/gpu_sglang/standins/flashinfer)")
