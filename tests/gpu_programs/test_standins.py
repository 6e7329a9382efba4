"""The import-side stand-ins (scripts/gpu_sglang/standins): how their names behave, and that SGLang 0.5.23's modules
on the CUDA serving path import with them (import_check.py, CUDA pretended). Each runs in a fresh interpreter:
``sgl_kernel`` in this process's modules would change the branches SGLang takes in the CPU tests."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "gpu_sglang")  # the GPU programs
STANDINS = os.path.join(PROGRAMS, "standins")


def _run(code: str, timeout: int = 120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDINS, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_import_only_names_resolve_and_raise_when_called():
    p = _run("""
        import inspect
        import sgl_kernel, flash_mla, cutlass
        from sgl_kernel.scalar_type import ScalarType, scalar_types
        from sgl_kernel.kvcacheio import transfer_kv_all_layer
        from sgl_kernel.utils import is_arch_support_pdl
        from sgl_kernel import native
        from cutlass.cute.nvgpu import cpasync
        from flash_mla.flash_mla_interface import FlashMLASchedMeta
        from IPython.display import HTML, display
        import e3_standin_stubs as s

        # the implemented names are native.py's functions
        assert sgl_kernel.rmsnorm is native.rmsnorm and sgl_kernel.moe_align_block_size is native.moe_align_block_size
        assert sgl_kernel.weak_ref_tensor is native.weak_ref_tensor and is_arch_support_pdl is native.is_arch_support_pdl
        # import-time constants, attribute chains, base classes, bare decorators
        u = scalar_types.uint4b8
        assert u is scalar_types.uint4b8 and "scalar_types.uint4b8" in repr(u)
        class Meta(FlashMLASchedMeta): pass
        @cutlass.cute.jit
        def f(): return 1
        assert f() == 1
        @sgl_kernel.register_something
        class C: pass
        assert inspect.isclass(C)
        # a call raises and names what was called
        for fn, name in ((transfer_kv_all_layer, "sgl_kernel.kvcacheio.transfer_kv_all_layer"),
                         (sgl_kernel.merge_state_v2, "sgl_kernel.merge_state_v2"),
                         (cpasync.copy, "cutlass.cute.nvgpu.cpasync.copy")):
            try:
                fn(1, 2)
            except s.StandInNotImplemented as e:
                assert name in str(e) and "native.py" in str(e), str(e)
            else:
                raise AssertionError(name + " did not raise")
        assert s.CALLED == {"sgl_kernel.kvcacheio.transfer_kv_all_layer": 1, "sgl_kernel.merge_state_v2": 1,
                            "cutlass.cute.nvgpu.cpasync.copy": 1}, s.CALLED
        print("ok")
    """)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_a_real_submodule_file_wins_over_the_finder():
    p = _run("""
        import sgl_kernel.utils as u, sgl_kernel.native as n
        assert u.__file__.endswith("utils.py") and n.__file__.endswith("native.py")
        assert u.is_arch_support_pdl() in (True, False)
        print("ok")
    """)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_cuda_path_imports_with_the_stand_ins():
    """Every `if _is_cuda:` import block on the serving path, answered by the stand-ins, calling none of the
    import-only names (what failed before: sglang/utils.py's IPython import, the version check, the finder)."""
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "import_check.py")], capture_output=True, text=True,
                       timeout=900)
    report = json.loads(p.stdout[p.stdout.index("{"):])
    bad = {m: v for m, v in report["modules"].items() if v != "ok"}
    assert not bad, bad
    assert report["called_import_only_names"] == {}
    for mod in ("sgl_kernel", "sgl_kernel.utils", "cutlass", "IPython.display"):
        assert mod in report["standin_modules"], report["standin_modules"]
    assert p.returncode == 0
