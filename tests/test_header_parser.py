"""The toolkit's header parser replaces nats-py's on its connections, so nats-py's own users of them (its
KV, JetStream contexts, plain subscriptions) must read exactly what nats-py's parser gives: the same
dict for every header block, plus ``repeated``. Checked on hand-picked and on seeded random blocks."""

from __future__ import annotations

import random

import pytest
from nats.aio.client import Client

from airflow_jetstream.client.reading.headers import parse_header_lines

natspy_parse = Client._parse_header_lines  # the class's own (static) parser

BLOCKS = [
    b"KV-Operation: DEL\r\nNats-Msg-Size: 12\r\n\r\n",
    b"A: 1\r\nA: 2\r\nB:3\r\n\r\n",
    b"  Spaced  :  value with  spaces  \r\n",
    b"Tab:\tv\t\r\n",
    b"V: a\x0bb\x0c\r\n",  # vertical tab / form feed inside and at the end of a value
    b"Name With Space: x\r\nOk: y\r\n",
    b"\x01Ctl: x\r\n",
    b": no name\r\n",
    b"NoColon\r\n",
    b"Colon: a: b: c\r\n",
    b"Bare: a\nb: c\r\n",  # a bare LF is not a line break in NATS headers
    b"Utf8: gr\xc3\xbc\xc3\x9fe \xe2\x82\xac\r\n",
    b"Bad: \xff\xfe\r\n",
    b"N\xc3\xa4me: x\r\n",
    b"Sep\x1c: x\r\n",
    b"Del\x7f: x\r\n",
    b"",
    b"\r\n\r\n",
]


@pytest.mark.parametrize("raw", BLOCKS)
def test_same_dict_as_nats_py_on_hand_picked_blocks(raw: bytes) -> None:
    assert dict(parse_header_lines(raw)) == natspy_parse(raw)


def test_same_dict_as_nats_py_on_random_blocks() -> None:
    rng = random.Random(22)
    alphabet = [b"a", b"B", b"-", b"_", b":", b" ", b"\t", b"\r\n", b"\n", b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x00",
                b"\x7f", b"\xc3\xbc", b"\xff", b"1", b".", b"Nats-Msg-Id"]
    for _ in range(3000):
        raw = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert dict(parse_header_lines(raw)) == natspy_parse(raw), raw


def test_repeated_names_keep_every_value() -> None:
    headers = parse_header_lines(b"X-Multi: a\r\nX-One: 1\r\nX-Multi: b\r\n\r\n")
    assert headers == {"X-Multi": "b", "X-One": "1"} and headers.repeated == {"X-Multi": ["a", "b"]}
    odd = parse_header_lines(b"X-M:\x0b a \r\nBad Name: z\r\nX-M: b\x0c\r\n")
    assert odd == natspy_parse(b"X-M:\x0b a \r\nBad Name: z\r\nX-M: b\x0c\r\n") and odd.repeated == {"X-M": ["a", "b"]}
