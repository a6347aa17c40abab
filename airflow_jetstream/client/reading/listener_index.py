"""Which of a tail's waiters get a message: filed by subject filter, and optionally by the value they wait for.

Checking every waiter's filter against every message costs waiters x messages (9,900 advisories reaching 10,000
waiting sensors took 16-21 s). Here a message's subject is matched token by token through a tree of filter tokens
(:class:`SubjectIndex`, as the server's own subscription list does: ``*`` one token, ``>`` the rest), in time
proportional to its tokens; a waiter filed with a key, ``(key_of, value)``, is found by one ``key_of(message)`` and
one lookup, however many wait on its subject::

    index = ListenerIndex()
    index.add("$JS.EVENT.ADVISORY.STREAM.BATCH_ABANDONED", listener, key=(batch_of, "b1"))
    index.dispatch(message)   # listeners of the subject without a key, and those keyed batch_of(message)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from airflow_jetstream.client.errors import JetStreamError
    from airflow_jetstream.client.reading.messages import Message

T = TypeVar("T", bound=Hashable)


class SubjectIndex(Generic[T]):
    """Items filed under subject filters; :meth:`match` returns the items of every filter matching a subject, found
    through a tree of the filters' tokens (a node's ``""`` entry names the filter that ends there)."""

    def __init__(self) -> None:
        self._items: dict[str, set[T]] = {}
        self._tree: dict[str, Any] = {}

    def __len__(self) -> int:
        return sum(map(len, self._items.values()))

    def add(self, pattern: str, item: T) -> None:
        """File ``item`` under the filter ``pattern``."""
        if pattern not in self._items:
            node = self._tree
            for token in pattern.split("."):
                node = node.setdefault(token, {})
            node[""] = pattern
        self._items.setdefault(pattern, set()).add(item)

    def remove(self, pattern: str, item: T) -> None:
        """Take ``item`` out of the filter ``pattern`` (and prune the branches left empty)."""
        items = self._items.get(pattern, set())
        if item not in items:
            return
        items.discard(item)
        if items:
            return
        del self._items[pattern]
        tokens, path = pattern.split("."), [self._tree]
        for token in tokens:
            path.append(path[-1][token])
        del path[-1][""]
        for parent, token, child in reversed(list(zip(path, tokens, path[1:], strict=False))):
            if child:
                break
            del parent[token]

    def items(self) -> set[T]:
        """Every item filed."""
        return set().union(*self._items.values())

    def match(self, subject: str) -> set[T]:
        """Every item whose filter matches ``subject`` (a literal subject)."""
        found: set[T] = set()
        level = [self._tree]
        for token in subject.split("."):
            following = []
            for node in level:
                if ">" in node:
                    found |= self._items[node[">"][""]]
                following += [node[key] for key in (token, "*") if key in node]
            if not following:
                return found
            level = following
        for node in level:
            if "" in node:
                found |= self._items[node[""]]
        return found


#: The value a message is for (e.g. its advisory's batch id): quick, on the event loop, once per message; one function
#: object shared by the waiters it files.
KeyOf = Callable[["Message"], Hashable]


class Listener(Protocol):
    def __hash__(self) -> int: ...

    def push(self, message: Message) -> None: ...

    def fail(self, error: JetStreamError) -> None: ...


class _Group:
    """The listeners of one subject filter that share ``key_of`` (None: filed without a key), by the value each
    waits for."""

    __slots__ = ("by_value", "key_of")

    def __init__(self, key_of: KeyOf | None) -> None:
        self.key_of = key_of
        self.by_value: dict[Hashable, set[Listener]] = {}

    def __len__(self) -> int:
        return sum(map(len, self.by_value.values()))

    def __iter__(self) -> Iterator[Listener]:
        return (listener for listeners in self.by_value.values() for listener in listeners)

    def push(self, message: Message) -> None:
        try:
            listeners = list(self if self.key_of is None else self.by_value.get(self.key_of(message), ()))
        except Exception:  # a value key_of cannot read or hash: each listener's own check decides
            listeners = list(self)
        for listener in listeners:
            listener.push(message)

    def fail(self, error: JetStreamError) -> None:
        for listener in list(self):
            listener.fail(error)


class ListenerIndex:
    """A tail's listeners: :meth:`dispatch` hands a message to those whose subject filter (and key) it matches."""

    def __init__(self) -> None:
        self._subjects: SubjectIndex[_Group] = SubjectIndex()
        self._groups: dict[tuple[str, KeyOf | None], _Group] = {}

    def __len__(self) -> int:
        return sum(map(len, self._groups.values()))

    def add(self, subject: str, listener: Listener, key: tuple[KeyOf, Hashable] | None = None) -> None:
        key_of, value = key or (None, None)
        group = self._groups.get((subject, key_of))
        if group is None:
            group = self._groups[(subject, key_of)] = _Group(key_of)
            self._subjects.add(subject, group)
        group.by_value.setdefault(value, set()).add(listener)

    def remove(self, subject: str, listener: Listener, key: tuple[KeyOf, Hashable] | None = None) -> None:
        key_of, value = key or (None, None)
        group = self._groups.get((subject, key_of))
        listeners = group.by_value.get(value) if group is not None else None
        if group is None or listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            del group.by_value[value]
        if not group.by_value:
            del self._groups[(subject, key_of)]
            self._subjects.remove(subject, group)

    def dispatch(self, message: Message) -> None:
        for group in self._subjects.match(message.subject):
            group.push(message)

    def fail(self, error: JetStreamError) -> None:
        for group in list(self._groups.values()):
            group.fail(error)


__all__ = ["KeyOf", "ListenerIndex", "SubjectIndex"]
