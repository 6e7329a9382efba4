"""The dump's writer never replaces a file (sglang/dump/writer.py; engine-free: no SGLang here): servers sharing one
dump directory (replicas behind one balancer) must never lose each other's records. The plugin's writing of whole
records, two servers with one pid included: tests/plugin/test_sglang_served_dump.py; two real servers in separate
PID namespaces: tests/plugin/test_sglang_replicas.py."""
import errno
import os

import pytest
import torch

from eagle3_capture.sglang.dump import writer as dump_writer
from eagle3_capture.sglang.dump.writer import Job, Writer, write_exclusive


def test_a_name_is_taken_once_and_never_replaced(tmp_path):
    p = str(tmp_path / "r.pt")
    assert write_exclusive(p, b"first")
    assert not write_exclusive(p, b"second")
    assert open(p, "rb").read() == b"first" and os.listdir(tmp_path) == ["r.pt"]
    # another writer's record in flight under the temporary name: not touched, not taken
    (tmp_path / "s.pt.tmp").write_bytes(b"in flight")
    assert not write_exclusive(str(tmp_path / "s.pt"), b"mine")
    assert (tmp_path / "s.pt.tmp").read_bytes() == b"in flight" and not (tmp_path / "s.pt").exists()


@pytest.mark.parametrize("err", [errno.EPERM, errno.EOPNOTSUPP])
def test_without_hard_links_the_record_is_renamed_into_a_free_name_only(tmp_path, monkeypatch, err):
    def no_links(src, dst):
        raise OSError(err, os.strerror(err), dst)

    monkeypatch.setattr(os, "link", no_links)
    p = str(tmp_path / "r.pt")
    assert write_exclusive(p, b"first") and not write_exclusive(p, b"second")
    assert open(p, "rb").read() == b"first" and sorted(os.listdir(tmp_path)) == ["r.pt"]


def test_a_failure_to_link_for_another_reason_leaves_no_file(tmp_path, monkeypatch):
    def broken(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO), dst)

    monkeypatch.setattr(os, "link", broken)
    with pytest.raises(OSError, match="Input/output error"):
        write_exclusive(str(tmp_path / "r.pt"), b"x")
    assert os.listdir(tmp_path) == []


def test_the_writer_takes_another_name_when_one_is_taken(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(dump_writer, "announce", lambda level, msg: lines.append((level, msg)))
    (tmp_path / "a.pt").write_bytes(b"someone else's")
    names = iter(["b.pt", "c.pt"])
    w = Writer(str(tmp_path))
    t = {"x": torch.arange(3)}
    assert w.submit(Job(str(tmp_path / "a.pt"), {"seq": 0}, t, 24, rename=lambda: str(tmp_path / next(names))))
    assert w.flush(30) and w.stopped is None and w.written == 1
    assert (tmp_path / "a.pt").read_bytes() == b"someone else's"
    assert torch.load(tmp_path / "b.pt", weights_only=True)["seq"] == 0
    assert [lv for lv, _ in lines] == ["warning"] and "a.pt already in" in lines[0][1] and "b.pt" in lines[0][1]
    # a job that cannot be renamed stops the writer with one ERROR line; the file is left as it was
    assert w.submit(Job(str(tmp_path / "a.pt"), {"seq": 1}, t, 24))
    assert w.flush(30) and w.stopped is not None and "not replaced" in w.stopped
    assert (tmp_path / "a.pt").read_bytes() == b"someone else's"
    assert [lv for lv, _ in lines] == ["warning", "error"] and "serving goes on" in lines[1][1]


def test_the_writer_gives_up_after_its_attempts(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(dump_writer, "announce", lambda level, msg: lines.append((level, msg)))
    (tmp_path / "a.pt").write_bytes(b"x")
    w = Writer(str(tmp_path))
    assert w.submit(Job(str(tmp_path / "a.pt"), {"seq": 0}, {}, 0, rename=lambda: str(tmp_path / "a.pt")))
    assert w.flush(30) and f"{dump_writer.NAME_ATTEMPTS} names tried" in w.stopped
    assert sorted(os.listdir(tmp_path)) == ["a.pt"] and lines[-1][0] == "error"
