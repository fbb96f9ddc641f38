"""Type stubs of kvtier._kvtier (python/src/*.cpp). Every name is re-exported by `kvtier`."""
import builtins
import enum
from typing import Any, Iterable, Optional, Sequence, Tuple, Union

# Any buffer-protocol object: bytes (sources only), bytearray, memoryview, numpy.ndarray.
Buffer = Union[bytes, bytearray, memoryview, Any]

__version__: str

# A CPU torch.Tensor, taken by data_ptr() (torch is never imported by kvtier).
Tensor = object
Bytes = Union[Buffer, Tensor]
TokenIds = Union[Sequence[int], Buffer, Tensor]
DeadlineLike = Union[float, int, "Deadline"]

class Errc(enum.IntEnum):
    timeout = 1
    connection_lost = 2
    connection_refused = 3
    resolve_failed = 4
    not_connected = 5
    protocol_error = 6
    server_error = 7
    unexpected_reply = 8
    too_large = 9
    corrupt_value = 10
    wrong_length = 11
    auth_failed = 12
    cancelled = 13
    shutdown = 14
    queue_full = 15
    bad_url = 16
    invalid_argument = 17
    collective_mismatch = 18
    backend_error = 19
    tls_failed = 20
    resource_exhausted = 21
    store_threw = 22

class Error(Exception):
    """Base of every kvtier error.

        try:
            store.get(keys, dst, 0.5)
        except kvtier.Error as e:
            print(e.code_name, e.status)
    """
    code: Optional[Errc]
    code_name: str
    status: Optional[list[Status]]

class TimeoutError(Error, builtins.TimeoutError): ...
class InvalidArgument(Error, ValueError): ...
class BadUrl(InvalidArgument): ...
class ConnectionError(Error, builtins.ConnectionError): ...
class ClosedError(Error): ...
class CorruptValue(Error): ...
class ServerError(Error): ...
class ProtocolError(Error): ...

class Deadline:
    """One instant for every call of a request.

        dl = kvtier.Deadline.after(2.0); store.exists(keys, dl); store.get(keys, dst, dl)
    """
    @staticmethod
    def after(seconds: float) -> Deadline: ...
    @staticmethod
    def never() -> Deadline: ...
    def remaining(self) -> float: ...
    def expired(self) -> bool: ...

def deadline_after(seconds: float) -> Deadline:
    """dl = kvtier.deadline_after(0.5)"""

# ---- keys ----------------------------------------------------------------------------------
class ChunkKey:
    """k = kvtier.ChunkKey(1, 2); kvtier.ChunkKey.from_hex(k.hex()) == k"""
    hi: int
    lo: int
    def __init__(self, hi: int = 0, lo: int = 0) -> None: ...
    @staticmethod
    def from_hex(text: str) -> ChunkKey: ...
    def hex(self) -> str: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __lt__(self, other: ChunkKey) -> bool: ...

def content_hash(data: Bytes) -> ChunkKey:
    """kvtier.MediaItem(offset=10, length=64, content_hash=kvtier.content_hash(image_bytes))"""

class KeyNamespace:
    """ns = kvtier.KeyNamespace('my-model', 'fp8', chunk_tokens=256)"""
    model: str
    kv_format: str
    chunk_tokens: int
    layout_version: int
    ownership: str
    def __init__(self, model: str, kv_format: str, chunk_tokens: int = 256, layout_version: int = 1,
                 ownership: str = "mod:1") -> None: ...
    def canonical(self) -> str: ...
    def root(self) -> ChunkKey: ...
    def fingerprint(self) -> int: ...
    def text(self) -> str: ...
    def remote_key_prefix(self) -> str: ...
    def remote_key(self, key: ChunkKey) -> str: ...

class MediaItem:
    """kvtier.MediaItem(offset=10, length=64, content_hash=kvtier.ChunkKey(7, 9))"""
    offset: int
    length: int
    content_hash: ChunkKey
    def __init__(self, offset: int, length: int, content_hash: ChunkKey) -> None: ...

class Chunker:
    """keys = kvtier.Chunker(ns).keys(torch.tensor(ids), adapter='lora-7')"""
    namespace: KeyNamespace
    chunk_tokens: int
    hash: str
    def __init__(self, namespace: KeyNamespace, tail: str = "drop", hash: str = "xxh3-128") -> None: ...
    def key_count(self, n_tokens: int) -> int: ...
    def root(self, adapter: str = "", tenant_salt: str = "") -> ChunkKey: ...
    def keys(self, tokens: TokenIds, *, adapter: str = "", tenant_salt: str = "",
             media: Optional[Sequence[MediaItem]] = None) -> list[ChunkKey]: ...
    def extend(self, prev: ChunkKey, tokens: TokenIds, media: Optional[Sequence[MediaItem]] = None) -> list[ChunkKey]: ...
    def remote_key(self, key: ChunkKey) -> str: ...

# ---- cost model and the probe's fit ---------------------------------------------------------
class PrefillNode:
    """node = kvtier.PrefillNode(kv_bytes_per_token=48.4e3, prefill_tokens_per_s=52.2e3)"""
    kv_bytes_per_token: float
    prefill_tokens_per_s: float
    def __init__(self, kv_bytes_per_token: float, prefill_tokens_per_s: float) -> None: ...

class LoadPath:
    """path = kvtier.LoadPath(fixed_cost_s=0.002, bandwidth_gb_per_s=3.0)"""
    fixed_cost_s: float
    bandwidth_gb_per_s: float
    def __init__(self, fixed_cost_s: float, bandwidth_gb_per_s: float) -> None: ...

class LoadSample:
    gb: float
    seconds: float
    def __init__(self, gb: float, seconds: float) -> None: ...

class LoadDecision:
    load: bool
    predicted_load_s: float
    recompute_s: float

class SplitPlan:
    k_tokens: float
    predicted_s: float
    full_load_s: float
    recompute_s: float

def kv_gb(tokens: float, kv_bytes_per_token: float) -> float: ...
def break_even_bandwidth_gb_per_s(node: PrefillNode) -> float:
    """B* = s*R: kvtier.break_even_bandwidth_gb_per_s(node)  # 2.53"""
def recompute_time_s(node: PrefillNode, tokens: float) -> float: ...
def load_time_s(path: LoadPath, gb: float) -> float: ...
def predicted_hit_time_s(node: PrefillNode, path: LoadPath, tokens: float) -> float: ...
def min_profitable_tokens(node: PrefillNode, path: LoadPath) -> float: ...
def utilisation(arrivals_per_s: float, gb_per_request: float, bandwidth_gb_per_s: float) -> float: ...
def recompute_externality_s(work_s: float, utilisation: float) -> float: ...
def decide_load(node: PrefillNode, path: LoadPath, hit_tokens: float, min_saving_s: float = 0.0) -> LoadDecision:
    """kvtier.decide_load(node, path, 16384).load"""
def split_point(node: PrefillNode, path: LoadPath, hit_tokens: float, prompt_tokens: float,
                granularity: float = 1.0) -> SplitPlan:
    """kvtier.split_point(node, path, 16384, 20000, granularity=256).k_tokens"""
def fit_fixed_cost_s(measured_s: float, gb: float, bandwidth_gb_per_s: float) -> float: ...
def instance_rate_gb_per_s(sustained_gb_per_s: float, gb: float, fixed_cost_s: float) -> float: ...
def fit_load_path(samples: Iterable[Union[LoadSample, Tuple[float, float]]]) -> Optional[LoadPath]:
    """kvtier.fit_load_path([(0.1, 0.035), (0.2, 0.068), (0.4, 0.135)])"""

class LoadEstimator:
    """est = kvtier.LoadEstimator(kvtier.LoadPath(0.001, 2.0)); est.record(0.1, 0.05); est.estimate()"""
    samples: int
    def __init__(self, prior: LoadPath, half_life_samples: float = 64.0, min_relative_spread: float = 0.2) -> None: ...
    def record(self, gb: float, seconds: float) -> bool: ...
    def record_bytes(self, bytes: int, seconds: float) -> bool: ...
    def estimate(self) -> LoadPath: ...
    def split(self, node: PrefillNode, hit_tokens: float, prompt_tokens: float, granularity: float = 1.0) -> SplitPlan: ...
    def decide(self, node: PrefillNode, hit_tokens: float, min_saving_s: float = 0.0) -> LoadDecision: ...

class BatchSample:
    batch: int
    gb: float
    seconds: float
    def __init__(self, batch: int, gb: float, seconds: float) -> None: ...

class SizeCheck:
    batch: int
    median_s: float
    predicted_s: float
    error: float

class FitReport:
    path: LoadPath
    fitted_t0_s: float
    clamped: bool
    t0_interval_s: Tuple[float, float]
    b_interval_gbps: Tuple[float, float]
    rms_residual_s: float
    samples: int
    sizes: list[SizeCheck]
    max_abs_error: float

def fit_batches(samples: Iterable[Union[BatchSample, Tuple[int, float, float]]]) -> Optional[FitReport]:
    """r = kvtier.fit_batches([(8, 0.099, 0.095), (4, 0.050, 0.049), (2, 0.025, 0.026)])"""

# ---- URLs ------------------------------------------------------------------------------------
class Endpoint:
    """ep = kvtier.parse_url('resp://app:pw@127.0.0.1:6379/2'); ep.describe()  # '127.0.0.1:6379/2'"""
    transport: str  # 'tcp' or 'unix'
    host: str
    port: int
    path: str
    user: str
    password: str
    db: int
    tls: bool
    def describe(self) -> str: ...

class ClusterUrl:
    seeds: list[Endpoint]
    placement: str  # 'spread' or 'pinned'

def parse_url(url: str, rank: Optional[int] = None) -> Endpoint:
    """kvtier.parse_url('resp://127.0.0.1:{rank+6400}', rank=2).port  # 6402"""
def redact_url(url: str) -> str:
    """kvtier.redact_url('resp://app:s3cret@h:6379/2')  # 'resp://app:***@h:6379/2'"""
def substitute_rank(template: str, rank: int) -> str: ...
def is_cluster_url(url: str) -> bool: ...
def parse_cluster_url(url: str) -> ClusterUrl: ...

# ---- stores ----------------------------------------------------------------------------------
class Status(enum.IntEnum):
    hit = 0
    miss = 1
    corrupt = 2
    timeout = 3
    error = 4
    cancelled = 5
    stored = 6

Values = Union[Bytes, Sequence[Bytes]]

class Store:
    """status = store.get(keys, torch.empty(len(keys), 4096, dtype=torch.uint8), 0.5)

    Values are bytes (uint8, int8) or a KV page's float16/bfloat16/float8; another dtype, or a
    destination of another size than the stored value, raises kvtier.InvalidArgument."""
    closed: bool
    kind: str
    identity: str  # 'host:port/db' of a RemoteStore's server ('' for memory, cluster, composed)
    def exists(self, keys: Sequence[ChunkKey], deadline: DeadlineLike) -> list[Status]: ...
    def get(self, keys: Sequence[ChunkKey], dst: Values, deadline: DeadlineLike, *,
            value_bytes: Optional[int] = None) -> list[Status]: ...
    def put(self, keys: Sequence[ChunkKey], src: Values, deadline: DeadlineLike, *,
            value_bytes: Optional[int] = None) -> list[Status]: ...
    def close(self) -> None: ...
    def last_error(self) -> str: ...
    def __enter__(self) -> Store: ...
    def __exit__(self, *exc: object) -> None: ...

class MemoryStore(Store):
    """l1 = kvtier.MemoryStore(8 << 30)"""
    size_bytes: int
    entry_count: int
    def __init__(self, capacity_bytes: int) -> None: ...
    def contains(self, key: ChunkKey) -> bool: ...
    def erase(self, key: ChunkKey) -> bool: ...
    def clear(self) -> None: ...
    def stats(self) -> dict[str, int]: ...

class TlsOptions:
    """kvtier.RemoteStore('rediss://10.0.0.7:6380', ns, tls=kvtier.TlsOptions(ca_file='/etc/kvtier/ca.pem'))"""
    ca_file: str
    cert_file: str
    key_file: str
    server_name: str
    verify_peer: bool
    def __init__(self, *, ca_file: str = "", cert_file: str = "", key_file: str = "", server_name: str = "",
                 verify_peer: bool = True) -> None: ...

class RemoteStore(Store):
    """l2 = kvtier.RemoteStore('resp://127.0.0.1:{rank+6400}', ns, rank=0)"""
    def __init__(self, url: str, namespace: KeyNamespace, *, rank: Optional[int] = None, connections: int = 4,
                 reserved_small: int = 1, connect_timeout: float = 2.0, protocol: int = 2, value_format: int = 1,
                 group_bytes: int = 0, password_file: str = "", client_name: str = "",
                 tls: Optional[TlsOptions] = None) -> None: ...
    def stats(self) -> dict[str, int]: ...

class ClusterStore(Store):
    """l2 = kvtier.ClusterStore('resp+cluster://127.0.0.1:7000?placement=pinned', ns, rank=0)"""
    def __init__(self, url: str, namespace: KeyNamespace, *, rank: int = 0, connections: int = 4,
                 reserved_small: int = 1, connect_timeout: float = 2.0, protocol: int = 2, value_format: int = 1,
                 group_bytes: int = 0, max_rounds: int = 6,
                 tls: Optional[TlsOptions] = None) -> None: ...
    def stats(self) -> dict[str, int]: ...

class RendezvousStore(Store):
    """s = kvtier.RendezvousStore([kvtier.RemoteStore(u, ns) for u in urls])"""
    size: int
    names: list[str]
    def __init__(self, instances: Sequence[Store], seed: int = 0, *, names: Optional[Sequence[str]] = None) -> None: ...
    def instance_of(self, key: ChunkKey) -> int: ...

class TieredStore(Store):
    """tiers = kvtier.TieredStore(kvtier.MemoryStore(1 << 30), l2)"""
    def __init__(self, l1: Store, l2: Store, *, writes: str = "write_through", promote: bool = True) -> None: ...
    def stats(self) -> dict[str, int]: ...

# ---- the connector (python/src/bind_pages.cpp, bind_mpi.cpp, bind_connector.cpp) -----------

Ints = Union[Sequence[int], Buffer, Tensor]

class KvLayout:
    """lay = kvtier.KvLayout.vllm_mla(4, num_blocks=1024, block_size=64); lay.bytes_per_token  # 4 * 1152"""
    name: str
    num_layers: int
    num_blocks: int
    block_size: int
    planes: int
    heads: int
    head_bytes: int
    elem_bytes: int
    block_stride: int
    token_stride: int
    head_stride: int
    plane_stride: int
    layer_stride: int
    bytes_per_token: int
    layer_bytes_per_token: int
    num_slots: int
    layer_extent: int
    plane_extent: int
    cache_extent: int
    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, planes: int, heads: int,
                 head_bytes: int, elem_bytes: int, block_stride: int, token_stride: int, head_stride: int,
                 plane_stride: int = 0, layer_stride: int = 0, name: str = "custom") -> None: ...
    @staticmethod
    def vllm_mla(layers: int, num_blocks: int, block_size: int, elem_bytes: int = 2,
                 latent: int = 576) -> KvLayout: ...
    @staticmethod
    def vllm_mla_fp8(layers: int, num_blocks: int, block_size: int) -> KvLayout: ...
    @staticmethod
    def vllm_flash_attn(layers: int, num_blocks: int, block_size: int, heads: int, head_size: int,
                        elem_bytes: int = 2, order: str = "nhd") -> KvLayout: ...
    @staticmethod
    def cross_layer(layers: int, num_blocks: int, block_size: int, planes: int, heads: int, head_size: int,
                    elem_bytes: int = 2) -> KvLayout: ...

class KvCacheView:
    """view = kvtier.KvCacheView.per_layer(lay, [torch.zeros(1024, 64, 576, dtype=torch.bfloat16)] * 4)"""
    layout: KvLayout
    num_planes: int
    @staticmethod
    def per_layer(layout: KvLayout, pages: Sequence[Bytes]) -> KvCacheView: ...
    @staticmethod
    def per_plane(layout: KvLayout, pages: Sequence[Bytes]) -> KvCacheView: ...
    @staticmethod
    def one_base(layout: KvLayout, page: Bytes) -> KvCacheView: ...

class InprocWorld:
    """comms = [kvtier.InprocWorld(2).communicator(r) for r in range(2)]  # one per rank thread"""
    size: int
    def __init__(self, size: int) -> None: ...
    def communicator(self, rank: int) -> InprocCommunicator: ...

class InprocCommunicator:
    """comm = kvtier.InprocWorld(2).communicator(0)"""
    rank: int
    size: int
    def last_error(self) -> str: ...

class MpiCommunicator:
    """comm = kvtier.MpiCommunicator(MPI.COMM_WORLD, 10.0)  # only where built with mpi4py's headers"""
    rank: int
    size: int
    def __init__(self, comm: Any, deadline: DeadlineLike = 10.0) -> None: ...
    def last_error(self) -> str: ...

class LoadPlan:
    """plan = conn.lookup(7)  # None until every rank's answer is agreed"""
    cached_tokens: int
    prompt_tokens: int
    load_first_token: int
    load_end_token: int
    tokens_to_load: int

class LoadOutcome:
    """out = conn.load_result(7); compute_from(out.loaded_end_token)"""
    load_first_token: int
    loaded_end_token: int
    requested_end_token: int
    complete: bool

class RequestError:
    """for e in conn.errors(7): log(e.message)  # "rank 1: save of chunk 3: ..." (this rank's own)"""
    id: int
    stage: str  # "lookup", "load" or "save"
    chunk: int
    code: Optional[Errc]  # as kvtier.Error's: None for a key the store did not have or keep
    code_name: str  # "timeout", "system:111", ...; "" when code says nothing
    message: str

class FinishedRequests:
    """done = conn.finished(); free_pages(done.saves)"""
    loads: list[int]
    saves: list[int]
    save_errors: list[RequestError]

class KvEvent:
    """for e in conn.drain_events(): router.update(e.kind, e.rank, e.keys)"""
    kind: str
    rank: int
    keys: list[ChunkKey]

class Connector:
    """One rank's kvtier::connector; every rank makes the same calls in the same order. The
    namespace's ownership is the policy's geometry ('mod' at W ranks: 'mod:W'), else InvalidArgument.

        ns = kvtier.KeyNamespace("my-model", "fp8", chunk_tokens=256, ownership=f"mod:{comm.size}")
        conn = kvtier.Connector(kvtier.Chunker(ns), store, comm, view)
        conn.check_deployment(5.0)
        conn.begin_lookup(7, tokens)
        while (plan := conn.lookup(7)) is None: conn.step(0.05)
        if plan.tokens_to_load: conn.load(7, block_table=table)
        while (out := conn.load_result(7)) is None: conn.step(0.05)
        for l in range(layers): conn.wait_for_layer(l, 1.0)   # in the forward
        conn.save(7, slots, out.loaded_end_token, len(tokens))
        if not conn.finish(7): ...                             # free once finished().saves has 7
    """
    rank: int
    chunk_bytes: int
    closed: bool
    def __init__(self, chunker: Chunker, store: Store, comm: Union[InprocCommunicator, MpiCommunicator],
                 pages: KvCacheView, *, data: Optional[Union[InprocCommunicator, MpiCommunicator]] = None,
                 policy: str = "always", node: Optional[PrefillNode] = None, prior: Optional[LoadPath] = None,
                 lookup_timeout: float = 0.05, save_timeout: float = 2.0,
                 load_timeout: Tuple[float, float, float] = (0.2, 0.02, 5.0), saves: str = "write_through",
                 save_after_lookups: int = 2, layers_per_group: int = 0, max_bytes_in_flight: int = 1 << 30,
                 fetch_workers: int = 2, fetch_batch_chunks: int = 1,
                 ownership: str = "mod", wall_clock_samples: bool = True) -> None: ...  # or "block:I", "rendezvous[:SEED]"
    def check_deployment(self, deadline: DeadlineLike) -> None: ...
    def begin_lookup(self, id: int, tokens: TokenIds, *, adapter: str = "", tenant_salt: str = "",
                     prompt_tokens: Optional[int] = None) -> None: ...
    def step(self, deadline: DeadlineLike, words: Optional[Sequence[int]] = None) -> Optional[list[int]]: ...
    def lookup(self, id: int) -> Optional[LoadPlan]: ...
    def load(self, id: int, slots: Optional[Ints] = None, *, block_table: Optional[Ints] = None,
             first_token: Optional[int] = None, end_token: Optional[int] = None) -> None: ...
    def wait_local(self, id: int, deadline: DeadlineLike) -> None: ...
    def begin_save(self, id: int, slots: Ints, first_token: int, end_token: int) -> None: ...
    def save_layer(self, id: int, layer: int) -> None: ...
    def wait_for_save(self, id: int, deadline: DeadlineLike) -> None: ...
    def limit_load(self, id: int, chunks: int) -> None: ...
    def cancel_load(self, id: int) -> None: ...
    def record_load_sample(self, bytes: int, seconds: float) -> None: ...
    def wait_for_layer(self, layer: int, deadline: DeadlineLike) -> dict[int, int]: ...
    def load_result(self, id: int) -> Optional[LoadOutcome]: ...
    def load_errors(self, id: int) -> list[int]: ...
    def save(self, id: int, slots: Ints, first_token: int, end_token: int, *,
             tokens: Optional[TokenIds] = None) -> None: ...
    def errors(self, id: int) -> list[RequestError]: ...
    def finish(self, id: int) -> bool: ...
    def finished(self) -> FinishedRequests: ...
    def drain_events(self) -> list[KvEvent]: ...
    def counters(self) -> dict[str, int]: ...
    def prometheus(self, prefix: str = "kvtier_connector", labels: str = "") -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> Connector: ...
    def __exit__(self, *args: Any) -> None: ...
