"""SQLite's lookahead reads a revision's references from its JSON array text by
searching and cutting it, not parsing it (``backends/sqlite/mover.py``): the pieces
hold exactly the references they should, whatever the lengths of the oids and
wherever the reference searched for sits.

The oracle is Python's own slicing of the array the text was made from
(``records.references_text``)."""
from __future__ import annotations

import random
from typing import Iterator

from zodbsql.backends.sqlite.mover import first_references, references_following
from zodbsql.storage.records import references_text

#: Oids of every length up to the largest (19 digits).
MAGNITUDES = (9, 99, 10 ** 4, 10 ** 9, 10 ** 15, 2 ** 63 - 1)
COUNTS = (1, 2, 7, 8, 64, 300)


def arrays() -> Iterator[list[int]]:
    rng = random.Random(20261128)
    yield [5]
    yield [5, 6]
    yield [5, 55, 555]
    yield list(range(1, 400))
    yield [2 ** 63 - 3, 2 ** 63 - 2, 2 ** 63 - 1]
    for _ in range(40):
        size = rng.randint(1, 500)
        largest = rng.choice(MAGNITUDES)
        yield sorted({rng.randint(1, largest) for _ in range(size)})


def test_the_first_references_read_from_the_text_are_the_arrays_first() -> None:
    for refs in arrays():
        text = references_text(set(refs))
        for count in (0, *COUNTS):
            assert first_references(text, count) == refs[:count], (refs, count)
    assert first_references(None, 8) == []


def test_the_references_following_one_are_those_after_it_in_the_array() -> None:
    rng = random.Random(5)
    checked = 0
    for refs in arrays():
        text = references_text(set(refs))
        for at in {0, 1, len(refs) // 2, len(refs) - 2, len(refs) - 1,
                   rng.randrange(len(refs))}:
            if not 0 <= at < len(refs):
                continue
            for count in COUNTS:
                found = references_following(text, refs[at], count)
                assert found == refs[at + 1:at + 1 + count], (refs, at, count)
                checked += 1
    assert checked > 1000
    text = references_text({5, 55, 555})
    assert references_following(text, 6, 8) is None
    assert references_following(text, 50, 8) is None       # a prefix of one
    assert references_following(text, 55, 8) == [555]
    assert references_following(text, 555, 8) == []         # the last: none after it
    assert references_following("[7]", 7, 8) == []
    assert references_following(None, 7, 8) is None
