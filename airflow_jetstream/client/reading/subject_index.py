"""Which of many subject filters (wildcards allowed) match a subject, in time proportional to its tokens.

A shared subscription hands each message to the waiting tasks whose filter matches its subject. Checking
every filter in turn costs one comparison per waiting task per message; this index walks the subject's
tokens once through a tree of filter tokens (``*`` matches one token, ``>`` the rest), as the server's own
subscription list does::

    index = SubjectIndex()
    index.add("$KV.models.churn", waiter_a)
    index.add("$KV.models.*", waiter_b)
    index.match("$KV.models.churn")   # {waiter_a, waiter_b}
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class _Node(Generic[T]):
    __slots__ = ("children", "here", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.here: set[T] = set()  # filters that end at this token
        self.rest: set[T] = set()  # filters whose next token is ">"


class SubjectIndex(Generic[T]):
    """Items filed under subject filters; :meth:`match` returns the items of every filter matching a subject."""

    def __init__(self) -> None:
        self._root: _Node[T] = _Node()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _path(self, pattern: str, create: bool) -> Iterator[_Node[T]]:
        node = self._root
        yield node
        for token in pattern.split("."):
            if token == ">":
                return
            child = node.children.get(token)
            if child is None:
                if not create:
                    return
                child = node.children[token] = _Node()
            node = child
            yield node

    def add(self, pattern: str, item: T) -> None:
        """File ``item`` under the filter ``pattern``."""
        *_, node = self._path(pattern, create=True)
        bucket = node.rest if pattern == ">" or pattern.endswith(".>") else node.here
        if item not in bucket:
            bucket.add(item)
            self._size += 1

    def remove(self, pattern: str, item: T) -> None:
        """Take ``item`` out of the filter ``pattern`` (and prune the branches left empty)."""
        nodes = list(self._path(pattern, create=False))
        tokens = pattern.split(".")
        depth = len(tokens) - (1 if tokens[-1] == ">" else 0)
        if len(nodes) != depth + 1:
            return
        node = nodes[-1]
        bucket = node.rest if tokens[-1] == ">" else node.here
        if item in bucket:
            bucket.discard(item)
            self._size -= 1
        for parent, token, child in reversed(list(zip(nodes, tokens, nodes[1:], strict=False))):
            if child.children or child.here or child.rest:
                break
            del parent.children[token]

    def items(self) -> set[T]:
        """Every item filed."""
        found: set[T] = set()
        stack = [self._root]
        while stack:
            node = stack.pop()
            found |= node.here | node.rest
            stack.extend(node.children.values())
        return found

    def match(self, subject: str) -> set[T]:
        """Every item whose filter matches ``subject`` (a literal subject)."""
        found: set[T] = set()
        level = [self._root]
        tokens = subject.split(".")
        for token in tokens:
            following: list[_Node[T]] = []
            for node in level:
                found |= node.rest
                for key in (token, "*"):
                    child = node.children.get(key)
                    if child is not None:
                        following.append(child)
            if not following:
                return found
            level = following
        for node in level:
            found |= node.here
        return found


__all__ = ["SubjectIndex"]
