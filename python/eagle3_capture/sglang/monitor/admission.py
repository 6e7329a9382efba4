"""Around the scheduler's request admission (``Scheduler._add_request_to_queue``, every release 0.5.12-0.5.23):
while a capture self-test that failed while serving stands (``EAGLE3_CAPTURE_SELFTEST=raise``, selftest.py),
every new request is finished at once with SGLang's own abort -- ``Req.set_finish_with_abort(line)``, as the scheduler
does for a request it cannot serve: SGLang then runs it as a one-token prefill and returns the abort, with the line
naming the failed self-test, to the client -- instead of being served through a broken capture. Requests already
in flight (a retracted request coming back, one already finishing) are left alone: the server does not die with
them. A later passing self-test lifts it.

Cost per admitted request while serving: one read of a module global.
"""
from __future__ import annotations

import inspect
from http import HTTPStatus

from . import selftest

_takes_status = {}  # set_finish_with_abort -> whether it takes status_code/err_type (0.5.20+)


def abort(req, line: str) -> None:
    """Finish `req` with SGLang's abort carrying `line`: 503 where the release takes a status (the server, not the
    request, is at fault: a client or balancer may try another replica), else the release's own default."""
    fn = type(req).set_finish_with_abort
    takes = _takes_status.get(fn)
    if takes is None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            params = {}
        takes = _takes_status[fn] = "status_code" in params and "err_type" in params
    if takes:
        req.set_finish_with_abort(line, status_code=HTTPStatus.SERVICE_UNAVAILABLE, err_type="ServiceUnavailableError")
    else:
        req.set_finish_with_abort(line)


def add_request_hook(original, self, req, *args, **kwargs):
    """AROUND ``Scheduler._add_request_to_queue(req, is_retracted=False)``: abort a new request while the
    self-test's refusal stands."""
    line = selftest.refusal()
    if line is not None:
        retracted = kwargs.get("is_retracted", args[0] if args else False)
        if not retracted and getattr(req, "to_finish", None) is None and getattr(req, "finished_reason", None) is None:
            abort(req, line)
    return original(self, req, *args, **kwargs)


__all__ = ["add_request_hook", "abort"]
