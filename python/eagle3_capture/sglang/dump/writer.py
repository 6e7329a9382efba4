"""Getting dump records to disk without stalling serving: one device-to-host copy on the serving thread, the rest
on a background thread.

* Staging (serving thread): each tensor of a record is copied to host memory: into pinned memory with
  ``non_blocking=True`` on the current stream for a CUDA tensor, then one CUDA event is recorded after the copies;
  a CPU tensor is cloned. The copy is ordered on the stream that produced the values, before anything that reuses
  their memory (a decode CUDA graph's static aux buffer is overwritten by the next replay), so nothing waits on the
  host. (A side stream would need the serving stream to wait for it before that next replay: the same ordering,
  one more synchronisation.)
* Writing (background thread): waits for the record's event, assembles the record (cutting the aux and stream out
  of a widened capture happens here, on the host), serializes it with ``torch.save`` into memory and writes the
  bytes to ``<name>.pt.tmp`` in one call, then publishes it as ``<name>.pt``: a reader never sees a partial file.
  Both names are taken create-exclusive, never overwritten (several servers may share one directory: replicas behind
  one balancer, in PID namespaces where each is pid 6): the temporary file with ``O_EXCL``, the record by a hard
  link, which fails when the name exists. A name found taken is retried under a fresh random one (one WARNING line
  the first time). Where the filesystem has no hard links, the record is renamed into place after checking that its
  name is free (not atomic against another writer; names carry a 64-bit random id, so two writers never aim at one).
  The writer shares the serving process's GIL, and a serving thread that wants the GIL waits for it: ``torch.save``
  to a path writes the zip record by record with the GIL held (about 430 us for a small record on the CPU
  machine), into memory takes about 90 us, and the one file write releases the GIL. (It still contends: measured
  in docs/performance.md.)
* Failure: the first error writing (a full disk, a directory removed or made unwritable, ...) gives one ERROR line;
  the writer then stops, drops what is queued, and serving goes on. Records submitted while more than
  :data:`MAX_INFLIGHT_BYTES` wait for the disk are dropped (one WARNING line), never waited for.
"""
from __future__ import annotations

import atexit
import errno
import io
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

from ...dump_format import TMP_SUFFIX
from ..settings.switches import announce

MAX_INFLIGHT_BYTES = 1 << 30  # host memory held by records waiting for the disk
NAME_ATTEMPTS = 4             # names tried for one record before the writer stops (each a fresh random id)
# os.link's errors that mean "no hard links on this filesystem" (then: rename after an existence check)
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


@dataclass
class Job:
    """One record on its way to disk: its host tensors, the plain fields, and how to assemble the record."""

    path: str
    fields: dict
    tensors: Dict[str, torch.Tensor]
    nbytes: int
    event: Optional[object] = None  # torch.cuda.Event recorded after the copies
    assemble: Optional[Callable[[dict, Dict[str, torch.Tensor]], dict]] = None
    done: threading.Event = field(default_factory=threading.Event)
    rename: Optional[Callable[[], str]] = None  # another name for the record when `path` is taken


def to_host(tensors: Dict[str, torch.Tensor]):
    """({name: host copy}, event or None, bytes): the one copy the serving thread makes."""
    out, event, nbytes = {}, None, 0
    for name, t in tensors.items():
        t = t.detach()
        if t.is_cuda:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            event = True
        else:
            host = t.clone(memory_format=torch.contiguous_format)
        out[name] = host
        nbytes += host.numel() * host.element_size()
    if event:
        event = torch.cuda.Event()
        event.record()
    return out, event, nbytes


def write_bytes(path: str, data) -> None:
    """One write of a whole record into a new file `path`, created exclusively (FileExistsError when it exists; the
    GIL is released while the bytes go to the file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def publish(tmp: str, path: str) -> bool:
    """Give the finished file `tmp` the name `path` unless that name exists; True when it did (and `tmp` is gone)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        if os.path.lexists(path):
            return False
        os.rename(tmp, path)
        return True
    os.unlink(tmp)
    return True


def write_exclusive(path: str, data) -> bool:
    """Write a whole record as `path`, never replacing a file: False (nothing written) when `path` or its temporary
    name is taken. Raises OSError on any other failure, leaving no file of its own behind."""
    tmp = path + TMP_SUFFIX
    try:
        write_bytes(tmp, data)
    except FileExistsError:
        return False
    except BaseException:
        _unlink(tmp)  # ours: created before the write failed
        raise
    try:
        if publish(tmp, path):
            return True
    except BaseException:
        _unlink(tmp)
        raise
    _unlink(tmp)
    return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Writer:
    """A background thread writing :class:`Job` s in order; stops at the first error."""

    def __init__(self, directory: str):
        self.directory = directory
        self.stopped: Optional[str] = None  # why the writer stopped (None: running)
        self.written = 0
        self.bytes_written = 0
        self._inflight = 0
        self._dropped_logged = False
        self._collision_logged = False
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="eagle3_capture-dump", daemon=True)
        self._thread.start()
        atexit.register(self.flush, 10.0)

    def submit(self, job: Job) -> bool:
        """Queue a job; False (and the job dropped) when stopped or when too much waits for the disk."""
        with self._lock:
            if self.stopped is not None:
                return False
            if self._inflight and self._inflight + job.nbytes > MAX_INFLIGHT_BYTES:
                if not self._dropped_logged:
                    self._dropped_logged = True
                    announce("warning", f"eagle3_capture: the capture dump drops records while more than "
                                        f"{MAX_INFLIGHT_BYTES >> 20} MiB wait for the disk ({self.directory})")
                return False
            self._inflight += job.nbytes
        self._queue.put(job)
        return True

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every queued job is written or dropped; False on timeout."""
        done = threading.Event()
        marker = Job("", {}, {}, 0)
        marker.done = done
        self._queue.put(marker)
        return done.wait(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job.path and self.stopped is None:
                    self._write(job)
            finally:
                with self._lock:
                    self._inflight -= job.nbytes
                job.done.set()

    def _write(self, job: Job) -> None:
        try:
            if job.event is not None:
                job.event.synchronize()
            rec = job.assemble(job.fields, job.tensors) if job.assemble else {**job.fields, **job.tensors}
            buf = io.BytesIO()
            torch.save(rec, buf)
            path = job.path
            for _ in range(NAME_ATTEMPTS):
                if write_exclusive(path, buf.getbuffer()):
                    break
                taken, path = path, (job.rename() if job.rename is not None else None)
                if path is None:
                    raise FileExistsError(errno.EEXIST, "a file of that name exists (not replaced)", taken)
                if not self._collision_logged:
                    self._collision_logged = True
                    announce("warning", f"eagle3_capture: the capture dump found {os.path.basename(taken)} already "
                                        f"in {self.directory} (another process's record, or a stale file): not "
                                        f"replaced; this record is written as {os.path.basename(path)}")
            else:
                raise FileExistsError(errno.EEXIST, f"{NAME_ATTEMPTS} names tried, each taken (not replaced)",
                                      job.path)
            self.written += 1
            self.bytes_written += job.nbytes
        except Exception as e:  # a full disk, a removed directory, ...: one line, and serving goes on
            with self._lock:
                self.stopped = f"{type(e).__name__}: {e}"
            announce("error", f"eagle3_capture: the capture dump stopped: writing {job.path} failed "
                              f"({self.stopped}); serving goes on, nothing more is dumped by this process")


__all__ = ["Job", "Writer", "to_host", "write_bytes", "write_exclusive", "publish", "MAX_INFLIGHT_BYTES",
           "NAME_ATTEMPTS"]
