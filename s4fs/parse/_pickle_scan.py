"""A pickle opcode walker for torch's ``data.pkl``: finds storages, never runs anything.

The walker reads opcodes with :func:`pickletools.genops` and keeps a tiny model of the
unpickler's stack. Globals stay inert markers (a module name and an attribute name),
REDUCE/NEWOBJ/BUILD build inert call records, and nothing the pickle names is ever
imported or called: a malicious pickle is just data here. What comes out:

* each persistent id ``('storage', StorageType, key, location, numel)``: the storage key,
  its dtype (from the storage type, or for ``UntypedStorage`` from the ``dtype`` argument
  of the enclosing ``torch._utils._rebuild_tensor_v3`` call) and its size in bytes;
* best effort, a human name per storage: the path of keys from the root object to the
  first tensor that uses it (``"encoder.layer.0.attention.self.query.weight"``,
  ``"optimizer.state.0.exp_avg"``).

Malformed or truncated pickles yield whatever was found before the damage.
"""

from __future__ import annotations

import io
import pickletools
from dataclasses import dataclass, field

from s4fs.codec import CodecError, lookup

# typed storage classes torch writes (torch.storage._dtype_to_storage_type_map)
_STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
}
_UNTYPED = "UntypedStorage"
_MAX_DEPTH = 64          # path components kept for a human name


@dataclass
class StorageInfo:
    key: str
    dtype: str          # s4fs.codec dtype name; "bytes" when unknown
    nbytes: int
    untyped: bool       # numel was a byte count; dtype may be refined by a v3 rebuild


@dataclass
class PickleScan:
    storages: dict[str, StorageInfo] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)    # storage key -> human name
    complete: bool = False                                  # walked to STOP cleanly


def dtype_name(name: str) -> str | None:
    """The codec name of a torch dtype attribute name, or None if the codec lacks it."""
    try:
        return lookup(name).name
    except CodecError:
        return None


def itemsize(dtype: str) -> int:
    return lookup(dtype).itemsize


# -- inert values of the model stack ---------------------------------------------------

class _Global:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def is_torch(self) -> bool:
        return self.module == "torch" or self.module.startswith("torch.")


class _Storage:
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


class _Obj:
    """The inert result of REDUCE / NEWOBJ / OBJ / INST, plus what was set into it."""

    __slots__ = ("func", "args", "items", "elems", "state")

    def __init__(self, func, args) -> None:
        self.func, self.args = func, args
        self.items: list | None = None
        self.elems: list | None = None
        self.state = None

    def storage(self) -> _Storage | None:
        a = self.args
        if isinstance(a, tuple) and a and isinstance(a[0], _Storage):
            return a[0]
        return None


class _Map(list):
    """A dict as a list of (key, value) pairs: pickled keys need not be hashable here."""


class _Seq(list):
    """A list or set."""


class _Stop(Exception):
    pass


# -- the walker ------------------------------------------------------------------------

class _Walker:
    def __init__(self) -> None:
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict = {}
        self.scan = PickleScan()
        self.root = None

    def pop_mark(self) -> list:
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def run(self, data: bytes) -> PickleScan:
        try:
            for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
                self.do(op.name, arg)
        except _Stop:
            self.scan.complete = True
        except Exception:   # noqa: BLE001 - damaged pickles: keep what was found
            pass
        if self.root is None:
            base = self.metastack[0] if self.metastack else self.stack
            self.root = base[0] if base else None
        self.scan.names = _human_names(self.root)
        return self.scan

    def do(self, op: str, arg) -> None:  # noqa: C901 - one branch per opcode family
        st = self.stack
        if op in _PUSH_ARG:
            st.append(arg)
        elif op in _PUSH_CONST:
            st.append(_PUSH_CONST[op])
        elif op in ("BINPUT", "LONG_BINPUT", "PUT"):
            self.memo[arg] = st[-1]
        elif op == "MEMOIZE":
            self.memo[len(self.memo)] = st[-1]
        elif op in ("BINGET", "LONG_BINGET", "GET"):
            st.append(self.memo.get(arg))
        elif op == "MARK":
            self.metastack.append(st)
            self.stack = []
        elif op == "EMPTY_TUPLE":
            st.append(())
        elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(op[-1])
            if len(st) < n:
                raise IndexError(op)
            t = tuple(st[-n:])
            del st[-n:]
            st.append(t)
        elif op == "TUPLE":
            items = self.pop_mark()
            self.stack.append(tuple(items))
        elif op in ("EMPTY_LIST", "EMPTY_SET"):
            st.append(_Seq())
        elif op in ("LIST", "FROZENSET"):
            items = self.pop_mark()
            self.stack.append(_Seq(items))
        elif op == "EMPTY_DICT":
            st.append(_Map())
        elif op == "DICT":
            items = self.pop_mark()
            self.stack.append(_Map(zip(items[0::2], items[1::2])))
        elif op == "APPEND":
            v = st.pop()
            _append(st[-1], [v])
        elif op in ("APPENDS", "ADDITEMS"):
            items = self.pop_mark()
            _append(self.stack[-1], items)
        elif op == "SETITEM":
            v = st.pop()
            k = st.pop()
            _setitems(st[-1], [(k, v)])
        elif op == "SETITEMS":
            items = self.pop_mark()
            _setitems(self.stack[-1], list(zip(items[0::2], items[1::2])))
        elif op == "GLOBAL":
            module, _, name = arg.partition(" ")
            st.append(_Global(module, name))
        elif op == "STACK_GLOBAL":
            name = st.pop()
            module = st.pop()
            ok = isinstance(module, str) and isinstance(name, str)
            st.append(_Global(module, name) if ok else None)
        elif op == "REDUCE":
            args = st.pop()
            func = st.pop()
            st.append(self.reduce(func, args))
        elif op == "NEWOBJ":
            args = st.pop()
            cls = st.pop()
            st.append(_Obj(cls, args))
        elif op == "NEWOBJ_EX":
            st.pop()
            args = st.pop()
            cls = st.pop()
            st.append(_Obj(cls, args))
        elif op == "OBJ":
            items = self.pop_mark()
            self.stack.append(_Obj(items[0], tuple(items[1:])))
        elif op == "INST":
            module, _, name = arg.partition(" ")
            items = self.pop_mark()
            self.stack.append(_Obj(_Global(module, name), tuple(items)))
        elif op == "BUILD":
            state = st.pop()
            if isinstance(st[-1], _Obj):
                st[-1].state = state
        elif op == "BINPERSID":
            st.append(self.persistent(st.pop()))
        elif op == "PERSID":
            st.append(None)
        elif op == "POP":
            if st:
                st.pop()
            else:
                self.pop_mark()
        elif op == "POP_MARK":
            self.pop_mark()
        elif op == "DUP":
            st.append(st[-1])
        elif op == "STOP":
            self.root = st.pop() if st else None
            raise _Stop
        elif op in ("EXT1", "EXT2", "EXT4", "NEXT_BUFFER"):
            st.append(None)
        # PROTO, FRAME, READONLY_BUFFER: nothing to model

    def persistent(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            return None
        cls, key, numel = pid[1], pid[2], pid[4]
        if not (isinstance(cls, _Global) and cls.is_torch() and isinstance(key, str)
                and isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0):
            return None
        if key not in self.scan.storages:
            if cls.name == _UNTYPED:
                info = StorageInfo(key, "bytes", numel, True)
            else:
                dt = _STORAGE_DTYPES.get(cls.name)
                info = (StorageInfo(key, dt, numel * itemsize(dt), False) if dt
                        else StorageInfo(key, "bytes", numel, True))
            self.scan.storages[key] = info
        return _Storage(key)

    def reduce(self, func, args) -> _Obj:
        obj = _Obj(func, args)
        if (isinstance(func, _Global) and func.module == "torch._utils"
                and func.name == "_rebuild_tensor_v3"):
            storage = obj.storage()
            info = self.scan.storages.get(storage.key) if storage else None
            if info is not None and info.untyped and info.dtype == "bytes":
                dt = args[6] if len(args) > 6 else None
                if isinstance(dt, _Global) and dt.module == "torch":
                    info.dtype = dtype_name(dt.name) or "bytes"
        return obj


_PUSH_ARG = frozenset((
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
))
_PUSH_CONST = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def _append(target, items: list) -> None:
    if isinstance(target, _Seq):
        target.extend(items)
    elif isinstance(target, _Obj):
        if target.elems is None:
            target.elems = []
        target.elems.extend(items)


def _setitems(target, pairs: list) -> None:
    if isinstance(target, _Map):
        target.extend(pairs)
    elif isinstance(target, _Obj):
        if target.items is None:
            target.items = []
        target.items.extend(pairs)


def _key_text(k) -> str | None:
    if isinstance(k, str):
        return k
    if isinstance(k, (int, float)) and not isinstance(k, bool):
        return str(k)
    return None


def _human_names(root) -> dict[str, str]:
    """Storage key -> dotted path of the first tensor (in pickle order) that uses it."""
    names: dict[str, str] = {}
    seen: set[int] = set()
    todo = [(root, (), 0)]
    while todo:
        obj, path, depth = todo.pop()
        if isinstance(obj, _Storage):
            if path:
                names.setdefault(obj.key, ".".join(path))
            continue
        if isinstance(obj, _Obj):
            s = obj.storage()
            if s is not None:
                if path:
                    names.setdefault(s.key, ".".join(path))
                continue
        if not isinstance(obj, (_Obj, _Map, _Seq, tuple)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if depth >= _MAX_DEPTH:
            continue
        kids: list = []

        def keyed(pairs) -> None:
            for k, v in pairs:
                t = _key_text(k)
                if t is not None:
                    kids.append((v, path + (t,), depth + 1))

        def indexed(seq) -> None:
            kids.extend((v, path + (str(i),), depth + 1) for i, v in enumerate(seq))

        if isinstance(obj, _Obj):
            if isinstance(obj.args, tuple):
                kids.extend((v, path, depth + 1) for v in obj.args)
            keyed(obj.items or ())
            indexed(obj.elems or ())
            kids.append((obj.state, path, depth + 1))
        elif isinstance(obj, _Map):
            keyed(obj)
        else:
            indexed(obj)
        todo.extend(reversed(kids))
    return names


def scan_pickle(data: bytes) -> PickleScan:
    """Walk a pickle without running it; see the module docstring."""
    return _Walker().run(data)
