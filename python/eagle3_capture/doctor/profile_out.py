"""``--profile-out`` of ``doctor accept`` and ``doctor online``: the expected-acceptance profile written from the
histogram of correct drafts the doctor predicts (SGLang's loop replayed, summed over the prompts), for the plugin
(``EAGLE3_CAPTURE_PROFILE``) and ``doctor watch --profile``. The file format is ``acceptance.profile``'s alone; this
module checks the path before the long work starts, writes the file, and says in the report what went where."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..acceptance import profile as acceptance_profile
from .arg_types import output_file
from .common import DoctorError

FLAG = "--profile-out"


def check_profile_out(path: Optional[str]) -> None:
    """A DoctorError (one line) unless ``path`` can be written: not a directory or a special file, in a directory a
    file can be created in. Run before any model loads (the flag's type checks the same; Options built in code do
    not pass through argparse)."""
    if path is None:
        return
    if not isinstance(path, str):
        raise DoctorError(f"{FLAG}: expected a file path, got {type(path).__name__}")
    try:
        output_file(path)
    except argparse.ArgumentTypeError as e:
        raise DoctorError(f"{FLAG}: {e}") from None


@dataclass(frozen=True)
class WrittenProfile:
    """Where the profile went and what it says."""

    path: str
    profile: acceptance_profile.Profile

    def to_json(self) -> dict:
        return {"path": self.path, **self.profile.to_json()}

    def lines(self) -> List[str]:
        p = self.profile
        att, _ = p.attempts_accepted()
        per = ", ".join(f"{i + 1}: {'-' if a is None else f'{a:.3f}'} (n={n})"
                        for i, (a, n) in enumerate(zip(p.acceptance(), att)))
        return [f"expected-acceptance profile written to {self.path}",
                f"  for {p.speculative.text()}; {p.prompts} prompts, {p.verifies} verifies predicted; accept length "
                f"{p.accept_length:.3f}",
                f"  acceptance per draft position (of the verifies that reached it): {per}",
                f"  serve it with EAGLE3_CAPTURE_PROFILE={self.path}, or watch against it with "
                f"`eagle3-capture doctor watch --profile {self.path}`"]


def write_profile(path: str, source: str, flags: Tuple[int, int, int], histogram: Sequence[int], prompts: int,
                  draft: str, target: str) -> WrittenProfile:
    """Make the profile (validated as a read one is) and write it atomically to ``path`` (its missing directories
    made, as the doctor's other outputs); DoctorError on anything wrong."""
    steps, topk, draft_tokens = flags
    try:
        prof = acceptance_profile.make(source, acceptance_profile.Speculative(int(steps), int(topk), int(draft_tokens)),
                                       list(histogram), int(prompts), draft=str(draft), target=str(target))
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        written = acceptance_profile.write(prof, path)
    except (acceptance_profile.ProfileError, ValueError, OSError) as e:
        raise DoctorError(f"{FLAG}: {e}") from None
    return WrittenProfile(written, prof)


__all__ = ["FLAG", "check_profile_out", "WrittenProfile", "write_profile"]
