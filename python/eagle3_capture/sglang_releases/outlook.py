"""The same draft ids on every modelled release at once, grouped into spans with the same outcome: what changes if
the user upgrades or downgrades SGLang (``doctor check``'s "stock SGLang on other releases")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .catalogue import ERROR_AT_LOAD, FAMILY_DEEPSEEK_V2, RELEASES, model_support_error
from .stock_capture import NativeCapture, native_capture
from .versions import KNOWN_VERSIONS


@dataclass(frozen=True)
class ReleaseSpan:
    """Consecutive releases on which the same ids give the same outcome (``native``: that of the first one)."""

    first: str
    last: str
    native: NativeCapture

    @property
    def versions(self) -> Tuple[str, ...]:
        i, j = KNOWN_VERSIONS.index(self.first), KNOWN_VERSIONS.index(self.last)
        return KNOWN_VERSIONS[i:j + 1]

    def label(self) -> str:
        return self.first if self.first == self.last else f"{self.first} .. {self.last}"

    def contains(self, version: str) -> bool:
        return version in self.versions


def release_outlook(ids: Optional[Sequence[int]], num_layers: int, hidden_size: int,
                    family: str = FAMILY_DEEPSEEK_V2, model_types: Sequence[Optional[str]] = (), *,
                    cuda_graphs: bool = True) -> List[ReleaseSpan]:
    """The outcome of the same draft ids on every modelled release, grouped into spans of consecutive releases
    with the same outcome (stored, captured, error kind and when; releases that cannot load the model at all get
    their own spans): what changes if the user upgrades or downgrades SGLang."""
    spans: List[ReleaseSpan] = []
    key_prev = None
    for r in RELEASES:
        why = model_support_error(r, model_types)
        if why is not None:
            nat = NativeCapture(family, None if ids is None else tuple(ids), num_layers, hidden_size, (), (), (),
                                why, r.version, ERROR_AT_LOAD)
            key = ("unsupported", why)
        else:
            nat = native_capture(ids, num_layers, hidden_size, r, family, cuda_graphs=cuda_graphs)
            key = nat.outcome()
        if spans and key == key_prev:
            spans[-1] = ReleaseSpan(spans[-1].first, r.version, spans[-1].native)
        else:
            spans.append(ReleaseSpan(r.version, r.version, nat))
        key_prev = key
    return spans
