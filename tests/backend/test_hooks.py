"""The backend is the ground floor (nothing under smalltrain/backend imports a layer above it) and its hooks
(backend/hooks.py): their defaults, and autograd's implementations installed at import (autograd/handoff.py)."""
import ast
import importlib.util
import pathlib

import pytest

import smalltrain
from smalltrain.autograd import engine, held
from smalltrain.backend import hooks

BACKEND = pathlib.Path(smalltrain.__file__).parent / "backend"
ABOVE = ("smalltrain.autograd", "smalltrain.ops", "smalltrain.nn", "smalltrain.tensor")
NOT_YET = {}   # backend file -> upward imports still allowed there (none)


def _imports(path):
    """The absolute names of the modules `path` imports, anywhere in it (functions' lazy imports too)."""
    package = "smalltrain." + ".".join(path.relative_to(BACKEND.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _within(name, packages):
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_nothing_under_backend_imports_autograd_ops_nn_or_tensor():
    sources = sorted(BACKEND.rglob("*.py"))
    assert len(sources) > 10
    found = {}
    for path in sources:
        rel = path.relative_to(BACKEND).as_posix()
        upward = {n for n in _imports(path) if _within(n, ABOVE) and not _within(n, NOT_YET.get(rel, ()))}
        if upward:
            found[rel] = sorted(upward)
    assert found == {}


def test_the_import_scan_sees_relative_and_lazy_imports():
    """The scan itself: a relative import two levels up inside a function is seen as the absolute name."""
    cuda = BACKEND / "cuda"
    names = _imports(cuda / "_common.py")
    assert "smalltrain.backend.hooks" in names and "smalltrain.backend.cuda.loader.kernel" in names
    # a lazy `from ..pool import ...` inside a function of the conv package
    assert "smalltrain.backend.cuda.pool.max_pool2d_backward_act" in _imports(cuda / "conv" / "__init__.py")


def test_autograd_installs_its_hooks_at_import():
    assert hooks.claim_grad is engine.claim_grad and hooks.defer_join is engine.defer_join
    assert (hooks.hold, hooks.flush, hooks.drop) == (held.hold, held.flush, held.drop)


@pytest.fixture
def bare_hooks():
    """A copy of backend/hooks.py as it is before autograd installs anything."""
    spec = importlib.util.spec_from_file_location("bare_hooks", BACKEND / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_defaults_offer_no_slot_join_now_and_hold_nothing(bare_hooks):
    log = []
    assert bare_hooks.claim_grad(object()) is None
    bare_hooks.defer_join(lambda: log.append("join"))
    bare_hooks.hold("out", lambda: log.append("launch"), "info")
    bare_hooks.flush()
    bare_hooks.drop()
    assert log == ["join", "launch"] and bare_hooks.held is None


def test_install_replaces_hooks_by_name_and_refuses_unknown_names(bare_hooks):
    def claim(array):
        return "slot"
    bare_hooks.install(claim_grad=claim)
    assert bare_hooks.claim_grad("x") == "slot"
    with pytest.raises(TypeError, match=r"no hooks named \['claim'\]"):
        bare_hooks.install(claim=claim)
