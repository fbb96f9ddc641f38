# examples/readme/readme.py: the Python program README.md shows, run by the test readme_python
# and checked line for line against the README's block by readme_python_snippet.
# README-BEGIN
from concurrent.futures import ThreadPoolExecutor

import kvtier
import torch

W, T, PAGE, LAYERS, BLOCKS = 2, 256, 64, 4, 128  # ranks (threads here), tokens per chunk and page

def compute(pages, slots, first, end):
    """The model: the KV of positions [first, end) into the pages (the same on every rank)."""
    kv = torch.arange(first, end, dtype=torch.float32)[:, None].expand(-1, 576)
    for layer, page in enumerate(pages):
        page.view(-1, 576)[slots[first:end]] = (kv + layer).to(torch.bfloat16)

def rank_main(comm, tokens, out):
    ns = kvtier.KeyNamespace("my-model", "mla-bf16", chunk_tokens=T, ownership=f"mod:{W}")
    pages = [torch.zeros(BLOCKS, PAGE, 576, dtype=torch.bfloat16) for _ in range(LAYERS)]
    view = kvtier.KvCacheView.per_layer(kvtier.KvLayout.vllm_mla(LAYERS, BLOCKS, PAGE), pages)
    l2 = kvtier.MemoryStore(64 << 20)  # an engine: kvtier.RemoteStore(f"resp://10.0.0.5:{6400 + comm.rank}", ns)
    store = kvtier.TieredStore(kvtier.MemoryStore(64 << 20), l2)
    with kvtier.Connector(kvtier.Chunker(ns), store, comm, view, lookup_timeout=2.0) as conn:
        conn.check_deployment(10.0)  # every rank configured alike, else InvalidArgument naming the field
        for rid, first_block in ((1, 0), (2, 64)):  # the same prompt twice: computed, then loaded
            table = torch.arange(first_block, first_block + -(-len(tokens) // PAGE), dtype=torch.int32)
            slots = (table[:, None].long() * PAGE + torch.arange(PAGE)).flatten()[: len(tokens)]
            conn.begin_lookup(rid, tokens)  # never blocks: the owners ask their stores
            while (plan := conn.lookup(rid)) is None:
                conn.step(2.0)  # one all-reduce: every rank gets the same plan
            loaded = 0
            if plan.tokens_to_load:
                conn.load(rid, block_table=table)  # owners fetch, chunks move into every rank's pages
                while (result := conn.load_result(rid)) is None:
                    conn.step(2.0)
                loaded = result.loaded_end_token  # a failure only shortens it, on every rank
            compute(pages, slots, loaded, len(tokens))
            conn.save(rid, slots, loaded, len(tokens))  # owners write their new chunks, off the step
            saved = set() if not conn.finish(rid) else {rid}  # False: the saves still read the pages
            while conn.step(2.0, words=[rid in saved])[0] == 0:  # the min over ranks: all saved
                saved.update(conn.finished().saves)  # never blocks; free the pages of what it lists
            out[comm.rank].append((rid, loaded, len(tokens) - loaded))

tokens = [i * 7919 % 151552 for i in range(10 * T + 100)]  # 10 full chunks and a tail
world, out = kvtier.InprocWorld(W), [[] for _ in range(W)]
with ThreadPoolExecutor(W) as ranks:  # one thread a rank; a rank's exception is raised here
    list(ranks.map(lambda r: rank_main(world.communicator(r), tokens, out), range(W)))
for rid, loaded, computed in out[0]:
    print(f"request {rid}: {len(tokens)} tokens, {loaded} loaded, {computed} computed")
# README-END
assert all(o == out[0] for o in out) and len(out[0]) == 2, f"ranks disagree or failed: {out}"
