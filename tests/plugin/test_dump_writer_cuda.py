"""On the GPU machine: the dump's one device-to-host copy (pinned, non-blocking, one event) written by the
background writer -- records hold the values the forward produced even when the source is overwritten right after
staging (a graph replay reusing its static buffer) while the stream is still busy, non-contiguous slices included."""
import pytest
import torch

from eagle3_capture.sglang.dump import writer as dump_writer
from eagle3_capture.sglang.dump.writer import Job, Writer

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_staged_records_hold_what_the_forward_produced(tmp_path, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    aux = torch.randn(300, 3 * 7168, generator=g, device="cuda").to(dtype)  # static buffer, rewritten per replay
    ids = torch.randint(0, 163840, (300,), generator=g, device="cuda")
    big = torch.randn(4096, 4096, generator=g, device="cuda")
    w = Writer(str(tmp_path))
    want = []
    for i in range(6):
        rows = 7 + 50 * i
        big @ big  # keep the stream busy so that the copies are still queued when the source changes
        src = {"input_ids": ids[:rows], "positions": torch.arange(rows, device="cuda"), "aux": aux[:rows],
               "odd": aux[:rows, 5:11]}
        want.append({k: v.cpu().clone() for k, v in src.items()})
        host, event, nbytes = dump_writer.to_host(src)
        assert event is not None and all(h.is_pinned() for h in host.values())
        aux.uniform_()  # the next replay overwrites the static buffer (stream-ordered after the copy)
        ids.random_(0, 100)
        assert w.submit(Job(str(tmp_path / f"r{i}.pt"), {"seq": i}, host, nbytes, event))
    assert w.flush(60) and w.stopped is None and w.written == 6
    for i, exp in enumerate(want):
        rec = torch.load(tmp_path / f"r{i}.pt")
        assert rec["seq"] == i
        for k, v in exp.items():
            assert torch.equal(rec[k], v), k
