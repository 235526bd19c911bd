"""A pickle opcode walker for torch's ``data.pkl``: finds storages, never runs anything.

The walker reads opcodes as :func:`pickletools.genops` would (a faster reader built from
pickletools' own opcode table) and keeps a tiny model of the unpickler's stack. Globals stay inert markers (a module name and an attribute name),
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

import gc
import io
import pickletools
import struct
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


# -- reading opcodes -------------------------------------------------------------------

_U2, _I4, _U4, _U8 = (struct.Struct(f) for f in ("<H", "<i", "<I", "<Q"))
_F8 = struct.Struct(">d")
# how each pickletools argument type is read; anything else (the text forms of protocols
# 0 and 1) goes through pickletools' own reader
_FAST = {"uint1": 1, "uint2": 2, "int4": 3, "uint4": 4, "uint8": 5, "float8": 6,
         "bytes1": 7, "bytes4": 8, "bytes8": 9, "bytearray8": 10, "unicodestring1": 11,
         "unicodestring4": 12, "unicodestring8": 13, "string1": 14, "string4": 15,
         "long1": 16, "long4": 17}
_SLOW = 99


def _decode_table() -> list:
    table: list = [None] * 256
    for op in pickletools.opcodes:
        kind = 0 if op.arg is None else _FAST.get(op.arg.name, _SLOW)
        table[ord(op.code)] = (op.name, kind, op.arg.reader if op.arg else None)
    return table


_DECODE = _decode_table()


def read_ops(data: bytes):
    """Yield ``(opcode name, argument)`` as :func:`pickletools.genops` does, faster.

    Raises ValueError on an unknown opcode or a pickle that ends early."""
    n = len(data)
    pos = 0
    text = None
    while pos < n:
        entry = _DECODE[data[pos]]
        if entry is None:
            raise ValueError(f"unknown pickle opcode {data[pos]:#x} at {pos}")
        name, kind, reader = entry
        pos += 1
        if kind == 0:
            arg = None
        elif kind == 1:
            arg = data[pos]
            pos += 1
        elif kind <= 6:
            st = (_U2, _I4, _U4, _U8, _F8)[kind - 2]
            arg = st.unpack_from(data, pos)[0]
            pos += st.size
        elif kind <= 17:
            if kind in (7, 11, 14, 16):
                ln = data[pos]
                pos += 1
            elif kind in (8, 12, 15, 17):
                ln = (_I4 if kind in (15, 17) else _U4).unpack_from(data, pos)[0]
                pos += 4
            else:
                ln = _U8.unpack_from(data, pos)[0]
                pos += 8
            if ln < 0 or pos + ln > n:
                raise ValueError(f"pickle argument runs past the end at {pos}")
            raw = data[pos:pos + ln]
            pos += ln
            if kind <= 9:
                arg = raw
            elif kind == 10:
                arg = bytearray(raw)
            elif kind <= 13:
                arg = raw.decode("utf-8", "surrogatepass")
            elif kind <= 15:
                arg = raw.decode("latin-1")
            else:
                arg = int.from_bytes(raw, "little", signed=True)
        else:
            if text is None:
                text = io.BytesIO(data)
            text.seek(pos)
            arg = reader(text)
            pos = text.tell()
        yield name, arg
        if name == "STOP":
            return
    raise ValueError("pickle ends without STOP")


# -- the walker ------------------------------------------------------------------------

class _Walker:
    def __init__(self) -> None:
        self.stack: list = []
        self.metastack: list[list] = []
        self.memo: dict = {}
        self.scan = PickleScan()
        self.root = None
        self.ops = {name: getattr(self, "op_" + name.lower()) for name in _HANDLED}

    def pop_mark(self) -> list:
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def run(self, data: bytes) -> PickleScan:
        ops = self.ops
        try:
            for name, arg in read_ops(data):
                handler = ops.get(name)
                if handler is not None:
                    handler(arg)
                elif name in _PUSH_ARG:
                    self.stack.append(arg)
                elif name in _PUSH_UNKNOWN:
                    self.stack.append(None)
                # PROTO, FRAME, READONLY_BUFFER: nothing to model
        except _Stop:
            self.scan.complete = True
        except Exception:   # noqa: BLE001 - damaged pickles: keep what was found
            pass
        if self.root is None:
            base = self.metastack[0] if self.metastack else self.stack
            self.root = base[0] if base else None
        self.scan.names = _human_names(self.root)
        return self.scan

    # one method per opcode family; ``arg`` is the decoded argument
    def op_binput(self, arg) -> None:
        self.memo[arg] = self.stack[-1]

    op_long_binput = op_put = op_binput

    def op_memoize(self, _) -> None:
        self.memo[len(self.memo)] = self.stack[-1]

    def op_binget(self, arg) -> None:
        self.stack.append(self.memo.get(arg))

    op_long_binget = op_get = op_binget

    def op_none(self, _) -> None:
        self.stack.append(None)

    def op_newtrue(self, _) -> None:
        self.stack.append(True)

    def op_newfalse(self, _) -> None:
        self.stack.append(False)

    def op_mark(self, _) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def op_empty_tuple(self, _) -> None:
        self.stack.append(())

    def op_tuple1(self, _) -> None:
        self.stack[-1] = (self.stack[-1],)

    def op_tuple2(self, _) -> None:
        st = self.stack
        if len(st) < 2:
            raise IndexError("TUPLE2")
        st[-2:] = [(st[-2], st[-1])]

    def op_tuple3(self, _) -> None:
        st = self.stack
        if len(st) < 3:
            raise IndexError("TUPLE3")
        st[-3:] = [(st[-3], st[-2], st[-1])]

    def op_tuple(self, _) -> None:
        items = self.pop_mark()
        self.stack.append(tuple(items))

    def op_empty_list(self, _) -> None:
        self.stack.append(_Seq())

    op_empty_set = op_empty_list

    def op_list(self, _) -> None:
        items = self.pop_mark()
        self.stack.append(_Seq(items))

    op_frozenset = op_list

    def op_empty_dict(self, _) -> None:
        self.stack.append(_Map())

    def op_dict(self, _) -> None:
        items = self.pop_mark()
        self.stack.append(_Map(zip(items[0::2], items[1::2])))

    def op_append(self, _) -> None:
        v = self.stack.pop()
        _append(self.stack[-1], [v])

    def op_appends(self, _) -> None:
        items = self.pop_mark()
        _append(self.stack[-1], items)

    op_additems = op_appends

    def op_setitem(self, _) -> None:
        st = self.stack
        v = st.pop()
        k = st.pop()
        _setitems(st[-1], [(k, v)])

    def op_setitems(self, _) -> None:
        items = self.pop_mark()
        _setitems(self.stack[-1], list(zip(items[0::2], items[1::2])))

    def op_global(self, arg) -> None:
        module, _, name = arg.partition(" ")
        self.stack.append(_Global(module, name))

    def op_stack_global(self, _) -> None:
        st = self.stack
        name = st.pop()
        module = st.pop()
        ok = isinstance(module, str) and isinstance(name, str)
        st.append(_Global(module, name) if ok else None)

    def op_reduce(self, _) -> None:
        st = self.stack
        args = st.pop()
        func = st.pop()
        st.append(self.reduce(func, args))

    def op_newobj(self, _) -> None:
        st = self.stack
        args = st.pop()
        cls = st.pop()
        st.append(_Obj(cls, args))

    def op_newobj_ex(self, _) -> None:
        self.stack.pop()
        self.op_newobj(None)

    def op_obj(self, _) -> None:
        items = self.pop_mark()
        self.stack.append(_Obj(items[0], tuple(items[1:])))

    def op_inst(self, arg) -> None:
        module, _, name = arg.partition(" ")
        items = self.pop_mark()
        self.stack.append(_Obj(_Global(module, name), tuple(items)))

    def op_build(self, _) -> None:
        st = self.stack
        state = st.pop()
        if isinstance(st[-1], _Obj):
            st[-1].state = state

    def op_binpersid(self, _) -> None:
        self.stack.append(self.persistent(self.stack.pop()))

    def op_pop(self, _) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_pop_mark(self, _) -> None:
        self.pop_mark()

    def op_dup(self, _) -> None:
        self.stack.append(self.stack[-1])

    def op_stop(self, _) -> None:
        self.root = self.stack.pop() if self.stack else None
        raise _Stop

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


_HANDLED = tuple(name[3:].upper() for name in vars(_Walker) if name.startswith("op_"))
_PUSH_ARG = frozenset((
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
    "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8",
))
_PUSH_UNKNOWN = frozenset(("PERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER"))


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
                for v in obj.args:
                    if isinstance(v, tuple) and v and isinstance(v[0], _Storage):
                        v = v[0]    # rebuild arguments passed on (_rebuild_from_type_v2)
                    kids.append((v, path, depth + 1))
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
    # The model allocates many small objects and no cycles worth collecting mid-walk,
    # so the cyclic collector is paused for the walk (it would run many times over a
    # large data.pkl for nothing). It is re-enabled only if it was enabled on entry.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _Walker().run(data)
    finally:
        if paused:
            gc.enable()
