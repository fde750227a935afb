"""What a pickle would build, measured from its opcodes before anything is unpickled.

A pickle's memo lets one object appear many times: ``a = [t]`` then forty times ``a = [a, a]``
is a 2 KB stream whose object has 2^40 paths. Unpickling it is cheap (each list is built once),
but everything that walks the result as a tree afterwards (a structure check, `tree_flatten`,
`deepcopy`, a description) would never end, and unpickling itself hashes dict keys and calls
rebuild functions on their arguments, which expands a shared tuple the same way. So the
unpickler's work is bounded here first, in one pass over the opcodes, with each object counted
once by its place in the stream:

- the value the pickle returns, expanded as a tree (shared parts once per path), has at most
  `MAX_VALUES` containers and leaves and is at most `MAX_DEPTH` deep;
- nothing refers to itself (a list appended to itself, ...);
- a dict key is a plain value (str, int, ...), never a container, so hashing it is cheap;
- the arguments and states the unpickler passes to functions (tensor rebuilds, OrderedDict)
  come to at most `MAX_CALL_VALUES` values, expanded, in all.

Which functions may be called is not decided here: torch's weights-only unpickler refuses every
global outside its allowlist; `PickleShape.globals` names them for messages.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass

MAX_VALUES = 2**22
MAX_DEPTH = 64
MAX_CALL_VALUES = 2**24
# Containers, calls and globals, and opcodes, in the stream: bound this scan's own memory and
# time (a few microseconds an opcode; an honest file takes about twenty a tensor).
MAX_NODES = 2**20
MAX_OPCODES = 2**21

_LEAF = -1  # any value that contains nothing: numbers, bytes, None, bools, persistent ids' parts
_MARK = -2
_LEAVES = frozenset({
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
    "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES",
    "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "PERSID",
})
_STRINGS = frozenset({"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"})
_EMPTY = frozenset({"EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "EMPTY_SET"})
_PUT = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET = frozenset({"GET", "BINGET", "LONG_BINGET"})
_IGNORED = frozenset({"PROTO", "FRAME"})

# A stack entry: a node index (container, call or global), _LEAF, _MARK, or a str leaf (kept:
# STACK_GLOBAL names its global with two of them).
_Ref = int | str


@dataclass(frozen=True)
class PickleShape:
    """A pickle that passed: its value's size as a tree, its depth, and the globals it names."""

    values: int
    depth: int
    globals: tuple[str, ...]


class PickleShapeError(ValueError):
    """The pickle would cost unbounded work, or is malformed; the message says which."""


class _Graph:
    """The objects a pickle builds, as nodes with the refs they hold (children)."""

    def __init__(self) -> None:
        self.children: list[list[_Ref]] = []
        self.globals: list[str] = []
        self.calls: list[int] = []  # nodes whose children the unpickler passes to a function

    def node(self, children: list[_Ref]) -> int:
        if len(self.children) >= MAX_NODES:
            raise PickleShapeError(f"builds more than {MAX_NODES} containers")
        self.children.append(children)
        return len(self.children) - 1


def scan_pickle(data: bytes) -> PickleShape:
    """The shape of what unpickling `data` would build; PickleShapeError if it is unbounded
    (see the module docstring) or not a well-formed pickle."""
    graph = _Graph()
    try:
        root = _simulate(data, graph)
    except PickleShapeError:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as err:  # genops and the simulated stack
        raise PickleShapeError(f"is not a well-formed pickle ({err})") from None
    sizes, depths = _measure(graph)
    if isinstance(root, int) and root >= 0:
        values, depth = sizes[root], depths[root]
    else:
        values, depth = 1, 1
    if values > MAX_VALUES:
        raise PickleShapeError(
            f"holds more than {MAX_VALUES} values once its shared parts are expanded "
            "(a structure that repeats itself)"
        )
    if depth > MAX_DEPTH:
        raise PickleShapeError(f"nests deeper than {MAX_DEPTH} levels")
    call_values = sum(sizes[node] for node in graph.calls)
    if call_values > MAX_CALL_VALUES:
        raise PickleShapeError(
            f"passes more than {MAX_CALL_VALUES} values to the functions that rebuild it"
        )
    return PickleShape(values, depth, tuple(dict.fromkeys(graph.globals)))


def _pop_mark(stack: list[_Ref], marks: list[int]) -> list[_Ref]:
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def _add(graph: _Graph, target: _Ref, items: list[_Ref]) -> None:
    if not isinstance(target, int) or target < 0:
        raise PickleShapeError("adds items to something that is not a container")
    graph.children[target].extend(items)


def _set_items(graph: _Graph, target: _Ref, items: list[_Ref]) -> None:
    keys = items[0::2]
    if len(keys) != len(items[1::2]):
        raise PickleShapeError("sets a dict item without a value")
    if any(isinstance(key, int) and key >= 0 for key in keys):
        raise PickleShapeError("has a dict key that is a container; keys must be plain values")
    _add(graph, target, items)


def _simulate(data: bytes, graph: _Graph) -> _Ref:
    """Run the pickle machine on refs instead of objects; the ref of the value it returns."""
    stack: list[_Ref] = []
    marks: list[int] = []
    memo: dict[int, _Ref] = {}
    for count, (opcode, arg, _) in enumerate(pickletools.genops(data)):
        if count >= MAX_OPCODES:
            raise PickleShapeError(f"takes more than {MAX_OPCODES} pickle operations")
        name = opcode.name
        if name in _PUT:  # the most frequent first
            memo[_index(arg)] = stack[-1]
        elif name in _GET:
            stack.append(memo[_index(arg)])
        elif name in _LEAVES:
            stack.append(_LEAF)
        elif name in _STRINGS:
            stack.append(str(arg))
        elif name in _EMPTY:
            stack.append(graph.node([]))
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in _IGNORED:
            continue
        elif name in ("LIST", "TUPLE", "FROZENSET"):
            stack.append(graph.node(_pop_mark(stack, marks)))
        elif name == "DICT":
            node = graph.node([])
            _set_items(graph, node, _pop_mark(stack, marks))
            stack.append(node)
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            count = int(name[-1])
            if len(stack) < count or (marks and len(stack) - count < marks[-1]):
                raise PickleShapeError(f"{name} on too short a stack")
            items = stack[-count:]
            del stack[-count:]
            stack.append(graph.node(items))
        elif name == "APPEND":
            value = stack.pop()
            _add(graph, stack[-1], [value])
        elif name in ("APPENDS", "ADDITEMS"):
            items = _pop_mark(stack, marks)
            _add(graph, stack[-1], items)
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            _set_items(graph, stack[-1], [key, value])
        elif name == "SETITEMS":
            items = _pop_mark(stack, marks)
            _set_items(graph, stack[-1], items)
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "STACK_GLOBAL":
                qualname, module = stack.pop(), stack.pop()
                arg = f"{module} {qualname}"
            graph.globals.append(str(arg).replace(" ", "."))
            stack.append(graph.node([]))
        elif name in ("REDUCE", "NEWOBJ"):
            args, func = stack.pop(), stack.pop()
            graph.calls.append(node := graph.node([func, args]))
            stack.append(node)
        elif name == "NEWOBJ_EX":
            kwargs, args, cls = stack.pop(), stack.pop(), stack.pop()
            graph.calls.append(node := graph.node([cls, args, kwargs]))
            stack.append(node)
        elif name == "BUILD":
            state = stack.pop()
            _add(graph, stack[-1], [state])
            graph.calls.append(graph.node([state]))
        elif name == "BINPERSID":
            stack.append(graph.node([stack.pop()]))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
        elif name == "POP_MARK":
            _pop_mark(stack, marks)
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "STOP":
            if len(stack) != 1 or marks:
                raise PickleShapeError("stops with a malformed stack")
            return stack[0]
        else:
            raise PickleShapeError(f"uses the opcode {name}, which torch.save never writes")
    raise PickleShapeError("ends without a STOP opcode")


def _index(arg: object) -> int:
    if not isinstance(arg, int | str):
        raise PickleShapeError("names a memo entry without an index")
    return int(arg)


def _measure(graph: _Graph) -> tuple[list[int], list[int]]:
    """Each node's size as a tree and its depth, every node visited once (iterative post-order;
    a node met again while its own children are open is a cycle)."""
    count = len(graph.children)
    sizes, depths = [0] * count, [0] * count
    state = [0] * count  # 0 unseen, 1 open, 2 measured
    cap = MAX_CALL_VALUES + 1  # sizes saturate: 2^40 is as refused as 2^25 and stays cheap
    for start in range(count):
        if state[start]:
            continue
        pending = [start]
        while pending:
            node = pending[-1]
            if state[node] == 0:
                state[node] = 1
                for child in graph.children[node]:
                    if isinstance(child, int) and child >= 0:
                        if state[child] == 1:
                            raise PickleShapeError("holds a container that contains itself")
                        if state[child] == 0:
                            pending.append(child)
                continue
            pending.pop()
            if state[node] == 2:
                continue
            size, depth = 1, 0
            for child in graph.children[node]:
                if isinstance(child, int) and child >= 0:
                    size += sizes[child]
                    depth = max(depth, depths[child])
                else:
                    size += 1
                    depth = max(depth, 1)
            sizes[node], depths[node], state[node] = min(size, cap), depth + 1, 2
    return sizes, depths
