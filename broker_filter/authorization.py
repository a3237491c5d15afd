"""Who may do what on which address: the permission model of `[security]` (Artemis's security-settings).

Theory of operation
-------------------
`[security.roles]` gives each user a list of roles; each `[[security.settings]]` table has a `match` (an
address pattern) and, per operation, the roles granted it.  A request is (user, operation, address),
the operation one of `send`, `consume`, `browse`, `manage`, `durable`.  The *most specific* setting
whose `match` matches the address decides alone, as in Artemis: a setting's grants are not inherited
from less specific ones, so a specific setting that grants nothing refuses everything under it.  An
address no setting matches is refused.  With no settings at all, `Permissions.open()` allows
everything (`Permissions.is_open`: the daemon warns when it listens beyond loopback).

**Users.**  A PLAIN user is its `listener.users` name, a certificate or pass-through user the name the
daemon gives it, and an ANONYMOUS login is the user `anonymous` (the name `security.Identity` gives it;
a PLAIN user may not be called so when settings exist).  A user without an entry has no role.

**Patterns** are AMQ wildcard patterns (Artemis's wildcard syntax): words delimited by `.`, `*` is
exactly one word, `#` any number of words, zero included (`news.#` matches `news`, `news.uk` and
`news.uk.sport`).  As Artemis requires, `#` may only be the last word, and a match with an FQQN
`a::q` has no wildcard.  `*` and `#` are wildcards as whole words only, as in the daemon's address
rules: `news.eu*` is the literal word `eu*` (Artemis's regular expression would take it as a prefix).
Empty words are words (`a..b` has three, and `a.*` matches `a.`, where Artemis's regular expression
wants at least one character for `*`).  Case matters: addresses are case-sensitive in Artemis and
RabbitMQ, so `Alice.x` is another node than `alice.x`.

**Specificity** is Artemis's (`HierarchicalObjectRepository.MatchComparator`), on the matches that
match one address:

1. a match without `#` is more specific than one with `#`;
2. of two with `#`, the longer text (in characters) is more specific (`a.b.#` before `a.#`, and
   `*.private.#` before `alice.#`);
3. of two without `#`, one without `*` (an exact match) is more specific than one with `*`;
4. of two with `*`, the first word where one has `*` and the other a literal decides: the literal is
   more specific (`a.*.c` before `*.b.c`);

and where Artemis's comparator calls two matches equal (it then takes whichever its hash map lists
first), the tie is broken here by (4)'s rule, then by a scoped match before the bare `#` (in front of
RabbitMQ), then by the earlier setting in the file.  An FQQN `a::q` is decided by a setting whose match
is exactly `a::q` if there is one, else as the address `a` (Artemis's `SecurityStoreImpl`).

**Addresses name nodes**, and every spelling of one node is decided alike: the address and every
`match` are canonicalised to a node, by the upstream's address model (`upstream`), and matched as
nodes.  On the embedded broker and AMQ-style upstreams (`embedded`, `other`):

| client address | node |
|---|---|
| `a.b`, `anycast://a.b`, `multicast://a.b` | address `a.b` (one routing prefix is dropped) |
| `a.b::q` | the queue `q` of `a.b`: a setting matching exactly `a.b::q`, else as `a.b` |
| `/queue/x`, `/queues/x` | the address `/queue/x` (a literal name: no RabbitMQ forms) |

In front of RabbitMQ (`rabbitmq`), as RabbitMQ itself parses addresses (v1: `rabbit_routing_parser`,
`%2F` is `/`; v2: percent-encoded segments, RFC 3986):

| client address | node | shown as |
|---|---|---|
| `q`, `/queue/q`, `/amq/queue/q` (v1), `/queues/q` (v2) | the queue `q` | `/queues/q` |
| `/exchange/X/K` (v1), `/exchanges/X/K` (v2) | exchange `X`, routing key `K` | `/exchanges/X/K` |
| `/topic/K` (v1) | exchange `amq.topic`, key `K` | `/exchanges/amq.topic/K` |
| `/exchange/X`, `/exchange/X/`, `/exchanges/X` | exchange `X`, *every* key | `/exchanges/X/#` |
| `/queue`, the empty address | *every* queue | `/queues/#` |
| exchange `amq.default` (or the empty name) with key `K` | the queue `K` | `/queues/K` |
| `amq.fanout`, `amq.headers`, `amq.match`, any key | the exchange, *every* key (no key routes) | `/exchanges/X/#` |
| anything else starting with `/`, a bare name with `/`, a bad `%` escape | no node: refused | |

A v1 sender without a key (`/exchange/X`, `/queue`) publishes with each message's subject as the
routing key, so such an address stands for every key (every queue): only a setting covering all of
them grants it.  A wildcard word in an address (`/topic/alice.#`, a wildcard subscription `news.*` on
the embedded broker) stands for every address it covers: it is granted only if the most specific
setting covering all of it grants, and so does every more specific setting that covers part of it
(so `#` on `/topic/#` cannot read what `/topic/alice.#` keeps from bob).  Such a decision never grants
more than the addresses it covers would be granted one by one; it may refuse more (a pattern covered
only by the union of several settings is refused).

Patterns are canonicalised the same way, with two additions: the bare pattern `#` matches every node
(Artemis's catch-all), and a bare pattern other than `#` names queues (as a bare address does), so
`alice.#` is `/queues/alice.#`.  An exchange name in a pattern is literal, a key part may have
wildcards, and an exchange without a key part is the exchange with every key.

RabbitMQ 4's `/management` requests (`management_checks`) name queues and exchanges the same way: the
daemon parses the request's path as RabbitMQ does (`uri_string:normalize`: unreserved characters
decoded, dot segments removed; then each segment percent-decoded) and asks for `manage` on the queue
or exchange it touches, and for a binding `manage` on its destination plus `consume` on its source
with its key (the destination receives what a subscription with that key would).

Cost: the settings are compiled once per upstream kind into a word trie per node space (queues, each
exchange; the address space on AMQ-style upstreams) whose walk collects the matches of an address in
O(words) steps, however many settings there are; the decision per address (which settings must grant)
is cached in a bounded dictionary, so a check is a dictionary hit and a set intersection per setting.
Limits refuse, never fail: an address with wildcard words and more than 64 words is refused (its
decision searches settings against each word), and addresses longer than 1,024 characters are decided
every time rather than kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple
from urllib.parse import quote, unquote_to_bytes

OPERATIONS = ("send", "consume", "browse", "manage", "durable")
UPSTREAMS = ("embedded", "other", "rabbitmq")
ANONYMOUS_USER = "anonymous"
ANY_WORDS = "#"
ONE_WORD = "*"
FQQN = "::"
CACHE_SIZE = 4096
MAX_CACHED_ADDRESS = 1024  # characters: longer addresses are decided each time, never kept
MAX_WILDCARD_WORDS = 64  # an address with wildcard words and more words than this is refused

# Artemis's permission names, and what to write instead: none means the same as one of ours.
ARTEMIS_PERMISSIONS = {
    "createDurableQueue": "use `durable` (creating and removing durable subscriptions)",
    "deleteDurableQueue": "use `durable` (creating and removing durable subscriptions)",
    "createNonDurableQueue": "granted with `consume` (a non-durable subscription or dynamic queue is "
                             "made and removed by its consumer's attach and detach)",
    "deleteNonDurableQueue": "granted with `consume` (a non-durable subscription or dynamic queue is "
                             "made and removed by its consumer's attach and detach)",
    "createAddress": "granted with `send` or `consume` on it (addresses are made on first use), or "
                     "`manage` (declaring on RabbitMQ's /management)",
    "deleteAddress": "use `manage` (deleting on RabbitMQ's /management)",
    "view": "use `manage` (RabbitMQ's /management node; there is no read-only part)",
    "edit": "use `manage` (RabbitMQ's /management node)",
}

_VERBS = {"send": "send to", "consume": "consume from", "browse": "browse", "manage": "manage",
          "durable": "keep a durable subscription on"}
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class PatternError(ValueError):
    """A `match` (or an address) that cannot be used; the message says why.  `index`: the setting's
    position, when the error is one of a setting (the configuration names its key)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


# --------------------------------------------------------------------------------------------------
# Nodes: what an address or a pattern names


class Node(NamedTuple):
    """An address or pattern in canonical form.  `space` is the name space ("" for an AMQ-style
    address, "queue", or "exchange" + the exchange name); `words` the name's words (a queue name, a
    routing key, an address), wildcard words included; `fqqn` the whole `a::q` text of an FQQN (its
    `words` are the address's); `every` for the bare pattern `#`; `shown` the canonical text."""

    space: str
    words: tuple[str, ...]
    shown: str
    fqqn: str | None = None
    every: bool = False

    @property
    def wild(self) -> bool:
        return ANY_WORDS in self.words or ONE_WORD in self.words


def _words(name: str) -> tuple[str, ...]:
    return () if name == "" else tuple(name.split("."))


def _v2_decode(text: str) -> str:
    """RFC 3986 percent-decoding, strict (RabbitMQ 4 refuses a bad escape); the bytes must be UTF-8."""
    if "%" not in text:
        return text
    if _BAD_ESCAPE.search(text):
        raise PatternError(f"bad percent-encoding in {text!r}")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        raise PatternError(f"percent-encoding in {text!r} is not UTF-8") from None


def _v1_unescape(text: str) -> str:
    return text.replace("%2F", "/")  # rabbit_routing_parser:unescape/1: only `%2F`, upper case


def _queue(name: str) -> Node:
    if name == "":
        name = ANY_WORDS  # v1 subject routing through the default exchange: every queue
    return Node("queue", _words(name), f"/queues/{name}")


# RabbitMQ's built-in exchanges whose routing ignores the key (fanout, headers): any key of them reads
# everything, so a key names the whole exchange.
KEYLESS_EXCHANGES = frozenset({"amq.fanout", "amq.headers", "amq.match"})


def _exchange(exchange: str, key: str | None) -> Node:
    if exchange in ("", "amq.default"):
        return _queue(key or "")  # the default exchange routes to the queue its key names
    if not key or exchange in KEYLESS_EXCHANGES:
        key = ANY_WORDS  # no key: a v1 sender's subject, so every key
    return Node("exchange" + exchange, _words(key), f"/exchanges/{exchange}/{key}")


def rabbitmq_node(address: str) -> Node:
    """The node a RabbitMQ address names (see the table above); PatternError when RabbitMQ would not
    accept it either."""
    if address.startswith("/queues/"):
        rest = address[len("/queues/"):]
        if rest == "":
            raise PatternError("`/queues/` names no queue")
        return _queue(_v2_decode(rest))
    if address.startswith("/exchanges/"):
        parts = address[len("/exchanges/"):].split("/")
        if len(parts) > 2:
            raise PatternError("a v2 exchange address is `/exchanges/X` or `/exchanges/X/KEY` (encode `/` as %2F)")
        exchange = _v2_decode(parts[0])
        if exchange in ("", "amq.default"):
            raise PatternError("RabbitMQ refuses the default exchange in a v2 address: use `/queues/Q`")
        return _exchange(exchange, _v2_decode(parts[1]) if len(parts) > 1 else None)
    parts = address.split("/")
    if len(parts) == 1:
        return _queue(_v1_unescape(address))
    if parts[0] != "":
        raise PatternError("a bare queue name may not contain `/` (write %2F)")
    kind, rest = parts[1], parts[2:]
    if kind == "amq" and rest[:1] == ["queue"]:
        kind, rest = "amq/queue", rest[1:]
    if kind in ("queue", "amq/queue"):
        if kind == "queue" and rest == []:
            return _queue("")  # `/queue`: the subject names the queue
        if len(rest) != 1 or rest[0] == "":
            raise PatternError(f"`/{kind}/` takes one queue name (write `/` in it as %2F)")
        return _queue(_v1_unescape(rest[0]))
    if kind == "topic":
        if len(rest) != 1 or rest[0] == "":
            raise PatternError("`/topic/` takes one routing key (write `/` in it as %2F)")
        return _exchange("amq.topic", _v1_unescape(rest[0]))
    if kind == "exchange":
        if not rest or rest[0] == "" or len(rest) > 2:
            raise PatternError("a v1 exchange address is `/exchange/X` or `/exchange/X/KEY`")
        return _exchange(_v1_unescape(rest[0]), _v1_unescape(rest[1]) if len(rest) > 1 else None)
    raise PatternError("not an address form RabbitMQ accepts (/queue/, /amq/queue/, /topic/, /exchange/, "
                       "/queues/, /exchanges/, or a bare queue name)")


def amq_node(address: str) -> Node:
    """The node an address names on the embedded broker or an AMQ-style upstream."""
    for prefix in ("anycast://", "multicast://"):
        if address.startswith(prefix):
            address = address[len(prefix):]
            break
    if FQQN in address:
        base = address.split(FQQN, 1)[0]
        return Node("", _words(base), address, fqqn=address)
    return Node("", _words(address), address)


def node_of(address: str, upstream: str) -> Node:
    """The node `address` names in front of `upstream`; PatternError when it names none."""
    return rabbitmq_node(address) if upstream == "rabbitmq" else amq_node(address)


def pattern_node(match: str, upstream: str) -> Node:
    """A setting's `match` as a node pattern; PatternError says why it cannot be used."""
    if not isinstance(match, str) or match == "":
        raise PatternError("must be a non-empty address pattern such as `orders.#`")
    if match == ANY_WORDS:
        return Node("", (ANY_WORDS,), ANY_WORDS, every=True)
    if upstream == "rabbitmq":
        node = rabbitmq_node(match)
        exchange = node.space[len("exchange"):] if node.space.startswith("exchange") else ""
        if any(word in (ANY_WORDS, ONE_WORD) for word in exchange.split(".")):
            raise PatternError("an exchange name in a match is literal (no `*` or `#` word)")
    else:
        node = amq_node(match)
    if ANY_WORDS in node.words[:-1]:
        raise PatternError("`#` may only be the last word (as in Artemis)")
    if len(node.words) > MAX_WILDCARD_WORDS:
        raise PatternError(f"has more than {MAX_WILDCARD_WORDS} words")
    if node.fqqn is not None and (node.wild or ANY_WORDS in node.fqqn or ONE_WORD in node.fqqn):
        raise PatternError("a fully qualified queue name (`a::q`) matches exactly: no `*` or `#`")
    return node


# --------------------------------------------------------------------------------------------------
# RabbitMQ 4's /management requests

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_BINDING = re.compile(r"^src=([0-9A-Za-z\-._~%]+);dst([eq])=([0-9A-Za-z\-._~%]+);key=([0-9A-Za-z\-._~%]*);"
                      r"args=([0-9A-Za-z\-_]*)$")


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4."""
    out: list[str] = []
    for segment in path.split("/")[1:] if path.startswith("/") else path.split("/"):
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    trailing = "/" if path.endswith(("/.", "/..")) else ""
    return "/" + "/".join(out) + trailing


def _normalized_path(uri: str) -> tuple[list[str], dict[str, str]]:
    """The path segments (decoded) and query of a request URI, as RabbitMQ reads them: `uri_string:
    normalize` (percent-encoded unreserved characters decoded, dot segments removed), then each segment
    percent-decoded.  PatternError when RabbitMQ would answer 400."""
    path, _, query = uri.partition("?")
    path = path.partition("#")[0]
    query = query.partition("#")[0]
    path = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)) if chr(int(m.group(1), 16)) in _UNRESERVED
                       else m.group(0).upper(), path)
    if not path.startswith("/"):
        raise PatternError(f"a /management request's path must start with `/`, got {uri!r}")
    segments = _remove_dot_segments(path).split("/")[1:]
    params: dict[str, str] = {}
    for pair in query.split("&") if query else ():
        name, _, value = pair.partition("=")
        params[_v2_decode(name.replace("+", " "))] = _v2_decode(value.replace("+", " "))
    return segments, params


def _queue_address(name: str) -> str:
    return "/queues/" + quote(name, safe="")


def _exchange_address(name: str, key: str | None = None) -> str:
    return "/exchanges/" + quote(name, safe="") + ("" if key is None else "/" + quote(key, safe=""))


def management_checks(method: str, uri: str, body: Mapping[str, Any] | None = None) -> tuple[tuple[str, str], ...]:
    """The (operation, address) pairs a client's request to RabbitMQ 4's `/management` node must each be
    allowed (addresses in RabbitMQ's v2 form, to decide with `upstream="rabbitmq"`): `manage` on the
    queue or exchange a request declares, deletes, purges or reads; for a binding (made, deleted or
    listed) `manage` on its destination and `consume` on its source exchange with its key, since the
    destination then receives what the source routes with that key (RabbitMQ checks write on the
    destination and read on the source).  `uri` is the request's `to`, `method` its `subject`, `body`
    its decoded amqp-value map (POST /bindings).  `()` for requests that name no node (`/auth/tokens`).
    PatternError for a request RabbitMQ would refuse as malformed: refuse it."""
    segments, params = _normalized_path(uri)
    method = method.upper()
    if segments[:1] == ["queues"] and len(segments) in (2, 3):
        name = _v2_decode(segments[1])
        if len(segments) == 2 and method in ("GET", "PUT", "DELETE"):
            return (("manage", _queue_address(name)),)
        if segments[2:] == ["messages"] and method == "DELETE":
            return (("manage", _queue_address(name)),)
    elif segments[:1] == ["exchanges"] and len(segments) == 2 and method in ("GET", "PUT", "DELETE"):
        return (("manage", _exchange_address(_v2_decode(segments[1]))),)
    elif segments == ["bindings"] and method == "POST":
        if not isinstance(body, Mapping):
            raise PatternError("POST /bindings needs a map body")
        source, key = body.get("source"), body.get("binding_key")
        queue, exchange = body.get("destination_queue"), body.get("destination_exchange")
        if not isinstance(source, str) or not isinstance(key, str) or not isinstance(queue or exchange, str):
            raise PatternError("POST /bindings needs `source`, `binding_key` and `destination_queue` or "
                               "`destination_exchange` (strings)")
        return _binding_checks(source, "q" if queue is not None else "e", queue if queue is not None else exchange,
                               key)
    elif segments[:1] == ["bindings"] and len(segments) == 2 and method == "DELETE":
        found = _BINDING.match(segments[1])
        if found is None:
            raise PatternError(f"bad binding path segment {segments[1]!r}")
        source, kind, destination, key, _ = found.groups()
        return _binding_checks(_v2_decode(source), kind, _v2_decode(destination), _v2_decode(key))
    elif segments == ["bindings"] and method == "GET":
        if "src" not in params or "key" not in params or not ("dstq" in params or "dste" in params):
            raise PatternError("GET /bindings needs `src`, `key` and `dstq` or `dste`")
        kind = "q" if "dstq" in params else "e"
        return _binding_checks(params["src"], kind, params["dst" + kind], params["key"])
    elif segments == ["auth", "tokens"] and method == "PUT":
        return ()
    raise PatternError(f"not a /management request the daemon knows: {method} {uri}")


def _binding_checks(source: str, kind: str, destination: str, key: str) -> tuple[tuple[str, str], ...]:
    target = _queue_address(destination) if kind == "q" else _exchange_address(destination)
    return (("manage", target), ("consume", _exchange_address(source, key)))


# --------------------------------------------------------------------------------------------------
# Matching words


def covers(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Every address the wildcard words `words` stand for matches `pattern` (`#` last only)."""
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            memo[key] = _covers(i, j)
        return memo[key]

    def _covers(i: int, j: int) -> bool:
        rest = pattern[i:]
        if rest == (ANY_WORDS,):
            return True
        if j == len(words):
            return rest == ()
        if not rest:
            return False
        w, p = words[j], pattern[i]
        if w == ANY_WORDS:  # zero words here, and any one more word (then `#` again)
            return go(i, j + 1) and p == ONE_WORD and go(i + 1, j)
        if w == ONE_WORD:
            return p == ONE_WORD and go(i + 1, j + 1)
        return (p == ONE_WORD or p == w) and go(i + 1, j + 1)

    return go(0, 0)


def intersects(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    """Some address the wildcard words `words` stand for matches `pattern` (`#` last only)."""
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        key = (i, j)
        if key not in memo:
            memo[key] = _meets(i, j)
        return memo[key]

    def _meets(i: int, j: int) -> bool:
        if pattern[i:] == (ANY_WORDS,):
            return True
        if j == len(words):
            return i == len(pattern)
        w = words[j]
        if w == ANY_WORDS:
            return go(i, j + 1) or (i < len(pattern) and go(i + 1, j))
        if i == len(pattern):
            return False
        p = pattern[i]
        return (p == ONE_WORD or w == ONE_WORD or p == w) and go(i + 1, j + 1)

    return go(0, 0)


def _utf16_length(text: str) -> int:
    """Java's String.length(): UTF-16 code units."""
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def specificity(node: Node, index: int) -> tuple:
    """A sort key, most specific first, ordering the settings that match one address as Artemis's
    comparator does (see the module comment), ties broken by the star positions, a scoped match
    before the bare `#`, and the file order."""
    name = node.fqqn if node.fqqn is not None else ".".join(node.words)
    has_hash = ANY_WORDS in node.words
    has_star = ONE_WORD in node.words
    mask = tuple(1 if w == ONE_WORD else 0 for w in node.words)
    length = _utf16_length(name)
    return (has_hash, -length if has_hash else 0, has_star, mask,
            length if has_star and not has_hash else 0, node.every, index)


# --------------------------------------------------------------------------------------------------
# Settings and decisions


@dataclass(frozen=True, slots=True)
class Grant:
    """One `[[security.settings]]` table: its position, its `match`, and the roles per operation."""

    index: int
    match: str
    roles: Mapping[str, frozenset[str]]  # operation -> roles granted it

    @property
    def key(self) -> str:
        return f"security.settings[{self.index}]"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the text the wire refusal and the audit line carry."""

    user: str
    operation: str
    address: str
    shown: str  # the node, canonical ("" when the address names none)
    setting: Grant | None  # the setting whose grants refuse it (None: none matches, or no node)
    reason: str

    def __str__(self) -> str:
        node = f" ({self.shown})" if self.shown and self.shown != self.address else ""
        return f"user {self.user} may not {_VERBS[self.operation]} {self.address}{node}: {self.reason}"


class _Trie:
    __slots__ = ("children", "star", "value", "hash")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.star: _Trie | None = None
        self.value: _Entry | None = None  # the pattern ends here
        self.hash: _Entry | None = None  # the pattern continues with a final `#`


@dataclass(frozen=True, slots=True)
class _Entry:
    grant: Grant
    node: Node
    rank: tuple


class _Compiled:
    """The settings compiled for one upstream kind."""

    def __init__(self, grants: tuple[Grant, ...], upstream: str):
        self.upstream = upstream
        self.spaces: dict[str, _Trie] = {}
        self.fqqn: dict[str, _Entry] = {}
        self.every: list[_Entry] = []
        self.by_space: dict[str, list[_Entry]] = {}
        seen: dict[tuple, Grant] = {}
        for grant in grants:
            try:
                node = pattern_node(grant.match, upstream)
            except PatternError as e:
                raise PatternError(str(e), grant.index) from None
            same = (node.space, node.words, node.fqqn, node.every)
            if same in seen:
                raise PatternError(f"names the same addresses as {seen[same].key} (match {seen[same].match!r})"
                                   + (f": both are {node.shown}" if upstream == "rabbitmq" else ""), grant.index)
            seen[same] = grant
            entry = _Entry(grant, node, specificity(node, grant.index))
            if node.every:
                self.every.append(entry)
                continue
            if node.fqqn is not None:
                self.fqqn[node.fqqn] = entry
                continue
            self.by_space.setdefault(node.space, []).append(entry)
            trie = self.spaces.setdefault(node.space, _Trie())
            words = node.words
            last = words[-1] if words else None
            for word in words[:-1] if last == ANY_WORDS else words:
                if word == ONE_WORD:
                    if trie.star is None:
                        trie.star = _Trie()
                    trie = trie.star
                else:
                    trie = trie.children.setdefault(word, _Trie())
            if last == ANY_WORDS:
                trie.hash = entry
            else:
                trie.value = entry

    def candidates(self, node: Node) -> list[_Entry]:
        """The settings matching a concrete node."""
        found = list(self.every)
        trie = self.spaces.get(node.space)
        if trie is None:
            return found
        states = [trie]
        for word in node.words:
            step = []
            for state in states:
                if state.hash is not None:
                    found.append(state.hash)
                child = state.children.get(word)
                if child is not None:
                    step.append(child)
                if state.star is not None:
                    step.append(state.star)
            states = step
            if not states:
                return found
        for state in states:
            if state.value is not None:
                found.append(state.value)
            if state.hash is not None:
                found.append(state.hash)
        return found

    def needed(self, node: Node) -> tuple[_Entry, ...]:
        """The settings that must all grant an operation on `node` (empty: nothing matches: refused)."""
        if node.fqqn is not None:
            exact = self.fqqn.get(node.fqqn)
            if exact is not None:
                return (exact,)
        if not node.wild:
            found = self.candidates(node)
            return (min(found, key=lambda e: e.rank),) if found else ()
        entries = self.every + self.by_space.get(node.space, [])
        lead = node.words[0] if node.words else None
        if lead is not None and lead not in (ANY_WORDS, ONE_WORD):  # a literal first word: skip other ones
            entries = [e for e in entries if not e.node.words or e.node.words[0] in (lead, ANY_WORDS, ONE_WORD)]
        covering = [e for e in entries if covers(e.node.words, node.words)]
        if not covering:
            return ()
        decider = min(covering, key=lambda e: e.rank)
        finer = sorted((e for e in entries if e.rank < decider.rank and intersects(e.node.words, node.words)),
                       key=lambda e: e.rank)
        return (decider, *finer)


class Permissions:
    """The compiled permission model: `allows` and `explain`, for one upstream kind."""

    def __init__(self, grants: Iterable[Grant] = (), roles: Mapping[str, Iterable[str]] | None = None,
                 upstream: str = "embedded", *, cache_size: int = CACHE_SIZE):
        if upstream not in UPSTREAMS:
            raise ValueError(f"upstream must be one of {', '.join(UPSTREAMS)}, got {upstream!r}")
        self.grants = tuple(grants)
        self.user_roles = {str(u): frozenset(r) for u, r in (roles or {}).items()}
        self.upstream = upstream
        self.is_open = not self.grants
        self._compiled = _Compiled(self.grants, upstream) if self.grants else None
        self._cache: dict[str, tuple[Node | None, tuple[_Entry, ...], str]] = {}
        self._cache_size = cache_size
        self._siblings: dict[str, Permissions] = {upstream: self}

    @classmethod
    def open(cls) -> Permissions:
        """No settings: everything is allowed."""
        return cls()

    @classmethod
    def from_config(cls, config: Any, upstream: str | None = None) -> Permissions:
        """From a `Config` (its `security` section); `upstream`: the address model ("embedded",
        "rabbitmq", "other"; default: "embedded" without upstream URLs, else "other")."""
        if upstream is None:
            upstream = "embedded" if not config.upstream.urls else "other"
        security = config.security
        grants = tuple(Grant(s.index, s.match, {op: frozenset(getattr(s, op)) for op in OPERATIONS})
                       for s in security.settings)
        return cls(grants, security.roles, upstream)

    def for_upstream(self, upstream: str) -> Permissions:
        """The same settings decided in `upstream`'s address model (compiled once)."""
        sibling = self._siblings.get(upstream)
        if sibling is None:
            sibling = Permissions(self.grants, self.user_roles, upstream, cache_size=self._cache_size)
            sibling._siblings = self._siblings
            self._siblings[upstream] = sibling
        return sibling

    def roles_of(self, user: str | None) -> frozenset[str]:
        return self.user_roles.get(ANONYMOUS_USER if user is None else user, frozenset())

    def _decision(self, address: str) -> tuple[Node | None, tuple[_Entry, ...], str]:
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        if not isinstance(address, str):
            return (None, (), f"not an address: {address!r}")
        try:
            node = node_of(address, self.upstream)
        except PatternError as e:
            result: tuple[Node | None, tuple[_Entry, ...], str] = (None, (), str(e))
        else:
            assert self._compiled is not None
            if node.wild and len(node.words) > MAX_WILDCARD_WORDS:
                result = (node, (), f"an address with wildcards and more than {MAX_WILDCARD_WORDS} words is "
                                    "not decided")
            else:
                result = (node, self._compiled.needed(node), "")
        if self._cache_size and len(address) <= MAX_CACHED_ADDRESS:
            if len(self._cache) >= self._cache_size:
                try:
                    del self._cache[next(iter(self._cache))]  # the oldest
                except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                    self._cache.clear()
            self._cache[address] = result
        return result

    def allows(self, user: str | None, roles: frozenset[str] | None, operation: str, address: str) -> bool:
        """May `user` (with `roles`; None: its configured roles) do `operation` on `address`?"""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}")
        if self.is_open:
            return True
        if roles is None:
            roles = self.roles_of(user)
        elif not isinstance(roles, (frozenset, set)):
            roles = frozenset(roles)
        needed = self._decision(address)[1]
        if not needed:
            return False
        for entry in needed:
            if roles.isdisjoint(entry.grant.roles[operation]):
                return False
        return True

    def explain(self, user: str | None, roles: frozenset[str] | None, operation: str,
                address: str) -> Refusal | None:
        """None if allowed, else the Refusal saying why."""
        if self.allows(user, roles, operation, address):
            return None
        roles = self.roles_of(user) if roles is None else frozenset(roles)
        name = ANONYMOUS_USER if user is None else user
        node, needed, error = self._decision(address)
        if node is None:
            return Refusal(name, operation, address, "", None, f"names no node in front of {self.upstream}: {error}")
        if not needed:
            return Refusal(name, operation, address, node.shown, None,
                           error or "no security setting matches it (what is not granted is refused)")
        refusing = next(e for e in needed if roles.isdisjoint(e.grant.roles[operation]))
        granted = sorted(refusing.grant.roles[operation])
        to = f"roles: {', '.join(granted)}" if granted else "no role"
        part = " covers part of it and" if refusing is not needed[0] else ""
        return Refusal(name, operation, address, node.shown, refusing.grant,
                       f"{refusing.grant.key} match {refusing.grant.match!r}{part} grants {operation} to {to}")


def open_warning(config: Any) -> str | None:
    """The warning the daemon logs at start when every authenticated client may do everything on a
    listener beyond loopback (no `[[security.settings]]`); None otherwise."""
    if config.security.settings or config.listener.is_loopback:
        return None
    return (f"no [[security.settings]]: every client that logs in on {config.listener.host} may send, "
            "consume, browse and manage on every address")
