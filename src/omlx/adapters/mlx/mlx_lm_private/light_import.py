"""Import mlx-lm without importing ``transformers`` (about 1 s of every start here).

mlx-lm's package imports ``tokenizer_utils``, and ``generate`` (the batcher omlx runs on)
imports ``transformers`` at module level, for names it uses only when a Hugging Face
tokenizer is actually loaded: ``AutoTokenizer``, ``PreTrainedTokenizerFast`` (the base of
one tokenizer class it registers) and two classes named in annotations and one identity
check. ``transformers``' own import scans its whole model tree (0.9-1.1 s measured here,
the largest single cost between ``omlx serve`` and its first token), and omlx reads
``tokenizer.json`` itself (``models.tokenizer_loader``).

So mlx-lm's package is imported (the first time, from anywhere, once ``install`` has put
a finder first on ``sys.meta_path``: ``omlx.adapters.mlx`` does) with stand-ins for those names in ``sys.modules``, and
the stand-ins are taken out again straight after: any later ``import transformers``
(mlx-vlm, a tokenizer only transformers reads) gets the real package. The first use of a
stand-in (``AutoTokenizer.from_pretrained`` through mlx-lm's own loader) calls
``real_transformers``: it imports the real package and puts the real classes where the
stand-ins were in ``tokenizer_utils``, so every function of that module sees them from
then on, and its own classes (``TokenizerWrapper``, the detokenizers) stay the ones
everybody holds. The stand-in classes are never instantiated.

Where ``transformers`` is imported already (a test, a library user), nothing is stood in.
While mlx-lm's package runs (a third of a second), another thread's ``import transformers``
would get the stand-ins: nothing in omlx imports it on another thread then (the model
loading thread is the one importing mlx-lm; the HTTP stack never imports transformers).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.RLock()
_stood_in = False  # mlx-lm's tokenizer_utils holds stand-ins (until real_transformers)


def install() -> None:
    """Make the first ``import mlx_lm`` (from anywhere) a light one; idempotent and cheap."""
    if not any(isinstance(f, _LightFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LightFinder())


def import_mlx_lm() -> None:
    """Import ``mlx_lm`` with its ``generate`` and ``utils`` (light, if it is the first import)."""
    install()
    importlib.import_module("mlx_lm.generate")
    importlib.import_module("mlx_lm.utils")


class _LightFinder(importlib.abc.MetaPathFinder):
    """Finds ``mlx_lm`` as the path finder does, and runs its package import with the
    stand-ins in ``sys.modules`` (only while it runs, and only if transformers is not
    imported already)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "mlx_lm" or "transformers" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LightLoader(spec.loader)
        return spec


class _LightLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        global _stood_in
        with _lock:
            stand_ins = _stand_in_modules() if "transformers" not in sys.modules else {}
            sys.modules.update(stand_ins)
            try:
                self._loader.exec_module(module)  # mlx_lm/__init__: convert, generate, utils
                _stood_in = bool(stand_ins)
            finally:
                for name, stand_in in stand_ins.items():
                    if sys.modules.get(name) is stand_in:
                        del sys.modules[name]


def imported_without_transformers() -> bool:
    """Whether mlx-lm's tokenizer module still holds the stand-ins (for logs and tests)."""
    return _stood_in


def real_transformers() -> None:
    """Re-run mlx-lm's ``tokenizer_utils`` with the real ``transformers`` (once; thread-safe)."""
    global _stood_in
    with _lock:
        if not _stood_in:
            return
        transformers = importlib.import_module("transformers")
        # A second copy of tokenizer_utils, run with the real package (it registers its
        # NewlineTokenizer, a subclass of the real fast tokenizer, with the real
        # AutoTokenizer); only the names that came from the stand-ins move into the module
        # mlx-lm and omlx hold, so its classes and functions keep their identity.
        spec = importlib.util.find_spec("mlx_lm.tokenizer_utils")
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        held = sys.modules["mlx_lm.tokenizer_utils"]
        for name in _FROM_TRANSFORMERS:
            setattr(held, name, getattr(fresh, name))
        sys.modules["mlx_lm.generate"].PreTrainedTokenizer = transformers.PreTrainedTokenizer
        _stood_in = False
        log.info("transformers imported: a tokenizer needs it (its import takes about a second)")


# The names of mlx-lm's tokenizer_utils that come from transformers, or subclass its classes.
_FROM_TRANSFORMERS = (
    "AutoTokenizer",
    "PreTrainedTokenizerFast",
    "PreTrainedTokenizerBase",
    "NewlineTokenizer",
)


class _StandIn:
    """A class mlx-lm names at import; any real use switches to the real package first."""

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        real_transformers()
        real = getattr(importlib.import_module("transformers"), cls.__name__)
        return real.from_pretrained(*args, **kwargs)

    @classmethod
    def register(cls, *args: Any, **kwargs: Any) -> None:
        """``AutoTokenizer.register`` at mlx-lm's import: the reload registers for real."""

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:  # an identity mlx-lm checks
        raise NotImplementedError("a stand-in class is never instantiated")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} is a stand-in: call real_transformers() before using it"
        )


def _stand_in_modules() -> dict[str, types.ModuleType]:
    names = (
        "AutoTokenizer",
        "PreTrainedTokenizer",
        "PreTrainedTokenizerFast",
        "PreTrainedTokenizerBase",
    )
    classes = {name: type(name, (_StandIn,), {"__module__": "transformers"}) for name in names}
    package = types.ModuleType("transformers", "omlx's import-time stand-in (light_import)")
    package.__path__ = []  # a package, so its stand-in submodule below imports
    base = types.ModuleType("transformers.tokenization_utils_base")
    for name, cls in classes.items():
        setattr(package, name, cls)
    base.PreTrainedTokenizerBase = classes["PreTrainedTokenizerBase"]
    package.tokenization_utils_base = base
    return {"transformers": package, "transformers.tokenization_utils_base": base}
