"""The decode steps' block tables, kept from step to step (a persistent batch's table).

A decode step's attention reads one row of block ids per request. Built from each request's
``block_ids`` list every step, the padded table costs ~1 µs a request; most steps change no row
(a request gains a block every ``block_size`` tokens), so the rows live here between steps and a
row is rewritten only when its request's list changed:

    table:  [capacity, max_blocks] int64, row i = the block ids of the request that owns it, 0-padded
    owner:  row -> (request, its block list object, the length written)

A request's block list only grows in place (``list.extend``) or is replaced by another list
(admission, preemption, a session), so "the same list object, the same length" means the row is
current; a longer list gets its new tail written, another list the whole row. Rows are claimed on
first sight and reclaimed when none is free (every row not used by the step being built).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from swiftlm.core.request import Request


class DecodeTables:
    def __init__(self, capacity: int, max_blocks: int) -> None:
        self.table = np.zeros((capacity, max_blocks), dtype=np.int64)  # [capacity, max_blocks]
        self._owner: list[tuple[Request, list[int], int] | None] = [None] * capacity
        self._row_of: dict[int, int] = {}  # id(request) -> row (checked against ``_owner``)
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def capacity(self) -> int:
        return self.table.shape[0]

    def rows(self, requests: Sequence[Request]) -> list[int] | None:
        """The row of each request, current; None if they do not fit (more requests than rows, or
        a request with more blocks than a row holds): the caller builds its table another way."""
        if len(requests) > self.capacity:
            return None
        out: list[int] = []
        owner, row_of, table = self._owner, self._row_of, self.table
        width = table.shape[1]
        for r in requests:
            blocks = r.block_ids
            n = len(blocks)
            row = row_of.get(id(r))
            entry = owner[row] if row is not None else None
            if entry is not None and entry[0] is r and entry[1] is blocks and entry[2] == n:
                out.append(row)  # unchanged since the last step: most requests
                continue
            if n > width:
                return None
            if entry is None or entry[0] is not r:
                row = self._claim(r, out)
                table[row, :n] = blocks
                table[row, n:] = 0
            elif entry[1] is blocks and entry[2] < n:  # grown in place: the new tail
                table[row, entry[2] : n] = blocks[entry[2] :]
            else:  # another list (or a shorter one)
                table[row, :n] = blocks
                table[row, n:] = 0
            owner[row] = (r, blocks, n)
            out.append(row)
        return out

    def _claim(self, request: Request, taken: list[int]) -> int:
        """A free row for ``request``; when none is left, every row not in ``taken`` is reclaimed."""
        if not self._free:
            keep = set(taken)
            self._row_of = {k: v for k, v in self._row_of.items() if v in keep}
            for row in range(self.capacity):
                if row not in keep:
                    self._owner[row] = None
            self._free = [row for row in range(self.capacity - 1, -1, -1) if row not in keep]
        row = self._free.pop()
        self._row_of[id(request)] = row
        return row
