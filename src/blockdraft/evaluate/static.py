"""Decoding state of fixed shape: KV caches preallocated and written at explicit slots, and each
decoding step captured once as a CUDA graph, then replayed.

Why: a small target is launch-bound. An eager forward of SmolLM2-135M costs about 40 ms of Python
and kernel launches on an H200, whatever the model's size, and a speculative round pays two such
passes (drafter and target), which hides the drafter's gain. With every shape fixed (caches
preallocated, a step's writes given as slot indices, which slots a query sees left to the attention
mask) a step is one graph replay. Off CUDA the same functions run eagerly, so CPU tests check the
very code the GPU replays.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from blockdraft.model.flops import Dims


class _SlotLayer(CacheLayerMixin):
    """One layer's preallocated keys and values [n, kv_heads, slots, head_dim]. The mixin's abstract
    methods differ across transformers 5.x releases: every one of them is answered here."""

    is_compileable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.is_initialized = keys, values, True

    def lazy_initialization(self, key_states, value_states) -> None:  # allocated up front
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("SlotCache.update writes every layer")

    def get_mask_sizes(self, *_args) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return self.keys.shape[2]

    def get_max_cache_shape(self) -> int:
        return self.keys.shape[2]


class _Slots:
    """Keys and values of every layer, one tensor each [layers, n, kv_heads, slots, head_dim] (so moving
    entries is one op), written where `write_at` [q] says: the same slots for every row."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.write_at = torch.zeros(0, dtype=torch.long, device=device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [n, kv_heads, q, head_dim] at `write_at`; return the layer's every slot."""
        self.keys[layer].index_copy_(2, self.write_at, k)
        self.values[layer].index_copy_(2, self.write_at, v)
        return self.keys[layer], self.values[layer]


class SlotCache(_Slots, Cache):
    """The target's KV cache. Attention reads every slot; the caller's 4D mask decides which hold the
    row's visible tokens."""

    def __init__(self, config, n: int, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        cfg = config.get_text_config()  # a multimodal config keeps the decoder's inside
        dims = Dims.of(cfg)
        _Slots.__init__(self, (cfg.num_hidden_layers, n, dims.kv_heads, slots, dims.head_dim), dtype, device)
        Cache.__init__(self, layers=[_SlotLayer(k, v) for k, v in zip(self.keys, self.values, strict=True)])

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return self.write(layer_idx, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always given explicitly

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the entries at slots `src` to slots `dst` in every layer (a DDTree keeps its path)."""
        self.keys.index_copy_(3, dst, self.keys.index_select(3, src))
        self.values.index_copy_(3, dst, self.values.index_select(3, src))


class DraftSlots(_Slots):
    """The drafter's cache of context K/V, in the same slot layout as the target's: the features of the
    token in target slot s sit in slot s. The drafter stores a layer's new context K/V [n, nkv, C, hd]
    with `write` and attends over every slot it returns."""

    def __init__(self, drafter: torch.nn.Module, n: int, slots: int, device: torch.device) -> None:
        attn = drafter.layers[0].self_attn
        shape = (len(drafter.layers), n, attn.nkv, slots, attn.hd)
        super().__init__(shape, next(drafter.parameters()).dtype, device)


class Graphs:
    """Each step function captured as a CUDA graph per name and input shapes, then replayed.

    A function may read and write state of fixed address (the caches, slot masks) besides its
    inputs; it runs once eagerly before capture (lazy initialisation, library handles), which is
    harmless as long as a step only writes its own slots. Its outputs are overwritten by the next
    replay of the same graph: consume them first. Disabled (or off CUDA) every call runs eagerly.
    One Graphs per decoder: a graph is bound to the buffers its decoder allocated."""

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.enabled = enabled and device.type == "cuda"
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor], object]] = {}

    def __call__(self, name: str, fn: Callable[..., object], **inputs: torch.Tensor):
        if not self.enabled:
            return fn(**inputs)
        key = (name, *((k, tuple(v.shape), v.dtype) for k, v in inputs.items()))
        if key not in self._graphs:
            static = {k: v.clone() for k, v in inputs.items()}
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn(**static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn(**static)
            self._graphs[key] = (graph, static, out)
        graph, static, out = self._graphs[key]
        for k, v in inputs.items():
            static[k].copy_(v)
        graph.replay()
        return out

    @property
    def captured(self) -> int:
        return len(self._graphs)
