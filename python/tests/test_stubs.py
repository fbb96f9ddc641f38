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


def stub_members():
    """{class name: the names its stub defines (methods, properties, attributes)}."""
    out = {}
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names = set()
            for x in node.body:
                if isinstance(x, ast.FunctionDef):
                    names.add(x.name)
                elif isinstance(x, ast.AnnAssign) and isinstance(x.target, ast.Name):
                    names.add(x.target.id)
                elif isinstance(x, ast.Assign):
                    names.update(t.id for t in x.targets if isinstance(t, ast.Name))
            out[node.name] = names
    return out


def test_stub_classes_name_every_public_member():
    """Every public method and property a bound class has is in its stub (and the stub names
    nothing the class lacks): a binding added without its stub fails here."""
    missing = {}
    for name, members in stub_members().items():
        cls = getattr(ext, name, None)
        # enums (their values and name/value are members) and exceptions (their fields are set per
        # instance) are left to test_stubs_match_the_module
        if not isinstance(cls, type) or hasattr(cls, "__members__") or issubclass(cls, BaseException):
            continue
        own = {n for n in vars(cls) if not n.startswith("_")}
        extra = {n for n in members if not n.startswith("_") and not hasattr(cls, n)}
        if own - members or extra:
            missing[name] = dict(not_in_stub=sorted(own - members), not_in_class=sorted(extra))
    assert not missing, missing
