"""SGLang's import chains as the GPU machine would run them, on the CPU: the GPU programs' stand-ins
(scripts/gpu_sglang/standins) on the path, CUDA pretended (scripts/gpu_sglang/import_check.py), and every
third-party package the GPU machine lacks made invisible (tests/gpu_programs/device_like: its image's packages and
the wheels carried for the release, nothing else -- no sgl_kernel, no soundfile, no IPython). Both ways a server
starts: ``sglang.Engine`` (entrypoints/engine.py, the scheduler, the runners) and ``python -m
sglang.launch_server`` (entrypoints/http_server.py and its OpenAI routes, which import soundfile through
serving_transcription -> audio_chunking; the first real-width GPU run died there). Also which CUDA-graph size
options each release's own ServerArgs accepts (scripts/gpu_sglang/server_flags.py)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROGRAMS = os.path.join(REPO, "scripts", "gpu_sglang")
DEVICE_LIKE = os.path.join(HERE, "device_like")

import server_flags  # noqa: E402

# the device-like start-up file, read as a module (inert here: E3_DEVICE_LIKE is not set in this process)
_spec = importlib.util.spec_from_file_location("e3_device_like", os.path.join(DEVICE_LIKE, "sitecustomize.py"))
device_like = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_like)

LAUNCH_SERVER = ("sglang.launch_server", "sglang.srt.entrypoints.http_server",
                 "sglang.srt.entrypoints.openai.serving_transcription")
ENGINE = ("sglang.srt.entrypoints.engine", "sglang.srt.managers.scheduler", "sglang.srt.models.deepseek_v2",
          "sglang.srt.speculative.eagle_worker_v2")


def _release_dir(version: str) -> str:
    """The folder holding SGLang `version` ('' for the environment's own 0.5.23); a test of a release that is not
    installed fails saying how to install it (make test-releases installs them)."""
    import sglang

    if sglang.__version__ == version:
        return ""
    d = os.path.join(os.environ.get("E3_SGLANG_RELEASES_DIR") or os.path.join(REPO, ".venv", "sglang-releases"),
                     version)
    if not os.path.isfile(os.path.join(d, ".e3-release.json")):
        pytest.fail(f"SGLang {version} is not installed: python tests/sglang_release_dirs.py sglang --importable "
                    f"{version}")
    return d


def _device_env(version: str, hide: str = "") -> dict:
    path = [p for p in (_release_dir(version), DEVICE_LIKE, os.path.join(REPO, "python"),
                        os.path.join(REPO, "tests", "sglang_cpu_plugin")) if p]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E3_DEVICE_LIKE", "SGLANG_"))}
    env.update(PYTHONPATH=os.pathsep.join(path), E3_DEVICE_LIKE=version, E3_DEVICE_LIKE_HIDE=hide)
    return env


def _import_check(version: str, modules=(), hide: str = "") -> dict:
    p = subprocess.run([sys.executable, os.path.join(PROGRAMS, "import_check.py"), "--in-release", *modules],
                       capture_output=True, text=True, timeout=900, env=_device_env(version, hide), cwd=REPO)
    assert "{" in p.stdout, p.stderr[-3000:]
    report = json.loads(p.stdout[p.stdout.index("{"):])
    assert report["sglang"] == version, report
    return report


def test_the_device_like_environment_hides_what_the_gpu_machine_lacks():
    """soundfile, IPython and cffi are installed here and absent there: invisible (find_spec None, so code that
    asks whether they exist is answered as there); numpy, transformers (image) and msgspec (carried) stay."""
    code = ("import importlib.util as u, json; print(json.dumps({n: u.find_spec(n) is not None for n in "
            "('soundfile', 'IPython', '_cffi_backend', 'numpy', 'transformers', 'msgspec', 'sglang')}))")
    env = _device_env("0.5.23")
    env["PYTHONPATH"] = os.pathsep.join([DEVICE_LIKE, os.path.join(REPO, "python")])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert json.loads(p.stdout) == {"soundfile": False, "IPython": False, "_cffi_backend": False, "numpy": True,
                                    "transformers": True, "msgspec": True, "sglang": True}, p.stderr
    assert {"sglang", "apache-tvm-ffi", "xgrammar"} <= device_like.carried("0.5.23")
    assert {"sglang", "transformers", "tokenizers"} <= device_like.carried("0.5.12")
    assert "sglang" not in device_like.carried("0.4.0")  # no release section: the common wheels only


@pytest.mark.sglang
@pytest.mark.slow
def test_launch_server_and_engine_import_as_on_the_gpu_machine():
    """0.5.23, CUDA pretended, nothing but the GPU machine's packages: the Engine chain and launch_server's HTTP
    chain import, soundfile and IPython answered by the stand-ins, no import-only name called."""
    r = _import_check("0.5.23", LAUNCH_SERVER + ENGINE)
    assert r["ok"] and all(v == "ok" for v in r["modules"].values()), r["modules"]
    assert {"soundfile", "sgl_kernel", "IPython"} <= set(r["standin_modules"])
    assert r["called_import_only_names"] == {}


@pytest.mark.sglang
@pytest.mark.slow
def test_without_the_soundfile_stand_in_launch_server_fails_as_it_did_on_the_gpu():
    """The check catches this class of fault: hide the soundfile stand-in and launch_server's HTTP chain fails on
    `No module named 'soundfile'`, exactly where the first real-width GPU run died, while the Engine chain (which
    the earlier CPU dry runs exercised) still imports."""
    r = _import_check("0.5.23", LAUNCH_SERVER + ENGINE, hide="soundfile")
    assert not r["ok"]
    for m in ("sglang.srt.entrypoints.http_server", "sglang.srt.entrypoints.openai.serving_transcription"):
        assert r["modules"][m].startswith("ModuleNotFoundError: No module named 'soundfile'"), r["modules"][m]
    assert all(r["modules"][m] == "ok" for m in ENGINE + ("sglang.launch_server",)), r["modules"]


@pytest.mark.sglang
@pytest.mark.sglang_releases
@pytest.mark.slow
def test_the_seeds_release_imports_as_on_the_gpu_machine():
    """0.5.12 (its pinned transformers 5.6 / tokenizers 0.22 carried), CUDA pretended: its whole serving path
    imports with the stand-ins (sgl_kernel's torch op schemas its fake registrations need, flashinfer.sampling,
    which its sampler imports unguarded on CUDA), launch_server's chain included."""
    r = _import_check("0.5.12")
    bad = {m: v for m, v in r["modules"].items() if v not in ("ok", "absent")}
    assert not bad and r["ok"], bad
    assert r["modules"]["sglang.srt.entrypoints.http_server"] == "ok"
    assert r["called_import_only_names"] == {}


def _options(version: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "E3_DEVICE_LIKE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_release_dir(version), os.path.join(PROGRAMS, "standins"),
                                                    os.environ.get("PYTHONPATH", "")) if p)
    return server_flags.accepted(env, cwd=REPO)


@pytest.mark.sglang
def test_cuda_graph_sizes_are_named_as_the_installed_releases_parser_accepts():
    """0.5.23's parser has decode and prefill lists and refuses the old single one as ambiguous (launch_server exit
    2, the first GPU run's fault); the options chosen from its ServerArgs parse into the fields meant."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    opts = _options("0.5.23")
    assert opts["version"] == "0.5.23" and opts["id_rule"] == "shift_if_first_is_1"
    cli = server_flags.graph_options(opts["options"], [1, 4, 16], [64, 512])
    assert cli == ["--cuda-graph-bs-decode", "1", "4", "16", "--cuda-graph-bs-prefill", "64", "512"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", *cli])
    assert ns.cuda_graph_bs_decode == [1, 4, 16] and ns.cuda_graph_bs_prefill == [64, 512]
    with pytest.raises(SystemExit):  # "ambiguous option: --cuda-graph-bs could match ..."
        parser.parse_args(["--model-path", "m", "--cuda-graph-bs", "1", "4", "16"])
    assert server_flags.graph_kwargs(opts["fields"], [1, 4], [64]) == {"cuda_graph_bs_decode": [1, 4],
                                                                       "cuda_graph_bs_prefill": [64]}
    # no piecewise prefill graph in 0.5.23: graphs off is the one flag
    assert server_flags.eager_options(opts["options"]) == ["--disable-cuda-graph"]
    assert server_flags.eager_kwargs(opts["fields"]) == {"disable_cuda_graph": True}
    assert parser.parse_args(["--model-path", "m", *server_flags.eager_options(opts["options"])]).disable_cuda_graph


@pytest.mark.sglang
@pytest.mark.sglang_releases
def test_the_seeds_release_gets_its_single_list():
    opts = _options("0.5.12")
    assert opts["version"] == "0.5.12" and "--cuda-graph-bs-decode" not in opts["options"]
    assert opts["id_rule"] == "shift_all"  # +1 on every id: stock's ids for the Kimi draft's [1, 29, 57] are those
    import make_pair

    assert make_pair.stock_ids([1, 29, 57], opts["id_rule"]) == [1, 29, 57]
    assert make_pair.stock_ids([1, 29, 57], _options("0.5.23")["id_rule"]) == [2, 30, 58]
    assert server_flags.graph_options(opts["options"], [1, 4, 16], [64, 512]) == ["--cuda-graph-bs", "1", "4", "16"]
    assert server_flags.graph_kwargs(opts["fields"], [1, 4, 16], [64]) == {"cuda_graph_bs": [1, 4, 16]}
    # its piecewise prefill graph is on by default and --disable-cuda-graph leaves it on: graphs off turns off both
    assert server_flags.eager_options(opts["options"]) == ["--disable-cuda-graph", "--disable-piecewise-cuda-graph"]
    assert server_flags.eager_kwargs(opts["fields"]) == {"disable_cuda_graph": True,
                                                         "disable_piecewise_cuda_graph": True}
    with pytest.raises(ValueError, match="accepts none of"):
        server_flags.graph_options(["--model-path"], [1], [64])


def test_the_soundfile_stand_in_keeps_transformers_audio_import_working():
    """With the stand-in (and no real soundfile), transformers' audio module imports, finds a soundfile, and
    nothing is called at import; calling a soundfile name raises, naming it."""
    code = ("import soundfile, transformers.audio_utils as a, transformers.utils as u\n"
            "assert soundfile.STANDIN and u.is_soundfile_available() and a.sf is soundfile\n"
            "import e3_standin_stubs as s\n"
            "try:\n    soundfile.write('x.wav', [0.0], 16000)\nexcept s.StandInNotImplemented as e:\n"
            "    assert 'soundfile.write' in str(e)\nelse:\n    raise AssertionError('no raise')\n"
            "assert s.CALLED == {'soundfile.write': 1}\nprint('ok')")
    env = _device_env("0.5.23")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(PROGRAMS, "standins"), DEVICE_LIKE])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


@pytest.mark.sglang
@pytest.mark.sglang_releases
@pytest.mark.slow
def test_the_packer_release_imports_as_on_the_gpu_machine():
    """0.5.20 (torch pin 2.13; its pinned transformers 5.12.1 carried): its serving path imports with the stand-ins
    (deep_gemm, which its DSA backend imports unguarded on CUDA, among them). Whether its compiled pieces load on the
    GPU machine's torch 2.11 is for the device: the only torch-linked library it ships is the Rust radix-tree core
    (mem_cache/rust_tree_core), which its default Python tree core never loads."""
    r = _import_check("0.5.20")
    bad = {m: v for m, v in r["modules"].items() if v not in ("ok", "absent")}
    assert not bad and r["ok"], bad
    assert "deep_gemm" in r["standin_modules"] and r["called_import_only_names"] == {}


@pytest.mark.sglang
def test_the_moe_fused_gate_stand_in_equals_sglangs_own_torch_router():
    """native.moe_fused_gate (which 0.5.12 calls on CUDA for a sigmoid router of 2-32 experts per group) against
    SGLang's own torch implementation of the same routing (topk.biased_grouped_topk_impl), renormalised, on random
    logits: the same experts (as sets per token) and weights."""
    import importlib.util

    import torch
    from sglang.srt.layers.moe.topk import biased_grouped_topk_impl

    spec = importlib.util.spec_from_file_location("e3_native", os.path.join(PROGRAMS, "standins", "sgl_kernel",
                                                                            "native.py"))
    nat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nat)
    g = torch.Generator().manual_seed(3)
    for E, groups, tg, k in ((8, 2, 1, 2), (8, 1, 1, 2), (4, 1, 1, 2), (64, 4, 2, 6)):
        logits, bias = torch.randn(37, E, generator=g), 0.1 * torch.randn(E, generator=g)
        w, ids = nat.moe_fused_gate(logits, bias, groups, tg, k, 0, 2.5, True)
        rw, rids = biased_grouped_topk_impl(logits, logits, bias, k, True, groups, tg,
                                            routed_scaling_factor=2.5, apply_routed_scaling_factor_on_output=True)
        assert w.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (37, k)
        order, rorder = ids.long().sort(-1), rids.long().sort(-1)
        assert torch.equal(order.values, rorder.values), (E, groups)
        torch.testing.assert_close(w.gather(1, order.indices), rw.float().gather(1, rorder.indices))
    with pytest.raises(NotImplementedError, match="num_fused_shared_experts"):
        nat.moe_fused_gate(logits, bias, 4, 2, 6, 1)
