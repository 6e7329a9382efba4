"""The real-width run's plan (scripts/gpu_sglang/kimi_plan.py) and the script that asks it first
(scripts/gpu_sglang_kimi.sh): EXPERTS chosen by the card, the memory arithmetic, the seconds from DESIGN.md's
measurements against those left, the earlier phase's files, and a refusal in one line, exit 2, before anything is
installed."""
import json
import os
import subprocess

import pytest
import torch

import kimi_compare
import kimi_plan
import kimi_shape

H100, H200 = ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA H200", 143771)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_experts_follow_the_card_and_the_number_of_servers():
    assert kimi_plan.choose_experts("online", H100[1], None)[0] == 2
    assert kimi_plan.choose_experts("collect", H200[1], None)[0] == 8
    assert kimi_plan.choose_experts("llama", H200[1], None)[0] == 4
    assert kimi_plan.choose_experts("online", H100[1], 3) == (3, "EXPERTS set by the caller")


def test_the_draft_size_is_the_written_drafts():
    """draft_parameters (no torch, read before the wheels) = the parameters of kimi_compare's Llama draft."""
    from eagle3_capture.doctor.draft.model import Eagle3Draft

    for cfg in (kimi_shape.target_config(2, 2), kimi_shape.target_config(4, 2, **kimi_shape.SMALL)):
        arch = kimi_compare.draft_arch("llama", cfg, kimi_compare.draft_ids(cfg["num_hidden_layers"]))
        with torch.device("meta"):
            n = sum(p.numel() for p in Eagle3Draft(arch).parameters())
        assert kimi_plan.draft_parameters(cfg) == n


def test_one_server_fits_an_h100_and_two_need_an_h200():
    plan, why = kimi_plan.plan("online", 560, H100, state=None)
    assert why is not None and "train phase's files" in why  # online needs train's files first
    plan, why = kimi_plan.plan("miswired", 560, H100)
    m = plan["memory"]
    assert why is None and plan["experts"] == 2 and m["static_gib_per_server"] < m["static_pool_gib_per_server"]
    assert m["left_gib"] > kimi_plan.DOCTOR_GPU_GIB
    plan, why = kimi_plan.plan("llama", 560, H100)
    assert "two servers side by side" in why and "nvidia-h200" in why and "needs_h200" in why
    plan, why = kimi_plan.plan("llama", 560, H200, warm=True)
    assert why is None and plan["memory"]["servers"] == 2


def test_a_phase_that_cannot_fit_the_time_left_is_refused_with_its_arithmetic():
    plan, why = kimi_plan.plan("miswired", 300, H100)
    assert why.startswith("PHASE=miswired needs about") and "server start 239" in why and "300 s are left" in why
    warm, _ = kimi_plan.plan("miswired", 300, H100, warm=True)
    assert warm["seconds"]["server start"] == 93 and warm["need_s"] < plan["need_s"]
    done, _ = kimi_plan.plan("miswired", 300, H100, setup_done=True)
    assert "setup (allowance)" not in done["seconds"]


def test_train_and_online_need_the_earlier_phases_files(tmp_path):
    st = str(tmp_path)
    _, why = kimi_plan.plan("train", 560, H100, state=st)
    assert "PHASE=train needs the collect phase's files" in why and "train_data.pt" in why
    for f in ("collect.json", "train_data.pt", "target/config.json"):
        os.makedirs(os.path.dirname(os.path.join(st, f)), exist_ok=True)
        open(os.path.join(st, f), "w").close()
    assert kimi_plan.plan("train", 560, H100, state=st)[1] is None


@pytest.mark.parametrize("phase,budget,needle", [
    ("llama", 560, "ask for an H200"), ("online", 560, "needs the train phase's files"),
    ("miswired", 200, "needs about")])
def test_the_script_refuses_up_front_in_one_line(tmp_path, phase, budget, needle):
    """gpu_sglang_kimi.sh on an H100 (a stand-in nvidia-smi on PATH): exit 2, one line, nothing installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 81559'\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PHASE=phase, BUDGET_S=str(budget),
               OUT=str(tmp_path / "out"), WHEELS=str(tmp_path / "no_wheels"))
    env.pop("EXPERTS", None)
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_sglang_kimi.sh")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert not (tmp_path / "out" / "summary.txt").exists()        # refused before start_run: nothing ran
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["fits"] is False
