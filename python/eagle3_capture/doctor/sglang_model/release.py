"""Which SGLang release the doctor's serving model (this package: the flags' rules, the speculative loop, the
responses) was read in -- the release table's ``serving_model`` rows (sglang_releases/catalogue.py) -- and how it
stands in for the release a server runs (:func:`model_for`): every finding and report line of the package names
the release it modelled (:data:`MODELLED`), never another."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from ... import sglang_releases as releases

MODELLED = releases.serving_model_release().version


@dataclass(frozen=True)
class ServingModel:
    """The model used for a server on release ``serves`` (None: not known): read in ``release``."""

    release: str
    serves: Optional[str] = None

    @property
    def exact(self) -> bool:
        """Whether the model was read in the very release the server runs (or no release was named)."""
        return self.serves is None or self.serves == self.release

    def resolves(self) -> str:
        """How a report line says who resolved the flags: ``as SGLang X resolves them`` only when X is the release
        the server runs; else the rules read in X, saying the server's own release was not read."""
        if self.exact:
            return f"as SGLang {self.release} resolves them"
        return f"as the rules read in SGLang {self.release} resolve them ({self._not_read()})"

    def refuses(self) -> str:
        """``SGLang X refuses them``, worded like :meth:`resolves`."""
        if self.exact:
            return f"SGLang {self.release} refuses them"
        return f"the rules read in SGLang {self.release} refuse them ({self._not_read()})"

    def _not_read(self) -> str:
        return f"SGLang {self.serves}'s own are not modelled"


def model_for(rel: Union[None, str, "releases.SGLangRelease"] = None) -> ServingModel:
    """The serving model for a server on ``rel`` (None: a server whose release is not known): the modelled release
    itself when the table has its model, else the newest modelled one."""
    if rel is None:
        return ServingModel(MODELLED)
    r = releases.release(rel)
    return ServingModel(r.version if r.serving_model else MODELLED, r.version)


__all__ = ["MODELLED", "ServingModel", "model_for"]
