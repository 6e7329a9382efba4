"""What every doctor subcommand shares: the user-facing error, input files read with clear messages, prompts,
JSON/safetensors output and the thread setting for tiny CPU models.

A :class:`DoctorError` is the API for bad inputs: the CLI prints its message (no traceback) and exits with
:data:`EXIT_BAD_INPUT`. Its message always names the file and what was expected vs what was found.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_FINDINGS = 1   # the doctor ran and found an error-severity problem
EXIT_BAD_INPUT = 2  # the doctor could not run: bad or missing input (argparse uses 2 too)
EXIT_NOT_JUDGED = 3  # the doctor ran, found nothing wrong, and could not judge part of what it read (doctor watch)


class DoctorError(Exception):
    """A problem with the user's input: printed as ``eagle3-capture doctor: error: <message>``, exit code 2."""


class DeploymentFinding(DoctorError):
    """A finding about the deployment that ends a command before its report (the server runs another draft's
    declaration, say): printed on stdout as ``finding: <message>``, exit code 1 (:data:`EXIT_FINDINGS`), not 2 --
    the input was right, the deployment is not."""


def shown(v: Any, limit: int = 80) -> str:
    """A value from a user's file, for a one-line message: a tensor by its dtype and shape, anything else by its
    repr on one line, cut at `limit` characters."""
    if type(v).__module__.startswith("torch") and hasattr(v, "dtype") and hasattr(v, "shape"):
        return f"a {str(v.dtype).replace('torch.', '')} tensor of shape {tuple(v.shape)}"
    text = " ".join(repr(v).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def require_file(path: str, what: str, *, allow_dir: bool = False) -> str:
    """The path, or a DoctorError saying which input is missing."""
    if path is None:
        raise DoctorError(f"{what}: no path given")
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DoctorError(f"{what} {p}: no such file" + (" or directory" if allow_dir else ""))
    if os.path.isdir(p) and not allow_dir:
        raise DoctorError(f"{what} {p}: is a directory, expected a file")
    return p


def read_json(path: str, what: str) -> Any:
    p = require_file(path, what)
    try:
        with open(p, "r", encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DoctorError(f"{what} {p}: malformed JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise DoctorError(f"{what} {p}: not UTF-8 text: {e}") from None


def write_json(path: str, data: Any) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------------------------

def load_safetensors(path: str, what: str):
    """(tensors dict, metadata dict) of a safetensors file, or a DoctorError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from safetensors import safe_open

    p = require_file(path, what)
    try:
        with safe_open(p, framework="pt") as h:
            meta = dict(h.metadata() or {})
        tensors = load_file(p)
    except (SafetensorError, OSError, ValueError) as e:
        raise DoctorError(f"{what} {p}: not a readable safetensors file ({e})") from None
    return tensors, meta


def save_safetensors(path: str, tensors: Dict[str, Any], metadata: Optional[Dict[str, Any]] = None) -> None:
    """Save contiguous CPU tensors; metadata values that are not strings are stored as JSON."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    if os.path.exists(path) and not os.path.isfile(path):  # safetensors replaces the path: never a device node
        raise DoctorError(f"{path}: exists and is not a regular file; expected a file path to write")
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    try:
        save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, path, metadata=meta)
    except SafetensorError as e:
        raise DoctorError(f"{path}: cannot be written ({e})") from None


def meta_json(meta: Dict[str, str], key: str, what: str, default: Any = None) -> Any:
    if key not in meta:
        return default
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError:
        raise DoctorError(f"{what}: metadata '{key}' is not JSON: {meta[key]!r}") from None


# ----------------------------------------------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------------------------------------------

def read_text(path: str, where: str) -> str:
    """The UTF-8 text of a file, else a DoctorError naming it (``where``: e.g. ``"prompts file <path>"``)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise DoctorError(f"{where}: not UTF-8 text: {e}") from None


def jsonl_records(text: str, where: str) -> Iterator[Tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-empty line of JSONL text; a malformed line is a DoctorError
    naming ``where`` (the file) and the line."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise DoctorError(f"{where}, line {n}: malformed JSON: {e}") from None


def read_prompts(path: str, tokenizer=None, *, vocab_size: Optional[int] = None) -> List[List[int]]:
    """Prompts as lists of token ids.

    Formats: ``.json`` (a list whose entries are strings or lists of token ids), ``.jsonl`` (one such entry per
    line, or an object with a ``"prompt"``/``"text"``/``"input_ids"`` field), anything else: plain text, one prompt
    per non-empty line. Strings need a tokenizer (the target's); token ids are checked against ``vocab_size``.
    """
    p = require_file(path, "prompts file")
    text = read_text(p, f"prompts file {p}")
    entries: List[Any]
    if p.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DoctorError(f"prompts file {p}: malformed JSON: {e}") from None
        if isinstance(data, dict) and "prompts" in data:
            data = data["prompts"]
        if not isinstance(data, list):
            raise DoctorError(f"prompts file {p}: expected a JSON list of prompts (strings or token-id lists), "
                              f"got {type(data).__name__}")
        entries = data
    elif p.endswith(".jsonl"):
        entries = []
        for n, e in jsonl_records(text, f"prompts file {p}"):
            if isinstance(e, dict):
                for key in ("input_ids", "prompt", "text"):
                    if key in e:
                        e = e[key]
                        break
                else:
                    raise DoctorError(f"prompts file {p}, line {n}: an object needs 'input_ids', 'prompt' or 'text'")
            entries.append(e)
    else:
        entries = [line for line in text.splitlines() if line.strip()]
    if not entries:
        raise DoctorError(f"prompts file {p}: no prompts in it")
    out: List[List[int]] = []
    for i, e in enumerate(entries):
        if isinstance(e, str):
            if tokenizer is None:
                raise DoctorError(f"prompts file {p}: prompt {i} is text but this target has no tokenizer; give "
                                  "prompts as token ids (a .json list of lists of integers)")
            ids = list(tokenizer(e, add_special_tokens=True)["input_ids"])
        elif isinstance(e, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in e):
            ids = list(e)
        else:
            raise DoctorError(f"prompts file {p}: prompt {i} is {type(e).__name__} {str(e)[:60]!r}; expected a "
                              "string or a list of integer token ids")
        if not ids:
            raise DoctorError(f"prompts file {p}: prompt {i} is empty")
        if vocab_size is not None:
            bad = [v for v in ids if not 0 <= v < vocab_size]
            if bad:
                raise DoctorError(f"prompts file {p}: prompt {i} has token id {bad[0]} outside the target's "
                                  f"vocabulary 0..{vocab_size - 1}")
        out.append(ids)
    return out


# ----------------------------------------------------------------------------------------------------------------
# threads / device
# ----------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def torch_threads(n: Optional[int]) -> Iterator[None]:
    """Run with ``n`` intra-op threads (restored afterwards). Tiny models run fastest on one thread: with more,
    each small kernel pays for waking the others, and on a loaded 2-core machine they spin against each other."""
    import torch

    if not n:
        yield
        return
    cores = os.cpu_count() or 1
    if not 1 <= int(n) <= cores:
        raise DoctorError(f"--threads {n}: expected 1..{cores} (this machine's CPUs)")
    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def pick_device(name: Optional[str]) -> str:
    """'cpu', 'cuda' or 'auto' (CUDA when present) -> a torch device string; DoctorError for CUDA without a GPU."""
    import torch

    name = (name or "auto").lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DoctorError(f"--device {name}: no CUDA device is available here (use --device cpu)")
    if name != "cpu" and not name.startswith("cuda"):
        raise DoctorError(f"--device {name!r}: expected auto, cpu or cuda[:N]")
    return name


def fmt_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain left-aligned text table."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
