"""mlx-lm's private names appear only in ``adapters/mlx/mlx_lm_private/``, the one door to them
(behind its version check): every other module of ``src/omlx`` reaches them through it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "omlx"
DOOR = SRC / "adapters" / "mlx" / "mlx_lm_private"
DOOR_MODULE = "omlx.adapters.mlx.mlx_lm_private"

# The private names of mlx-lm 0.32's batcher (``BatchGenerator``, ``PromptProcessingBatch``,
# ``GenerationBatch``, their module helpers) and of ``mlx_lm.models.cache``: attributes
# set on ``self`` and methods and classes named with an underscore. A new mlx-lm may add
# some: add them here.
MLX_LM_PRIVATE = frozenset(
    {
        "_BaseCache",
        "_buffer",
        "_copy",
        "_counters",
        "_current_logprobs",
        "_current_tokens",
        "_currently_processing",
        "_default_stop_sequences",
        "_extend_cache",
        "_find_uids",
        "_generation_batch",
        "_idx",
        "_lengths",
        "_lru",
        "_lrus",
        "_make_batch",
        "_matchers",
        "_merge_caches",
        "_n_bytes",
        "_n_bytes_by_type",
        "_next",
        "_next_logprobs",
        "_next_tokens",
        "_normalize_logits_processors",
        "_normalize_samplers",
        "_num_tokens",
        "_offset",
        "_old_wired_limit",
        "_ordering",
        "_prompt_batch",
        "_right_pad_prompts",
        "_right_padding",
        "_size",
        "_step",
        "_stream",
        "_temporal_order",
        "_token_context",
        "_trie",
        "_trim",
        "_uid_count",
        "_unprocessed_sequences",
        "_update_concat",
        "_update_in_place",
    }
)


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each use of an mlx-lm private name in ``source``.

    A use is: an underscore name imported from ``mlx_lm``; a known private name read or
    written on any object but ``self`` (``batch._idx``, ``generator._prompt_batch``) or
    reached through ``super()``; on ``self``, in a class that derives from mlx-lm (or from
    the door's classes) or that does not define the name itself; a method of such a class
    named like one of mlx-lm's private ones (an override); a private name in ``getattr`` and
    its kin. omlx's own ``self._next`` in a class of its own is not one.
    """
    tree = ast.parse(source)
    roots = _mlx_lm_roots(tree)
    found: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlx_lm"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.add((node.lineno, f"imports {alias.name} from {node.module}"))
        elif isinstance(node, ast.Call) and _is_name(node.func, "getattr", "setattr", "hasattr"):
            for arg in node.args[1:2]:
                if isinstance(arg, ast.Constant) and arg.value in MLX_LM_PRIVATE:
                    found.add((node.lineno, f"{node.func.id}(..., {arg.value!r})"))
    _Visitor(roots, found).visit(tree)
    return sorted(found)


def _mlx_lm_roots(tree: ast.Module) -> set[str]:
    """Names bound in this module to mlx-lm, the door package, or what they hold."""
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mlx_lm" or alias.name.startswith(DOOR_MODULE):
                    roots.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] == "mlx_lm" or module.startswith(DOOR_MODULE):
                roots |= {alias.asname or alias.name for alias in node.names}
    return roots


class _Visitor(ast.NodeVisitor):
    def __init__(self, roots: set[str], found: set[tuple[int, str]]) -> None:
        self.roots = roots
        self.found = found
        self.derived: set[str] = set()  # classes of this module built on mlx-lm's
        self.classes: list[tuple[bool, set[str]]] = []  # (derived, names it defines itself)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        derived = any(_root(base) in self.roots | self.derived for base in node.bases)
        if derived:
            self.derived.add(node.name)
        own = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for sub in ast.walk(node):
            for target in _targets(sub):
                if isinstance(target, ast.Attribute) and _is_name(target.value, "self"):
                    own.add(target.attr)
                elif isinstance(target, ast.Name):
                    own.add(target.id)
        if derived:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in MLX_LM_PRIVATE:
                    self.found.add((item.lineno, f"overrides {item.name}"))
        self.classes.append((derived, own))
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in MLX_LM_PRIVATE and self._private(node):
            self.found.add((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "_BaseCache":
            self.found.add((node.lineno, node.id))

    def _private(self, node: ast.Attribute) -> bool:
        if not _is_name(node.value, "self", "cls"):
            return True  # another object's private field, or super()'s
        if not self.classes:
            return True
        derived, own = self.classes[-1]
        return derived or node.attr not in own


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in _flat(target)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return _flat(node.target)
    return []


def _flat(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        return [t for e in target.elts for t in _flat(e)]
    return [target]


def _root(expr: ast.expr) -> str:
    while isinstance(expr, ast.Attribute | ast.Subscript | ast.Call):
        expr = expr.value if not isinstance(expr, ast.Call) else expr.func
    return expr.id if isinstance(expr, ast.Name) else ""


def _is_name(expr: ast.expr, *names: str) -> bool:
    return isinstance(expr, ast.Name) and expr.id in names


def test_private_mlx_lm_names_stay_behind_the_door() -> None:
    modules = [p for p in sorted(SRC.rglob("*.py")) if DOOR not in p.parents]
    assert len(modules) > 100  # the walk found the tree
    wrong = [
        f"{path.relative_to(SRC.parent.parent)}:{line}: {what}"
        for path in modules
        for line, what in private_uses(path.read_text(encoding="utf-8"))
    ]
    assert not wrong, "mlx-lm's private state outside mlx_lm_private/:\n" + "\n".join(wrong)


def test_the_door_is_where_the_names_are() -> None:
    """The check would see them: the door itself uses them (it is not scanning nothing)."""
    used = {
        what
        for path in sorted(DOOR.rglob("*.py"))
        for _, what in private_uses(path.read_text(encoding="utf-8"))
    }
    for expected in ("generator._prompt_batch", "batch._idx", "overrides _step", "_BaseCache"):
        assert any(expected in what for what in used), (expected, sorted(used))


def test_the_check_tells_mlx_lm_s_private_names_from_omlx_s_own() -> None:
    source = """
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.models.cache import _BaseCache

class Own:
    def __init__(self):
        self._next = 0
    def _step(self):
        return self._next

class Mixin:
    def grow(self):
        return self._num_tokens

class Steps(GenerationBatch):
    def _step(self):
        return super()._step()

class Later(Steps):
    def size(self):
        return self._size

def hook(generator, batch):
    generator._prompt_batch = batch
    return getattr(batch, "_idx"), batch.uids
"""
    found = {what for _, what in private_uses(source)}
    assert found == {
        "imports _BaseCache from mlx_lm.models.cache",
        "self._num_tokens",
        "overrides _step",
        "super()._step",
        "self._size",
        "generator._prompt_batch",
        "getattr(..., '_idx')",
    }, found
