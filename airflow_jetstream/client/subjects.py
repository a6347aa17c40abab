"""Subject validation shared by every publisher and subscriber."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from airflow_jetstream.client.errors import InvalidRequestError, InvalidSubjectError

_FORBIDDEN = frozenset(" \t\r\n\f\v")


def validate_subject(subject: object, *, allow_wildcards: bool = False, what: str = "subject") -> str:
    """Return ``subject`` if it is a valid NATS subject, else raise :class:`InvalidSubjectError`."""
    if not isinstance(subject, str) or not subject:
        raise InvalidSubjectError(f"{what} must be a non-empty string, got {subject!r}")
    if any(ch in _FORBIDDEN for ch in subject):
        raise InvalidSubjectError(f"{what} {subject!r} contains white space; NATS subjects cannot")
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if not token:
            raise InvalidSubjectError(
                f"{what} {subject!r} has an empty token (leading, trailing or double '.')"
            )
        if token in ("*", ">") or ("*" in token or ">" in token):
            if not allow_wildcards:
                raise InvalidSubjectError(
                    f"{what} {subject!r} contains a wildcard; publish to a concrete subject"
                )
            if token not in ("*", ">"):
                raise InvalidSubjectError(f"{what} {subject!r}: wildcards must be whole tokens")
            if token == ">" and index != len(tokens) - 1:
                raise InvalidSubjectError(f"{what} {subject!r}: '>' may only be the last token")
    return subject


def validate_subjects(subjects: object, *, allow_wildcards: bool = True, what: str = "subjects") -> list[str]:
    """Return ``subjects`` (a list, tuple or other iterable of subjects) as a list, each checked by
    :func:`validate_subject`.

    A single string is refused with a message saying to wrap it in a list (iterating ``"orders.>"``
    would otherwise check each character and report an empty token).
    """
    if isinstance(subjects, (str, bytes)):
        raise InvalidSubjectError(f"{what} must be a list of subjects, got the string {subjects!r}; "
                                  f"write [{subjects!r}]")
    if not isinstance(subjects, Iterable):
        raise InvalidSubjectError(f"{what} must be a list of subjects, got {type(subjects).__name__}")
    return [validate_subject(s, allow_wildcards=allow_wildcards, what=what.removesuffix("s")) for s in subjects]


#: nats-server's longest stream or consumer name (``JSMaxNameLen``).
MAX_NAME_LENGTH = 255


def validate_name(name: object, *, what: str = "name") -> str:
    """Validate a stream or consumer name (no dots, wildcards, white space or path separators; at most 255
    characters), as nats-server does."""
    if not isinstance(name, str) or not name:
        raise InvalidSubjectError(f"{what} must be a non-empty string, got {name!r}", reason="invalid_name")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidSubjectError(f"{what} is {len(name)} characters long; names are at most {MAX_NAME_LENGTH}",
                                  reason="invalid_name")
    bad = set(name) & (_FORBIDDEN | set(".*>/\\"))
    if bad:
        raise InvalidSubjectError(
            f"{what} {name!r} contains {''.join(sorted(bad))!r}; names cannot hold '.', '*', '>', "
            "'/', '\\' or white space",
            reason="invalid_name",
        )
    return name


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(want) == len(have)


def subjects_overlap(first: str, second: str) -> bool:
    """True when some subject matches both (wildcard) subjects."""
    a, b = first.split("."), second.split(".")
    for x, y in zip(a, b, strict=False):
        if x == ">" or y == ">":
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(a) == len(b)


# Write fences (client/batches/atomic.py) are named here, below the admin and reading code that keeps them apart.
#: First token of every fence subject.
FENCE_PREFIX = "_FENCE"
#: Characters a fence id keeps as they are in its subject token; every other byte is written ``~XX``.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
#: Longest subject token of a fence id; a longer id is named by its SHA-256.
_MAX_TOKEN = 128


def fence_namespace(stream: str) -> str:
    """The subject filter a stream needs for fenced writes: ``_FENCE.<stream>.>``."""
    return f"{FENCE_PREFIX}.{stream}.>"


def is_fence_subject(subject: str) -> bool:
    """Whether ``subject`` (or a filter) lies in a fence namespace."""
    return subject.startswith(f"{FENCE_PREFIX}.")


def fence_subject(stream: str, fence_id: str) -> str:
    """The subject of ``fence_id``'s fence in ``stream``: any id is one valid token, readable when it is plain."""
    if not isinstance(fence_id, str) or not fence_id:
        raise InvalidRequestError(f"a fence id must be a non-empty string, got {fence_id!r}", reason="invalid_request")
    token = "".join(c if c in _PLAIN else "".join(f"~{b:02X}" for b in c.encode()) for c in fence_id)
    if len(token) > _MAX_TOKEN:
        token = "sha256~" + hashlib.sha256(fence_id.encode()).hexdigest()
    return f"{FENCE_PREFIX}.{stream}.{token}"
