"""Where ``mj.dask``'s data and actors go on the cluster: the chunks of a data set spread evenly by
rows over the workers, grouped by the worker holding them, and each group's actor on the worker
holding its chunks (Dask alone puts an actor on the worker with the fewest actors, other losses'
included, wherever the chunks of its arguments are).
"""
from __future__ import annotations

import distributed


def nonempty(row_chunks: tuple) -> tuple:
    """The chunk sizes along the rows without the empty ones, which hold nothing to add (a
    filtered dataframe's chunks, a concatenation with an empty piece)."""
    return tuple(n for n in row_chunks if n > 0)


def aligned(data, row_chunks) -> list:
    """The arrays chunked along the batch axis by ``row_chunks`` and whole along the others."""
    return [x.rechunk((row_chunks,) + tuple(-1 for _ in x.shape[1:])) for x in data]


def resident_groups(client, blocks: list[list]) -> list[list[int]]:
    """The chunk indices grouped by the worker holding the chunk's first block, each group in
    chunk order, the groups in the order of their first chunk."""
    where = client.who_has([chunk[0] for chunk in blocks])
    groups: dict = {}
    for i, chunk in enumerate(blocks):
        groups.setdefault(where[chunk[0].key][0], []).append(i)
    return list(groups.values())


def placed_blocks(client, arrays) -> list[list]:
    """Per chunk of rows, futures of each array's block on the worker with the fewest rows so far
    (Dask alone may put 6 of 10 equal chunks on one of 2 workers); a worker that dies leaves its
    chunks free to be recomputed elsewhere. The arrays are computed in one graph first, so the
    per-chunk tasks only take blocks already in memory."""
    persisted = client.persist(arrays)
    distributed.wait(persisted)
    load = dict.fromkeys(client.scheduler_info()["workers"], 0)
    placed = []
    for i, rows in enumerate(arrays[0].chunks[0]):
        worker = min(load, key=load.get)
        load[worker] += rows
        placed.append(client.compute([x.blocks[i] for x in persisted], workers=[worker], allow_other_workers=True))
    distributed.wait(placed)
    return placed


def actor_workers(client, groups: list[list[int]], blocks: list[list]) -> list:
    """Per group, the worker for its actor: one holding the group's first chunk and no other
    actor of the loss, else one with no actor of the loss (it fetches the chunks: after a fault
    Dask recomputes the lost chunks beside the others), else one holding it (or None)."""
    where = client.who_has([blocks[group[0]][0] for group in groups])
    workers, chosen = list(client.nthreads()), []
    for group in groups:
        holders = list(where.get(blocks[group[0]][0].key, ()))
        free = [w for w in workers if w not in chosen]
        chosen.append(([w for w in holders if w in free] + free + holders + [None])[0])
    return chosen
