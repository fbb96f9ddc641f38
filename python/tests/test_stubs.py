"""The type stubs (kvtier/_kvtier.pyi) name exactly what the module exports, and every public
class and function has a docstring with an example or a description."""
import ast
import pathlib

import kvtier
import kvtier._kvtier as ext

STUB = pathlib.Path(kvtier.__file__).with_name("_kvtier.pyi")
ALIASES = {"Buffer", "Tensor", "Bytes", "TokenIds", "DeadlineLike", "Values", "Ints"}  # typing helpers only
OPTIONAL = {"MpiCommunicator"}  # built only where kvtier::mpi and mpi4py's headers are found


def stub_names():
    tree = ast.parse(STUB.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names - ALIASES


def test_stubs_match_the_module():
    exported = {n for n in dir(ext) if not n.startswith("_")} | {"__version__"}
    assert stub_names() - (OPTIONAL - exported) == exported


def test_docstrings():
    for n in dir(ext):
        obj = getattr(ext, n)
        if n.startswith("_") or not callable(obj) or isinstance(obj, type) and issubclass(obj, int):
            continue
        assert (obj.__doc__ or "").strip(), n
    for cls in (kvtier.Store, kvtier.Chunker, kvtier.RemoteStore, kvtier.MemoryStore, kvtier.Deadline,
                kvtier.Connector, kvtier.KvLayout, kvtier.KvCacheView, kvtier.InprocWorld):
        assert "    " in cls.__doc__  # an indented example
    for meth in (kvtier.Store.get, kvtier.Store.put, kvtier.Store.exists, kvtier.Chunker.keys,
                 kvtier.Connector.step, kvtier.Connector.load, kvtier.Connector.save, kvtier.Connector.wait_for_layer):
        assert "\n" in meth.__doc__
