"""A small decoder with MLA-style latent KV (DeepSeek V2's multi-head latent attention), on the CPU.

Token ids in, logits out; no tokenizer. Weights come from a seed, so every process that builds
`MlaModel(cfg)` holds the same model. Per layer and token the KV cache holds one latent row
`[c_kv (kv_lora_rank) | k_rope (rope_dim)]`, the row vLLM's MLA backends keep: per layer a tensor
(num_blocks, block_size, kv_lora_rank + rope_dim), token-major, which is what kvtier's
`kv_layout::vllm_mla(layers, num_blocks, block_size, elem_bytes, latent)` describes
(include/kvtier/kv_layout.hpp): block stride = block_size * latent * elem_bytes, token stride =
latent * elem_bytes, one head. So kvtier's C++ gather/scatter could move these pages as they are.

    cfg = MlaConfig(n_layers=4, d_model=256)
    model = MlaModel(cfg)
    cache = PagedKvCache(cfg, num_blocks=64, block_size=16)
    table = cache.allocate(200)                      # block ids of a 200-token sequence
    logits = model.prefill(tokens, cache, table)     # (vocab,) for the last prompt token
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MlaConfig:
    vocab: int = 512
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    nope_dim: int = 32      # per-head query/key dims without position
    rope_dim: int = 32      # shared rotary key dims (one k_rope per token, as in MLA)
    v_dim: int = 32         # per-head value dims
    kv_lora_rank: int = 64  # the compressed latent c_kv
    d_ff: int = 512
    seed: int = 0
    rope_base: float = 10000.0
    dtype: torch.dtype = torch.float32

    @property
    def latent_dim(self) -> int:
        """Elements of one cache row: c_kv followed by k_rope."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def elem_bytes(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()

    @property
    def kv_bytes_per_token(self) -> int:
        """s of the cost model: cache bytes of one token over all layers."""
        return self.n_layers * self.latent_dim * self.elem_bytes


class PagedKvCache:
    """Per layer a (num_blocks, block_size, latent) tensor; blocks handed out from a free list.

    The free list is shuffled from a seed so a sequence's blocks are not contiguous: slot
    arithmetic (slot = block * block_size + offset) is exercised, as in a real paged cache.
    """

    def __init__(self, cfg: MlaConfig, num_blocks: int, block_size: int, seed: int = 1):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.cfg, self.num_blocks, self.block_size = cfg, num_blocks, block_size
        self.layers = [torch.zeros(num_blocks, block_size, cfg.latent_dim, dtype=cfg.dtype)
                       for _ in range(cfg.n_layers)]
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self._free = order

    def allocate(self, num_tokens: int) -> list[int]:
        """Block ids for a sequence of num_tokens tokens (raises when the cache is full)."""
        need = -(-num_tokens // self.block_size)
        if need > len(self._free):
            raise MemoryError(f"paged cache full: {need} blocks wanted, {len(self._free)} free")
        table, self._free = self._free[:need], self._free[need:]
        return table

    def free(self, table: list[int]) -> None:
        self._free.extend(table)

    def slots(self, table: list[int], first: int, last: int) -> torch.Tensor:
        """Slots (block * block_size + offset) of sequence positions [first, last)."""
        pos = torch.arange(first, last)
        blocks = torch.tensor(table, dtype=torch.long)[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size

    def flat(self, layer: int) -> torch.Tensor:
        """Layer `layer` as (num_slots, latent): a view, writes go to the pages."""
        return self.layers[layer].view(-1, self.cfg.latent_dim)

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        self.flat(layer).index_copy_(0, slots, rows)

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return self.flat(layer).index_select(0, slots)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class MlaModel:
    """Deterministic weights from cfg.seed; forward over a span of positions with a paged cache."""

    def __init__(self, cfg: MlaConfig):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)

        def w(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g) / math.sqrt(rows)).to(cfg.dtype)

        d, h = cfg.d_model, cfg.n_heads
        self.embed = torch.randn(cfg.vocab, d, generator=g).to(cfg.dtype)
        self.layers = []
        for _ in range(cfg.n_layers):
            self.layers.append(dict(
                attn_norm=torch.ones(d, dtype=cfg.dtype),
                kv_norm=torch.ones(cfg.kv_lora_rank, dtype=cfg.dtype),
                w_q=w(d, h * (cfg.nope_dim + cfg.rope_dim)),
                w_dkv=w(d, cfg.kv_lora_rank),          # down-projection to the latent
                w_kr=w(d, cfg.rope_dim),               # shared rotary key
                w_uk=w(cfg.kv_lora_rank, h * cfg.nope_dim),  # latent -> per-head keys
                w_uv=w(cfg.kv_lora_rank, h * cfg.v_dim),     # latent -> per-head values
                w_o=w(h * cfg.v_dim, d),
                mlp_norm=torch.ones(d, dtype=cfg.dtype),
                w_gate=w(d, cfg.d_ff), w_up=w(d, cfg.d_ff), w_down=w(cfg.d_ff, d)))
        self.final_norm = torch.ones(d, dtype=cfg.dtype)
        self.lm_head = w(d, cfg.vocab)
        inv = 1.0 / (cfg.rope_base ** (torch.arange(0, cfg.rope_dim, 2, dtype=torch.float64) / cfg.rope_dim))
        self._inv_freq = inv

    # ---- pieces -----------------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary embedding on the last dim of x (..., T, [H,] rope_dim) at positions pos (T,)."""
        ang = (pos.to(torch.float64)[:, None] * self._inv_freq[None, :])
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        if x.dim() == 3:  # (T, H, rope)
            cos, sin = cos[:, None, :], sin[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def latents(self, layer: int, hn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Cache rows [c_kv | k_rope] of normed hidden states hn (T, d) at positions pos."""
        p, c = self.layers[layer], self.cfg
        ckv = _rms_norm(hn @ p["w_dkv"], p["kv_norm"])
        kr = self._rope(hn @ p["w_kr"], pos)
        return torch.cat([ckv, kr], dim=-1)

    def attend(self, layer: int, hn: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Causal attention of queries hn at positions pos over cache rows kv of positions [0, len(kv))."""
        p, c = self.layers[layer], self.cfg
        T, N, H = hn.shape[0], kv.shape[0], c.n_heads
        q = (hn @ p["w_q"]).view(T, H, c.nope_dim + c.rope_dim)
        q_nope, q_rope = q[..., :c.nope_dim], self._rope(q[..., c.nope_dim:], pos)
        ckv, kr = kv[:, :c.kv_lora_rank], kv[:, c.kv_lora_rank:]
        k_nope = (ckv @ p["w_uk"]).view(N, H, c.nope_dim)
        v = (ckv @ p["w_uv"]).view(N, H, c.v_dim)
        scores = torch.einsum("thd,nhd->htn", q_nope, k_nope) + torch.einsum("thd,nd->htn", q_rope, kr)
        scores = scores * (1.0 / math.sqrt(c.nope_dim + c.rope_dim))
        mask = torch.arange(N)[None, :] > pos[:, None]  # key position after the query: hidden
        scores = scores.masked_fill(mask[None], float("-inf"))
        out = torch.einsum("htn,nhd->thd", scores.softmax(-1), v).reshape(T, H * c.v_dim)
        return out @ p["w_o"]

    def mlp(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        p = self.layers[layer]
        hn = _rms_norm(x, p["mlp_norm"])
        return (torch.nn.functional.silu(hn @ p["w_gate"]) * (hn @ p["w_up"])) @ p["w_down"]

    def logits(self, x_last: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x_last, self.final_norm) @ self.lm_head

    # ---- one process, whole span ---------------------------------------------------------------

    @torch.no_grad()
    def forward_span(self, tokens: torch.Tensor, first: int, cache: PagedKvCache, table: list[int],
                     wait_for_layer=None) -> torch.Tensor:
        """Computes positions [first, first + len(tokens)) with the cache holding [0, first).

        Writes each layer's rows of the span into the pages; returns the last position's logits.
        wait_for_layer(l), when given, is called before layer l reads rows it did not compute
        (a load of [0, first) may still be landing layer by layer).
        """
        last = first + tokens.numel()
        pos = torch.arange(first, last)
        span_slots = cache.slots(table, first, last)
        all_slots = cache.slots(table, 0, last)
        x = self.embed[tokens]
        for l in range(self.cfg.n_layers):
            hn = _rms_norm(x, self.layers[l]["attn_norm"])
            cache.write(l, span_slots, self.latents(l, hn, pos))
            if wait_for_layer is not None and first > 0:
                wait_for_layer(l)
            x = x + self.attend(l, hn, pos, cache.read(l, all_slots))
            x = x + self.mlp(l, x)
        return self.logits(x[-1])

    def prefill(self, tokens: torch.Tensor, cache: PagedKvCache, table: list[int]) -> torch.Tensor:
        return self.forward_span(tokens, 0, cache, table)
