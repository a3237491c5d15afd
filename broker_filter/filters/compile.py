"""AST -> fast evaluator, by generating Python source with bound constants.

Theory of operation: each condition becomes one Python expression over the message, returning
True / False / None, using walrus temporaries for Kleene AND / OR / NOT.  Client text never becomes
source: every literal, property name and helper is bound as a constant (`C0`, `C1`, ...) in the
function's namespace, and the generated text holds only our own identifiers and operators.

Fast paths are inlined where the outcome is certain from the value's exact class (a `str` property
against a string literal, an int against an int literal, a float against a float literal); every
other case calls `runtime.Semantics`, which owns the dialect rules.  Long AND / OR chains and deep
nesting are split into helper functions so the generated code stays within Python's nesting limits.
`x = 'a' OR x = 'b' OR ...` over one identifier becomes a set lookup where the dialect allows it.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from typing import Any

from ..amqp import types as t
from . import ast
from .runtime import (
    SQL_ARITHMETIC,
    SQL_COMPARATORS,
    Abort,
    Semantics,
    kleene_all,
    kleene_any,
    like_form,
    like_matcher,
    sql_condition,
    sql_field,
    sql_in,
    sql_equal,
    sql_like,
    sql_sign,
    sql_utc,
    sql_value,
    string_test_matcher,
)
from .view import HEADERS

# Exact classes whose Python value is their JMS value (ulong is not: >= 2**63 reads as a negative long).
_INT_CLASSES = frozenset({int, t.ubyte, t.ushort, t.uint, t.byte, t.short, t.int32, t.long, t.timestamp})
_FLOAT_CLASSES = frozenset({float, t.float32})
_MIRROR = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PY_OP = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_EMPTY: dict = {}

_MAX_CHAIN = 16  # items of one AND/OR chain inlined in one expression
_MAX_DEPTH = 10  # condition nesting inlined before a helper function is split off


class _Compiler:
    def __init__(self, selector: ast.Selector, dialect: Any):
        self.d = dialect
        self.sem = Semantics(dialect, selector.convert_strings)
        self.consts: dict[str, Any] = {}
        self.const_ids: dict[tuple, str] = {}
        self.functions: list[str] = []
        self.counter = itertools.count()
        self.reads: set[str] = set()

    # ------------------------------------------------------------------ names
    def const(self, value: Any, key: Any = None) -> str:
        k = (type(value), value) if key is None else key
        try:
            name = self.const_ids.get(k)
        except TypeError:
            name, k = None, None
        if name is None:
            name = f"C{len(self.consts)}"
            self.consts[name] = value
            if k is not None:
                self.const_ids[k] = name
        return name

    def tmp(self) -> str:
        return f"_t{next(self.counter)}"

    # ------------------------------------------------------------------ values
    def value(self, node: Any) -> str:
        if isinstance(node, ast.Literal):
            v = node.value
            if node.type == "int":
                v = t.int32(v)
            return self.const(v, ("lit", node.type, repr(v)))  # repr: 0.0 and -0.0 are different constants
        if isinstance(node, ast.Ident):
            if node.kind == "property":
                self.reads.add("application_properties")
                return f"ap.get({self.const(node.key)})"
            if node.kind == "annotation":
                self.reads.add("message_annotations")
                return f"ma.get({self.const(t.symbol(node.key) if node.key.isascii() else node.key, ('sym', node.key))})"
            reads, getter = HEADERS[node.key]
            self.reads.update(reads)
            return f"{self.const(getter, ('hdr', node.key))}(m)"
        if isinstance(node, ast.Unary):  # sign
            inner = self.value(node.operand)
            if node.op == "+":
                return f"{self.const(self.sem.plus, ('plus',))}({inner})"
            return f"{self.const(self.sem.negate, ('neg',))}({inner})"
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            fn = self.const(self.sem.arithmetic(node.op), ("arith", node.op))
            return f"{fn}({self.value(node.left)}, {self.value(node.right)})"
        raise TypeError(f"not a value: {node!r}")  # pragma: no cover - the parser checks

    # ------------------------------------------------------------------ conditions
    def cond(self, node: Any, depth: int = 0) -> str:
        if depth >= _MAX_DEPTH and not isinstance(node, (ast.Literal, ast.Ident)):
            return self.split(node)
        if isinstance(node, ast.Literal):
            return "True" if node.value else "False"
        if isinstance(node, ast.Ident):
            x = self.tmp()
            return f"(True if ({x} := {self.value(node)}) is True else (None if {x} is None else False))"
        if isinstance(node, ast.Unary):  # NOT
            x = self.tmp()
            return f"(None if ({x} := {self.cond(node.operand, depth + 1)}) is None else {x} is False)"
        if isinstance(node, ast.Binary):
            if node.op in ast.LOGICAL_OPS:
                return self.chain(node, depth)
            return self.compare(node)
        if isinstance(node, ast.In):
            return self.in_(node)
        if isinstance(node, ast.Like):
            return self.like(node)
        if isinstance(node, ast.IsNull):
            return f"({self.value(node.operand)} is {'not ' if node.negated else ''}None)"
        if isinstance(node, ast.Between):
            return self.between(node)
        if isinstance(node, ast.StringTest):
            return self.string_test(node)
        if isinstance(node, ast.Tags):
            return self.tags(node)
        raise TypeError(f"not a condition: {node!r}")  # pragma: no cover

    def split(self, node: Any) -> str:
        """Compile `node` as a helper function of its own and return a call to it."""
        name = f"_f{next(self.counter)}"
        body = self.cond(node, 0)
        self.functions.append(f"def {name}(m, r, ap, ma):\n    return {body}\n")
        self.consts.setdefault(name, None)  # reserve the name; filled in by exec
        return f"{name}(m, r, ap, ma)"

    def chain(self, node: ast.Binary, depth: int) -> str:
        op = node.op
        items = ast.chain_items(op, node)
        if op == "OR" and self.d.or_chain_to_set:
            items = merge_equalities(items)
            if len(items) == 1:
                return self.cond(items[0], depth)
        if len(items) > _MAX_CHAIN:
            groups = [items[i : i + _MAX_CHAIN] for i in range(0, len(items), _MAX_CHAIN)]
            parts = [self.split(ast.balanced(op, g)) for g in groups]
        else:
            parts = [self.cond(i, depth + 1) for i in items]
        if self.sem.error:
            # RocketMQ: an evaluation error anywhere decides, so every operand is evaluated (no
            # short circuit), left to right, before the three-valued combination.
            combine = self.const(kleene_all if op == "AND" else kleene_any, ("kleene", op))
            return f"{combine}(({', '.join(parts)},))"
        names = [self.tmp() for _ in parts]
        short, other = ("False", "True") if op == "AND" else ("True", "False")
        text = f"(None if ({' or '.join(f'{n} is None' for n in names)}) else {other})"
        for name, part in reversed(list(zip(names, parts))):
            text = f"({short} if ({name} := {part}) is {short} else {text})"
        return text

    def compare(self, node: ast.Binary) -> str:
        op, left, right = node.op, node.left, node.right
        if self.d.null_equality == "artemis" and op in ("=", "<>"):
            # NULL handling differs for = / <> (and by side, so no mirroring): always through the
            # dialect's rules, with a fast path for a str against a string literal on the right.
            slow = self.const(self.sem.comparator(op), ("cmp", op))
            if isinstance(right, ast.Literal) and right.type == "string":
                x = self.tmp()
                c = self.const(right.value, ("lit", "string", repr(right.value)))
                return f"(({x} {_PY_OP[op]} {c}) if ({x} := {self.value(left)}).__class__ is str else {slow}({x}, {c}))"
            return f"{slow}({self.value(left)}, {self.value(right)})"
        if isinstance(left, ast.Literal) and not isinstance(right, ast.Literal) and not self.d.string_coercion:
            op, left, right = _MIRROR[op], right, left  # RocketMQ coerces by side: no mirroring there
        slow = self.const(self.sem.comparator(op), ("cmp", op))
        x = self.tmp()
        lv = self.value(left)
        if isinstance(right, ast.Literal):
            c = self.value(right)
            fast = None
            if right.type == "string" and op in ("=", "<>"):
                fast = f"{x}.__class__ is str"
            elif right.type in ("int", "long"):
                fast = f"{x}.__class__ in {self.const(_INT_CLASSES, ('intclasses',))}"
            elif right.type == "double":
                fast = f"{x}.__class__ in {self.const(_FLOAT_CLASSES, ('floatclasses',))} and {x} == {x}"
            if fast is not None:
                return f"(None if ({x} := {lv}) is None else (({x} {_PY_OP[op]} {c}) if {fast} else {slow}({x}, {c})))"
            return f"(None if ({x} := {lv}) is None else {slow}({x}, {c}))"
        return f"{slow}({lv}, {self.value(right)})"

    def _predicate(self, operand: Any, match: Any, negated: bool, fast: str | None) -> str:
        """A string predicate: NULL -> UNKNOWN, str -> inline `fast`, anything else -> dialect rules."""
        x = self.tmp()
        pred = self.const(self.sem.predicate(match, negated))
        if fast is None:
            return f"{pred}({self.value(operand)})"
        fast = fast.replace("$", x)
        if negated:
            fast = f"not ({fast})"
        return f"(None if ({x} := {self.value(operand)}) is None else (({fast}) if {x}.__class__ is str else {pred}({x})))"

    def in_(self, node: ast.In) -> str:
        if any(v.type != "string" for v in node.values):
            fn = self.const(self.sem.numeric_in(tuple(_literal_value(v) for v in node.values), node.negated))
            return f"{fn}({self.value(node.operand)})"
        values = frozenset(v.value for v in node.values)
        s = self.const(values)
        return self._predicate(node.operand, values.__contains__, node.negated, f"$ in {s}")

    def like(self, node: ast.Like) -> str:
        matcher = like_matcher(node.pattern, node.escape)
        form = like_form(node.pattern, node.escape)
        if form is not None:
            kind, text = form
            c = self.const(text, ("lit", "string", repr(text)))
            fast = {"equals": f"$ == {c}", "prefix": f"$.startswith({c})", "suffix": f"$.endswith({c})", "contains": f"{c} in $"}[kind]
        else:
            fast = f"{self.const(matcher)}($)"
        return self._predicate(node.operand, matcher, node.negated, fast)

    def string_test(self, node: ast.StringTest) -> str:
        v = node.value
        if not v:  # RocketMQ: an empty search string never matches, NOT forms included
            return "False"
        c = self.const(v, ("lit", "string", repr(v)))
        match = string_test_matcher(node.op, v)
        fast = {"CONTAINS": f"{c} in $", "STARTSWITH": f"$.startswith({c})", "ENDSWITH": f"$.endswith({c})"}[node.op]
        if node.negated:
            fast = f"not ({fast})"
        x = self.tmp()
        test = self.const(self.sem.string_test(match, node.negated))
        return f"(({fast.replace('$', x)}) if ({x} := {self.value(node.operand)}).__class__ is str else {test}({x}))"

    def between(self, node: ast.Between) -> str:
        fn = self.const(self.sem.between(node.negated), ("between", node.negated))
        lo, hi = node.low, node.high
        if (
            isinstance(lo, ast.Literal)
            and isinstance(hi, ast.Literal)
            and lo.type in ("int", "long")
            and hi.type in ("int", "long")
        ):
            x = self.tmp()
            clo, chi = self.value(lo), self.value(hi)
            inside = f"{clo} <= {x} <= {chi}"
            if node.negated:
                inside = f"not ({inside})"
            ints = self.const(_INT_CLASSES, ("intclasses",))
            return (
                f"(None if ({x} := {self.value(node.operand)}) is None else "
                f"(({inside}) if {x}.__class__ in {ints} else {fn}({x}, {clo}, {chi})))"
            )
        return f"{fn}({self.value(node.operand)}, {self.value(lo)}, {self.value(hi)})"

    def tags(self, node: ast.Tags) -> str:
        if node.tags is None:
            return "True"
        self.reads.add("properties")
        x = self.tmp()
        getter = self.const(HEADERS["TAGS"][1], ("hdr", "TAGS"))
        return f"(({x} := {getter}(m)) is not None and {x} in {self.const(frozenset(node.tags))})"


def merge_equalities(items: list) -> list:
    """`x = 'a' OR x = 'b'` (same identifier, string literals) -> `x IN ('a', 'b')`."""
    groups: dict[Any, list] = {}
    out: list = []
    for item in items:
        key = None
        if isinstance(item, ast.Binary) and item.op == "=":
            left, right = item.left, item.right
            if isinstance(left, ast.Literal):
                left, right = right, left
            if isinstance(left, ast.Ident) and isinstance(right, ast.Literal) and right.type == "string":
                key = left
                values = (right,)
        elif isinstance(item, ast.In) and not item.negated and isinstance(item.operand, ast.Ident):
            if all(v.type == "string" for v in item.values):
                key = item.operand
                values = item.values
        if key is None:
            out.append(item)
            continue
        if key not in groups:
            groups[key] = []
            out.append(("group", key))
        groups[key].extend(values)
    result = []
    for item in out:
        if isinstance(item, tuple) and item and item[0] == "group":
            vals = groups[item[1]]
            result.append(ast.In(item[1], tuple(vals)) if len(vals) > 1 else ast.Binary("=", item[1], vals[0]))
        else:
            result.append(item)
    return result


def _literal_value(lit: ast.Literal) -> Any:
    return t.int32(lit.value) if lit.type == "int" else lit.value


# ---------------------------------------------------------------------------- large selectors
# A large selector compiles to a tree of nodes instead of generated source: each node is one tuple
# whose first item is a module-level step function `f(node, m, ap, ma)` (shared by every selector:
# no function object, cell or closure per node), the rest its operands, which are nodes again, or
# constants.  Equal leaves (a property, a literal) are one node.  A node costs 56-72 bytes where a
# closure cost 250-400 (a function object, its cells and closure tuple), so a selector at the
# length limit compiles to tens of KiB, not hundreds (issue 43: filter memory is bounded by the
# selector's length, at about 25 bytes per character; `compiled_size` estimates it).


def _n_lit(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return n[1]


def _n_prop(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return ap.get(n[1])


def _n_annotation(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return ma.get(n[1])


def _n_header(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return n[1](m)


def _n_apply1(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, fn, x): fn(x)
    x = n[2]
    return n[1](x[0](x, m, ap, ma))


def _n_apply2(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, fn, a, b): fn(a, b)
    a, b = n[2], n[3]
    return n[1](a[0](a, m, ap, ma), b[0](b, m, ap, ma))


# apply2 with a property (its key) or a constant in place of an operand node: no leaf node at all
def _n_apply2_pc(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return n[1](ap.get(n[2]), n[3])


def _n_apply2_cp(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return n[1](n[2], ap.get(n[3]))


def _n_apply2_pp(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    return n[1](ap.get(n[2]), ap.get(n[3]))


def _n_apply2_pv(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    b = n[3]
    return n[1](ap.get(n[2]), b[0](b, m, ap, ma))


def _n_apply2_vp(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    a = n[2]
    return n[1](a[0](a, m, ap, ma), ap.get(n[3]))


def _n_apply2_cv(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    b = n[3]
    return n[1](n[2], b[0](b, m, ap, ma))


def _n_apply2_vc(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    a = n[2]
    return n[1](a[0](a, m, ap, ma), n[3])


_APPLY2 = {("p", "c"): _n_apply2_pc, ("c", "p"): _n_apply2_cp, ("p", "p"): _n_apply2_pp, ("p", "v"): _n_apply2_pv,
           ("v", "p"): _n_apply2_vp, ("c", "v"): _n_apply2_cv, ("v", "c"): _n_apply2_vc}


def _n_match_p(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, pred, match, key)
    return n[1](n[2], ap.get(n[3]))


def _operand(node: tuple) -> tuple[str, Any]:
    """("p", key) for a property node, ("c", value) for a constant, else ("v", node)."""
    f = node[0]
    if f is _n_prop:
        return "p", node[1]
    if f is _n_lit:
        return "c", node[1]
    return "v", node


def _apply2(fn: Any, left: tuple, right: tuple) -> tuple:
    (lk, lv), (rk, rv) = _operand(left), _operand(right)
    step = _APPLY2.get((lk, rk))
    if step is None:
        return (_n_apply2, fn, left, right)
    return (step, fn, lv, rv)


_SET_SIZE = 32  # IN lists longer than this are a sorted tuple: 8 bytes an element, not a set's 30-60


def _membership(values: Any) -> Any:
    """`x in values` for an IN list of strings: a set lookup, or a binary search for long lists."""
    items = frozenset(values)
    if len(items) <= _SET_SIZE:
        return items.__contains__
    return functools.partial(_in_sorted, tuple(sorted(items)))


def _in_sorted(items: tuple, v: str) -> bool:
    i = bisect.bisect_left(items, v)
    return i < len(items) and items[i] == v


def _n_apply3(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, fn, a, b, c): fn(a, b, c)
    a, b, c = n[2], n[3], n[4]
    return n[1](a[0](a, m, ap, ma), b[0](b, m, ap, ma), c[0](c, m, ap, ma))


def _n_match(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, pred, match, x): pred(match, x)
    x = n[3]
    return n[1](n[2], x[0](x, m, ap, ma))


def _n_not(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    x = n[1]
    v = x[0](x, m, ap, ma)
    return None if v is None else not v


def _n_is_null(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    x = n[1]
    return x[0](x, m, ap, ma) is None


def _n_not_null(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    x = n[1]
    return x[0](x, m, ap, ma) is not None


def _n_or(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    unknown = False
    for x in n[1]:
        v = x[0](x, m, ap, ma)
        if v is True:
            return True
        if v is None:
            unknown = True
    return None if unknown else False


def _n_and(n: tuple, m: Any, ap: Any, ma: Any) -> Any:
    unknown = False
    for x in n[1]:
        v = x[0](x, m, ap, ma)
        if v is False:
            return False
        if v is None:
            unknown = True
    return None if unknown else True


def _n_every(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, combine, items): RocketMQ evaluates all
    return n[1](tuple([x[0](x, m, ap, ma) for x in n[2]]))


def _n_has_tag(n: tuple, m: Any, ap: Any, ma: Any) -> Any:  # (f, tags, getter)
    v = n[2](m)
    return v is not None and v in n[1]


_TRUE_NODE = (_n_lit, True)
_FALSE_NODE = (_n_lit, False)


class _Nodes:
    """The same semantics as `_Compiler`, as a tree of nodes (above): no `compile()` call, so building
    is cheap for very large selectors, at some cost per evaluation."""

    def __init__(self, selector: ast.Selector, dialect: Any):
        self.d = dialect
        self.sem = Semantics(dialect, selector.convert_strings)
        self.reads: set[str] = set()
        self.shared: dict[Any, Any] = {}  # equal leaves and per-operator functions, built once

    def once(self, key: Any, make: Any) -> Any:
        try:
            found = self.shared.get(key)
        except TypeError:  # an unhashable constant: not shared
            return make()
        if found is None:
            found = self.shared[key] = make()
        return found

    def value(self, node: Any) -> tuple:
        if isinstance(node, ast.Literal):
            v = _literal_value(node)
            return self.once(("lit", node.type, repr(v)), lambda: (_n_lit, v))
        if isinstance(node, ast.Ident):
            key = node.key
            if node.kind == "property":
                self.reads.add("application_properties")
                return self.once(("prop", key), lambda: (_n_prop, key))
            if node.kind == "annotation":
                self.reads.add("message_annotations")
                sym = t.symbol(key) if key.isascii() else key
                return self.once(("annotation", key), lambda: (_n_annotation, sym))
            reads, getter = HEADERS[key]
            self.reads.update(reads)
            return self.once(("header", key), lambda: (_n_header, getter))
        if isinstance(node, ast.Unary):
            fn = self.sem.plus if node.op == "+" else self.sem.negate
            return (_n_apply1, fn, self.value(node.operand))
        fn = self.once(("arith", node.op), lambda: self.sem.arithmetic(node.op))
        return _apply2(fn, self.value(node.left), self.value(node.right))

    def cond(self, node: Any) -> tuple:
        sem = self.sem
        if isinstance(node, ast.Literal):
            return _TRUE_NODE if node.value else _FALSE_NODE
        if isinstance(node, ast.Ident):
            return (_n_apply1, sem.condition, self.value(node))
        if isinstance(node, ast.Unary):
            return (_n_not, self.cond(node.operand))
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS:
            items = ast.chain_items(node.op, node)
            if node.op == "OR" and self.d.or_chain_to_set:
                items = merge_equalities(items)
            fns = tuple([self.cond(i) for i in items])
            if sem.error:  # RocketMQ: evaluate every operand, an error anywhere decides
                return (_n_every, kleene_any if node.op == "OR" else kleene_all, fns)
            return (_n_or if node.op == "OR" else _n_and, fns)
        if isinstance(node, ast.Binary):
            cmp = self.once(("cmp", node.op), lambda: sem.comparator(node.op))
            return _apply2(cmp, self.value(node.left), self.value(node.right))
        if isinstance(node, ast.IsNull):
            return (_n_not_null if node.negated else _n_is_null, self.value(node.operand))
        if isinstance(node, ast.Between):
            fn = self.once(("between", node.negated), lambda: sem.between(node.negated))
            return (_n_apply3, fn, self.value(node.operand), self.value(node.low), self.value(node.high))
        if isinstance(node, ast.In) and any(x.type != "string" for x in node.values):
            fn = sem.numeric_in(tuple(_literal_value(x) for x in node.values), node.negated)
            return (_n_apply1, fn, self.value(node.operand))
        if isinstance(node, ast.StringTest):
            if not node.value:
                return _FALSE_NODE
            test = sem.string_test(string_test_matcher(node.op, node.value), node.negated)
            return (_n_apply1, test, self.value(node.operand))
        if isinstance(node, (ast.In, ast.Like)):
            if isinstance(node, ast.In):
                match = _membership(x.value for x in node.values)
            else:
                match = like_matcher(node.pattern, node.escape)
            pred = self.once(("pred", node.negated), lambda: sem.predicate_of(node.negated))
            operand = self.value(node.operand)
            if operand[0] is _n_prop:
                return (_n_match_p, pred, match, operand[1])
            return (_n_match, pred, match, operand)
        if isinstance(node, ast.Tags):
            if node.tags is None:
                return _TRUE_NODE
            self.reads.add("properties")
            return (_n_has_tag, frozenset(node.tags), HEADERS["TAGS"][1])
        raise TypeError(f"not a condition: {node!r}")  # pragma: no cover


# `_no_cycle`: a compiled selector holds no reference cycle, so the memory of a link's filter comes back
# when its last user lets go (a link closed, the cache evicting it), by reference counting, not at the
# garbage collector's next full pass: `matches` does not call `evaluate` (which holds it), and generated
# functions are not left in their own namespace (only helpers a long chain splits off are, and they
# form the one small cycle left).  1,000 maximal selectors left ~780,000 objects for the collector.

# Selectors larger than this many nodes compile to nodes: Python's compile() of their generated
# source would cost more than the faster evaluation saves for a freshly attached link, and its code
# objects take several times the memory.
CLOSURE_THRESHOLD = 150


def _compile_closures(selector: ast.Selector, dialect: Any) -> tuple[Any, frozenset[str], str]:
    c = _Nodes(selector, dialect)
    root = c.cond(selector.expr)
    step = root[0]
    empty = _EMPTY

    def evaluate(m: Any, r: Any = None) -> Any:
        ap = m.application_properties
        ma = m.message_annotations
        try:
            return step(root, m, empty if ap is None else ap, empty if ma is None else ma)
        except Abort:  # RocketMQ: an evaluation error means the message is not delivered
            return False
        except Exception:  # evaluation never raises
            return None

    def matches(m: Any, r: Any = None) -> bool:  # (not through `evaluate`: see `_no_cycle`)
        ap = m.application_properties
        ma = m.message_annotations
        try:
            return step(root, m, empty if ap is None else ap, empty if ma is None else ma) is True
        except Exception:
            return False

    evaluate.matches = matches  # type: ignore[attr-defined]
    return evaluate, frozenset(c.reads), "<nodes>"


class _SqlClosures:
    """amqp-sql as a tree of closures over `runtime`'s amqp-sql operations.  Functions take (m, ap)."""

    def __init__(self) -> None:
        self.reads: set[str] = set()

    def value(self, node: Any) -> Any:
        if isinstance(node, ast.Literal):
            v = node.value
            return lambda m, ap: v
        if isinstance(node, ast.Ident):
            if node.kind == "property":
                self.reads.add("application_properties")
                key, conv = node.key, sql_value
                return lambda m, ap: conv(ap.get(key))
            reads, getter = sql_field(node.key)
            self.reads.update(reads)
            return lambda m, ap: getter(m)
        if isinstance(node, ast.Call):  # UTC()
            return lambda m, ap: sql_utc()
        if isinstance(node, ast.Unary) and node.op != "NOT":
            sign, inner = sql_sign(node.op), self.value(node.operand)
            return lambda m, ap: sign(inner(m, ap))
        if isinstance(node, ast.Binary) and node.op in ast.ARITHMETIC_OPS:
            fn, left, right = SQL_ARITHMETIC[node.op], self.value(node.left), self.value(node.right)
            return lambda m, ap: fn(left(m, ap), right(m, ap))
        return self.cond(node)  # a condition used as a value: True / False / None

    def cond(self, node: Any) -> Any:
        if isinstance(node, ast.Unary) and node.op == "NOT":
            inner = self.cond(node.operand)

            def not_(m: Any, ap: Any) -> Any:
                v = inner(m, ap)
                return None if v is None else not v

            return not_
        if isinstance(node, ast.Binary) and node.op in ast.LOGICAL_OPS:
            fns = [self.cond(i) for i in ast.chain_items(node.op, node)]
            combine = kleene_any if node.op == "OR" else kleene_all  # a generator: short-circuits
            return lambda m, ap: combine(f(m, ap) for f in fns)
        if isinstance(node, ast.Binary) and node.op in ast.COMPARISON_OPS:
            cmp, left, right = SQL_COMPARATORS[node.op], self.value(node.left), self.value(node.right)
            return lambda m, ap: cmp(left(m, ap), right(m, ap))
        if isinstance(node, ast.IsNull):
            get = self.value(node.operand)
            if node.negated:
                return lambda m, ap: get(m, ap) is not None
            return lambda m, ap: get(m, ap) is None
        if isinstance(node, ast.Like):
            pred, get = sql_like(node.pattern, node.escape, node.negated), self.value(node.operand)
            return lambda m, ap: pred(get(m, ap))
        if isinstance(node, ast.In):
            get = self.value(node.operand)
            if all(isinstance(x, ast.Literal) for x in node.values):
                pred = sql_in(tuple(x.value for x in node.values), node.negated)
                return lambda m, ap: pred(get(m, ap))
            items, negated = [self.value(x) for x in node.values], node.negated

            def is_in(m: Any, ap: Any) -> Any:
                v = get(m, ap)
                if v is None:
                    return None
                found = any(sql_equal(v, x) for x in (f(m, ap) for f in items) if x is not None)
                return not found if negated else found

            return is_in
        get = self.value(node)  # a literal, identifier or arithmetic as a condition
        return lambda m, ap: sql_condition(get(m, ap))


def _compile_sql(selector: ast.Selector) -> tuple[Any, frozenset[str], str]:
    c = _SqlClosures()
    root = c.cond(selector.expr)
    empty = _EMPTY

    def evaluate(m: Any, r: Any = None) -> Any:
        ap = m.application_properties
        try:
            return root(m, empty if ap is None else ap)
        except Exception:  # evaluation never raises
            return None

    def matches(m: Any, r: Any = None) -> bool:  # (not through `evaluate`: see `_no_cycle`)
        ap = m.application_properties
        try:
            return root(m, empty if ap is None else ap) is True  # a non-boolean result does not match
        except Exception:
            return False

    evaluate.matches = matches  # type: ignore[attr-defined]
    return evaluate, frozenset(c.reads), "<amqp-sql closures>"


def _select_all(m: Any, r: Any = None) -> bool:
    return True


def compile_ast(selector: ast.Selector, dialect: Any) -> tuple[Any, frozenset[str], str]:
    """-> (fn(message, receiver) -> True/False/None, sections read, generated source)."""
    if selector.expr is None:
        return _select_all, frozenset(), "def _selector(m, r=None):\n    return True\n"
    if dialect.filtex_sql:
        return _compile_sql(selector)
    if sum(1 for _ in itertools.islice(ast.walk(selector.expr), CLOSURE_THRESHOLD + 1)) > CLOSURE_THRESHOLD:
        return _compile_closures(selector, dialect)
    c = _Compiler(selector, dialect)
    body = c.cond(selector.expr)
    # RocketMQ: an evaluation error makes the selector FALSE; everywhere: evaluation never raises.
    pre = []
    if "application_properties" in c.reads or c.functions:
        pre.append("    ap = m.application_properties\n    if ap is None:\n        ap = _EMPTY\n")
    else:
        pre.append("    ap = _EMPTY\n")
    if "message_annotations" in c.reads or c.functions:
        pre.append("    ma = m.message_annotations\n    if ma is None:\n        ma = _EMPTY\n")
    else:
        pre.append("    ma = _EMPTY\n")
    preamble = "".join(pre)
    # RocketMQ: an evaluation error makes the selector FALSE; everywhere: evaluation never raises.
    source = "\n".join(c.functions) + (
        "def _selector(m, r=None):\n"
        f"{preamble}"
        "    try:\n"
        f"        return {body}\n"
        "    except Abort:\n"
        "        return False\n"
        "    except Exception:\n"
        "        return None\n"
        "\n"
        "def _matches(m, r=None):\n"
        f"{preamble}"
        "    try:\n"
        f"        return ({body}) is True\n"
        "    except Exception:\n"
        "        return False\n"
    )
    namespace: dict[str, Any] = {k: v for k, v in c.consts.items() if v is not None}
    namespace["_EMPTY"] = _EMPTY
    namespace["Abort"] = Abort
    code = compile(source, "<selector>", "exec")
    exec(code, namespace)  # noqa: S102 - source holds only generated names; literals are bound constants
    evaluate, matches = namespace.pop("_selector"), namespace.pop("_matches")  # (see `_no_cycle`)
    evaluate.matches = matches
    return evaluate, frozenset(c.reads), source
