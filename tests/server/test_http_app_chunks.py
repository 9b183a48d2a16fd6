"""`http_app`'s helpers for a request split into several calls: all succeed or none, and the first failure
cancels the calls still running (nothing is left computing for an answer that will not be sent)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from headroom.core.errors import Overloaded
from headroom.server.http_app import _all_or_none, _texts_tensor


def test_all_results_in_order() -> None:
    async def value(v: int) -> int:
        await asyncio.sleep(0)
        return v

    async def main() -> list[int]:
        return await _all_or_none([value(i) for i in range(5)])

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_the_first_failure_cancels_the_rest_and_is_raised() -> None:
    cancelled: list[int] = []

    async def main() -> None:
        gate = asyncio.Event()

        async def waits(i: int) -> int:
            try:
                await gate.wait()  # never set: only a cancel ends it
            except asyncio.CancelledError:
                cancelled.append(i)
                raise
            return i

        async def refused() -> int:
            await asyncio.sleep(0)
            raise Overloaded("queue full", retry_after_s=1.0)

        with pytest.raises(Overloaded):
            await _all_or_none([waits(0), refused(), waits(2)])
        await asyncio.sleep(0)  # let the cancellations run

    asyncio.run(main())
    assert sorted(cancelled) == [0, 2]


@pytest.mark.parametrize(("dims", "n"), [(0, 1), (1, 3), (2, 17)])
def test_texts_tensor_has_one_string_per_batch_row(dims: int, n: int) -> None:
    texts = [f"t{i}é" for i in range(n)]
    tensor = _texts_tensor("text", dims, texts)
    assert tensor.shape == (n, *([1] * dims)) and tensor.datatype == "BYTES"
    assert [bytes(b).decode() for b in np.asarray(tensor.data).reshape(-1)] == texts
