"""Test-only: SGLang 0.5.23's CUDA-graph capture protocol, as its runners apply it, for tests on a GPU without SGLang.

Read in 0.5.23's `model_executor/runner_backend/full_cuda_graph_backend.py` (`capture_one`) and
`distributed/parallel_state.py` (`graph_capture`): everything runs on one side stream (the capture stream, current
inside `graph_capture`); each shape is captured after two eager warm-ups (a device synchronize before each),
largest batch first; every graph of the runner shares one memory pool; a replay runs the graph of the batch's shape,
in whatever order batches come, and its output tensors are the ones the capture returned (read before the next
replay). Nothing of SGLang is imitated beyond that order of calls."""
from __future__ import annotations

import random
from typing import Callable, Dict, Hashable, Iterable, List

import torch


class GraphRunner:
    """Captures `fn_for(key)` for each key the way SGLang does and replays them by key."""

    def __init__(self, device: str = "cuda"):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: Dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[Hashable, object] = {}

    def capture(self, key: Hashable, fn: Callable[[], object], warmups: int = 2) -> object:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for _ in range(warmups):
                torch.cuda.synchronize(self.device)
                fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.graphs[key], self.outputs[key] = graph, out
        return out

    def capture_all(self, keys: Iterable[Hashable], fn_for: Callable[[Hashable], Callable[[], object]],
                    warmups: int = 2) -> None:
        """Largest key first, as SGLang captures batch sizes."""
        for key in sorted(keys, reverse=True):
            self.capture(key, fn_for(key), warmups)

    def replay(self, key: Hashable) -> object:
        self.graphs[key].replay()
        return self.outputs[key]


def random_order(keys: List[Hashable], count: int, seed: int) -> List[Hashable]:
    """`count` keys in a seeded random order, every key at least once."""
    rng = random.Random(seed)
    order = list(keys) + [rng.choice(keys) for _ in range(max(0, count - len(keys)))]
    rng.shuffle(order)
    return order
