"""Deployment topology: regions, workers, the WAN matrix and cost constants, from TOML.

Everything latency-derived in KVCompass (index levels, routing scores) is computed offline
from one topology file, so the loader is strict: a typo in a field name or a missing WAN
pair is an error naming the file and the dotted field, never a silent default.

File format (all built-ins in ``kvcompass/topologies/`` follow it)::

    name = "testbed-3region"
    description = "..."

    [index]                       # the first five keys required
    block_size = 16               # tokens per KV block; every level length is a multiple
    value_bits = "auto"           # "auto", 32 or 64 (tier-field width of a Ludo value)
    fingerprint_bits = 0          # 0..16 extra bits per cell against false locators
    levels = 6                    # L, lengths per (edge, target region) pair
    local_min_tokens = 128        # first same-region length
    key_hash = "xxh3"             # optional: "xxh3" (default) or "sha256" (the paper's)
    long_context_levels = false   # optional: keep doubling past the L levels up to the
                                  # model's context (kvcompass.levels)

    [cost]
    gamma_ms_per_token = 0.0052   # DRAM -> VRAM reload cost
    intra_region_one_way_ms = 0.5 # optional, default 0.5

    [worker_defaults]             # optional; inherited by every region
    beta_ms_per_token = 0.085
    vram_bytes = 15_032_385_536
    dram_bytes = 68_719_476_736

    [model]                       # optional; the defaults are Llama-3.1-8B (BF16)
    name = "llama-3.1-8b"         # requests must name it; part of every key's namespace
    kv_bytes_per_token = 131072   # KV cache size per token (sizes the cache, prices reloads)
    context_tokens = 131072       # the longest prompt + output the model takes
    decode_ms_per_step = 9.0      # one decode step of a batch of one sequence
    decode_ms_per_step_per_seq = 0.15  # added per extra sequence in the batch

    [[regions]]
    name = "us"                   # [a-z][a-z0-9_]*: '-' is reserved as the separator below
    workers = 8                   # a count (ids "us-0".."us-7") or an array of tables
                                  # [{ id = "...", beta_ms_per_token = ... }, ...]
    # beta_ms_per_token / vram_bytes / dram_bytes here override [worker_defaults]

    [wan]                         # one-way ms, every unordered pair of regions exactly once
    "us-eu" = 160.0
"""

from __future__ import annotations

import math
import re
import statistics
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import ConfigError
from kvcompass.keys import DEFAULT_KEY_HASH, KeyHash

__all__ = [
    "AUTO_VALUE_BITS",
    "IndexSettings",
    "ModelSettings",
    "Region",
    "Topology",
    "TopologyError",
    "Worker",
    "builtin_names",
    "load_builtin",
    "load_topology",
]

#: ``IndexSettings.value_bits`` for "auto": the index picks 32 or 64 bits per region.
AUTO_VALUE_BITS: Final = 0
_VALUE_BITS: Final = {"auto": AUTO_VALUE_BITS, 32: 32, 64: 64}
_MAX_FINGERPRINT_BITS: Final = 16
_DEFAULT_INTRA_REGION_ONE_WAY_MS: Final = 0.5
_REGION_NAME = re.compile(r"[a-z][a-z0-9_]*")
_PACKAGE_DIR: Final = "topologies"


class TopologyError(ConfigError):
    """A topology file is unreadable or invalid; ``str()`` names the file and dotted field."""

    def __init__(self, path: str, field: str, message: str) -> None:
        self.path = path
        self.field = field
        self.message = message
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


@dataclass(frozen=True)
class Worker:
    """One inference instance; ``index`` is its position in ``Topology.workers``."""

    id: str
    region: str
    index: int
    beta_ms_per_token: float
    vram_bytes: int
    dram_bytes: int


@dataclass(frozen=True)
class Region:
    name: str
    workers: tuple[Worker, ...]

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError(f"region {self.name!r} has no workers")

    @property
    def beta_ms_per_token(self) -> float:
        """Median worker prefill rate: levels need one β per region, robust to one outlier."""
        return float(statistics.median(w.beta_ms_per_token for w in self.workers))


@dataclass(frozen=True)
class IndexSettings:
    block_size: int
    value_bits: int  # AUTO_VALUE_BITS (0), 32 or 64
    fingerprint_bits: int
    levels: int = 6
    local_min_tokens: int = 128
    key_hash: KeyHash = DEFAULT_KEY_HASH
    long_context_levels: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_hash", KeyHash(self.key_hash))  # ValueError if unknown
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.value_bits not in _VALUE_BITS.values():
            raise ValueError(f"value_bits must be 0 (auto), 32 or 64, got {self.value_bits}")
        if not 0 <= self.fingerprint_bits <= _MAX_FINGERPRINT_BITS:
            raise ValueError(f"fingerprint_bits must be in 0..16, got {self.fingerprint_bits}")
        if self.levels < 1:
            raise ValueError(f"levels must be at least 1, got {self.levels}")
        if self.local_min_tokens < 1:
            raise ValueError(f"local_min_tokens must be positive, got {self.local_min_tokens}")


@dataclass(frozen=True)
class ModelSettings:
    """The served model: its identity and the constants its cost model needs.

    Defaults are Llama-3.1-8B-Instruct in BF16 (the paper's model, §5.1):
    - KV per token = 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 B = 131,072 B.
    - context 128K tokens (the model card's 131,072).
    - decode is memory-bound: one step streams the 16.1 GB of weights, ~9 ms at the
      RTX 5090's 1.79 TB/s; each further sequence adds its KV reads, ~0.15 ms for a
      ~2K-token context (2,048 x 128 KiB / 1.79 TB/s). Our derivation, not measured.
    """

    name: str = "llama-3.1-8b"
    kv_bytes_per_token: int = 131_072
    context_tokens: int = 131_072
    decode_ms_per_step: float = 9.0
    decode_ms_per_step_per_seq: float = 0.15

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model name must not be empty")
        if self.kv_bytes_per_token < 1 or self.context_tokens < 1:
            raise ValueError("kv_bytes_per_token and context_tokens must be positive")
        if self.decode_ms_per_step <= 0 or self.decode_ms_per_step_per_seq < 0:
            raise ValueError("decode step times must be positive (per-sequence: >= 0)")


@dataclass(frozen=True, eq=False)
class Topology:
    """Regions in file order, a symmetric one-way WAN matrix (ms) and the cost constants.

    ``one_way_ms`` is stored read-only with a zero diagonal; :meth:`wan_ms` reports
    ``intra_region_one_way_ms`` for a region to itself.
    """

    name: str
    description: str
    regions: tuple[Region, ...]
    one_way_ms: NDArray[np.float64]
    gamma_ms_per_token: float
    index: IndexSettings
    intra_region_one_way_ms: float = _DEFAULT_INTRA_REGION_ONE_WAY_MS
    model: ModelSettings = ModelSettings()
    _region_pos: dict[str, int] = field(init=False, repr=False)
    _workers: tuple[Worker, ...] = field(init=False, repr=False)
    _worker_by_id: dict[str, Worker] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        wan = np.array(self.one_way_ms, dtype=np.float64)
        wan.setflags(write=False)
        object.__setattr__(self, "one_way_ms", wan)
        n = len(self.regions)
        if wan.shape != (n, n):
            raise ValueError(f"one_way_ms must be {n}x{n}, got shape {wan.shape}")
        off_diagonal = ~np.eye(n, dtype=bool)
        if np.any(np.diag(wan) != 0) or not np.array_equal(wan, wan.T):
            raise ValueError("one_way_ms must be symmetric with a zero diagonal")
        if not np.all(np.isfinite(wan)) or np.any(wan[off_diagonal] <= 0):
            raise ValueError("one_way_ms must be finite and positive between regions")
        if self.gamma_ms_per_token < 0 or self.intra_region_one_way_ms < 0:
            raise ValueError("gamma_ms_per_token and intra_region_one_way_ms must be >= 0")
        region_pos = {r.name: i for i, r in enumerate(self.regions)}
        if len(region_pos) != n:
            raise ValueError("duplicate region names")
        workers = tuple(w for r in self.regions for w in r.workers)
        by_id = {w.id: w for w in workers}
        if len(by_id) != len(workers):
            raise ValueError("duplicate worker ids")
        for i, w in enumerate(workers):
            if w.index != i or region_pos.get(w.region) is None:
                raise ValueError(f"worker {w.id!r}: index/region disagree with topology order")
        object.__setattr__(self, "_region_pos", region_pos)
        object.__setattr__(self, "_workers", workers)
        object.__setattr__(self, "_worker_by_id", by_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self._scalars() == other._scalars() and np.array_equal(
            self.one_way_ms, other.one_way_ms
        )

    def __hash__(self) -> int:
        return hash(self._scalars())

    def _scalars(self) -> tuple[object, ...]:
        return (
            self.name,
            self.description,
            self.regions,
            self.gamma_ms_per_token,
            self.index,
            self.intra_region_one_way_ms,
            self.model,
        )

    @property
    def workers(self) -> tuple[Worker, ...]:
        """All workers, region by region in file order (``Worker.index`` order)."""
        return self._workers

    def region(self, name: str) -> Region:
        return self.regions[self.region_index(name)]

    def region_index(self, name: str) -> int:
        try:
            return self._region_pos[name]
        except KeyError:
            raise KeyError(f"unknown region {name!r} in topology {self.name!r}") from None

    def worker(self, worker_id: str) -> Worker:
        try:
            return self._worker_by_id[worker_id]
        except KeyError:
            raise KeyError(f"unknown worker {worker_id!r} in topology {self.name!r}") from None

    def wan_ms(self, origin_region: str, target_region: str) -> float:
        """One-way latency between two regions (the intra-region setting if they are equal)."""
        i, j = self.region_index(origin_region), self.region_index(target_region)
        return self.intra_region_one_way_ms if i == j else float(self.one_way_ms[i, j])

    def rtt_ms(self, origin_region: str, target_region: str) -> float:
        return 2.0 * self.wan_ms(origin_region, target_region)


# --- loading -------------------------------------------------------------------------------


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology TOML file; raises :class:`TopologyError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(source, "", f"cannot read file: {exc.strerror or exc}") from exc
    return _parse(text, source)


def load_builtin(name: str) -> Topology:
    """Load a topology shipped in the package (see :func:`builtin_names`)."""
    resource = resources.files("kvcompass").joinpath(_PACKAGE_DIR, f"{name}.toml")
    if not resource.is_file():
        known = ", ".join(builtin_names())
        raise TopologyError(f"{name}.toml", "", f"no built-in topology {name!r}; known: {known}")
    return _parse(resource.read_text(encoding="utf-8"), f"{name}.toml")


def builtin_names() -> tuple[str, ...]:
    folder = resources.files("kvcompass").joinpath(_PACKAGE_DIR)
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml")))


_REQUIRED: Final[Any] = object()


@dataclass
class _Table:
    """One TOML table plus its dotted path; typed getters raise TopologyError at that path."""

    source: str
    where: str
    data: dict[str, Any]
    used: set[str] = field(default_factory=set)

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> TopologyError:
        return TopologyError(self.source, self.path(key), message)

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        self.used.add(key)
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise self.error(key, "is required")
        return default

    def integer(self, key: str, lo: int, hi: int | None = None, default: Any = _REQUIRED) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, f"must be an integer, got {value!r}")
        if value < lo or (hi is not None and value > hi):
            bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.error(key, f"must be {bound}, got {value}")
        return value

    def number(self, key: str, what: str, positive: bool, default: Any = _REQUIRED) -> Any:
        value = self.get(key, default)
        if value is None:
            return None
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
            sign = "positive" if positive else "non-negative"
            raise self.error(key, f"must be a {sign} number of {what}, got {value!r}")
        return float(value)

    def string(self, key: str, default: Any = _REQUIRED) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        return value

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def table(self, key: str, optional: bool = False) -> _Table:
        value = self.get(key, {} if optional else _REQUIRED)
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {value!r}")
        return _Table(self.source, self.path(key), value)

    def done(self) -> None:
        """Reject unknown keys: a misspelt optional field must not fall back silently."""
        for key in self.data:
            if key not in self.used:
                raise self.error(key, "unknown field")


def _parse(text: str, source: str) -> Topology:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(source, "", f"invalid TOML: {exc}") from exc
    top = _Table(source, "", data)
    name = top.string("name")
    description = top.string("description", "")
    index = _read_index(top.table("index"))
    cost = top.table("cost")
    gamma = cost.number("gamma_ms_per_token", "ms per token", positive=False)
    intra = cost.number(
        "intra_region_one_way_ms",
        "milliseconds",
        positive=False,
        default=_DEFAULT_INTRA_REGION_ONE_WAY_MS,
    )
    cost.done()
    model = _read_model(top.table("model", optional=True))
    defaults = _read_worker_params(top.table("worker_defaults", optional=True), (None,) * 3)
    regions = _read_regions(top, defaults)
    wan = _read_wan(top.table("wan", optional=True), [r.name for r in regions])
    top.done()
    return Topology(name, description, tuple(regions), wan, gamma, index, intra, model)


def _read_model(t: _Table) -> ModelSettings:
    d = ModelSettings()
    model = ModelSettings(
        name=t.string("name", d.name),
        kv_bytes_per_token=t.integer("kv_bytes_per_token", lo=1, default=d.kv_bytes_per_token),
        context_tokens=t.integer("context_tokens", lo=1, default=d.context_tokens),
        decode_ms_per_step=t.number(
            "decode_ms_per_step", "milliseconds", positive=True, default=d.decode_ms_per_step
        ),
        decode_ms_per_step_per_seq=t.number(
            "decode_ms_per_step_per_seq",
            "milliseconds",
            positive=False,
            default=d.decode_ms_per_step_per_seq,
        ),
    )
    if not model.name:
        raise t.error("name", "must not be empty")
    t.done()
    return model


def _read_index(t: _Table) -> IndexSettings:
    value_bits = t.get("value_bits")
    if isinstance(value_bits, bool) or value_bits not in _VALUE_BITS:
        raise t.error("value_bits", f'must be "auto", 32 or 64, got {value_bits!r}')
    settings = IndexSettings(
        block_size=t.integer("block_size", lo=1),
        value_bits=_VALUE_BITS[value_bits],
        fingerprint_bits=t.integer("fingerprint_bits", lo=0, hi=_MAX_FINGERPRINT_BITS),
        levels=t.integer("levels", lo=1),
        local_min_tokens=t.integer("local_min_tokens", lo=1),
        key_hash=_key_hash(t),
        long_context_levels=t.boolean("long_context_levels", default=False),
    )
    t.done()
    return settings


def _key_hash(t: _Table) -> KeyHash:
    value = t.get("key_hash", str(DEFAULT_KEY_HASH))
    if value not in [h.value for h in KeyHash]:
        known = ", ".join(f'"{h}"' for h in KeyHash)
        raise t.error("key_hash", f"must be one of {known}, got {value!r}")
    return KeyHash(value)


_Params = tuple[float | None, int | None, int | None]  # beta, vram, dram; None = not given


def _read_worker_params(t: _Table, inherited: _Params) -> _Params:
    """Read the three per-worker settings from ``t``, falling back to ``inherited``."""
    beta, vram, dram = inherited
    params = (
        t.number("beta_ms_per_token", "ms per token", positive=True, default=beta),
        t.integer("vram_bytes", lo=1, default=vram),
        t.integer("dram_bytes", lo=0, default=dram),
    )
    t.done()
    return params


def _require(t: _Table, params: _Params) -> tuple[float, int, int]:
    beta, vram, dram = params
    if beta is None or vram is None or dram is None:
        key = (
            "beta_ms_per_token" if beta is None else "vram_bytes" if vram is None else "dram_bytes"
        )
        raise t.error(key, "is required (here, in its region or in [worker_defaults])")
    return beta, vram, dram


def _read_regions(top: _Table, defaults: _Params) -> list[Region]:
    raw = top.get("regions")
    if not isinstance(raw, list) or not raw:
        raise top.error("regions", "must be a non-empty array of tables ([[regions]])")
    regions: list[Region] = []
    seen_ids: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"regions[{i}]"
        if not isinstance(entry, dict):
            raise TopologyError(top.source, where, f"must be a table, got {entry!r}")
        t = _Table(top.source, where, entry)
        name = t.string("name")
        if not _REGION_NAME.fullmatch(name):
            msg = "must match [a-z][a-z0-9_]* ('-' separates names in wan keys and worker ids)"
            raise t.error("name", f"{msg}, got {name!r}")
        if any(r.name == name for r in regions):
            raise t.error("name", f"duplicate region {name!r}")
        spec = t.get("workers")
        region_params = _read_worker_params(t, defaults)  # also rejects unknown keys
        first = sum(len(r.workers) for r in regions)
        workers = _read_workers(t, name, spec, region_params, first)
        for w in workers:
            if w.id in seen_ids:
                raise t.error("workers", f"duplicate worker id {w.id!r}")
            seen_ids.add(w.id)
        regions.append(Region(name, workers))
    return regions


def _read_workers(
    t: _Table, region: str, spec: Any, params: _Params, first: int
) -> tuple[Worker, ...]:
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise t.error("workers", f"must be a positive count, got {spec}")
        beta, vram, dram = _require(t, params)
        return tuple(
            Worker(f"{region}-{k}", region, first + k, beta, vram, dram) for k in range(spec)
        )
    if not isinstance(spec, list) or not spec or not all(isinstance(w, dict) for w in spec):
        raise t.error("workers", f"must be a positive count or an array of tables, got {spec!r}")
    workers = []
    for k, entry in enumerate(spec):
        wt = _Table(t.source, t.path(f"workers[{k}]"), entry)
        worker_id = wt.string("id", f"{region}-{k}")
        if not worker_id:
            raise wt.error("id", "must not be empty")
        beta, vram, dram = _require(wt, _read_worker_params(wt, params))
        workers.append(Worker(worker_id, region, first + k, beta, vram, dram))
    return tuple(workers)


def _read_wan(t: _Table, names: list[str]) -> NDArray[np.float64]:
    pos = {name: i for i, name in enumerate(names)}
    wan = np.zeros((len(names), len(names)), dtype=np.float64)
    given: dict[frozenset[str], str] = {}
    for key in t.data:
        field_name = f'wan."{key}"'
        a, sep, b = key.partition("-")
        if not sep or a not in pos or b not in pos or a == b:
            msg = 'must name two different regions as "a-b"'
            raise TopologyError(t.source, field_name, f"{msg}; regions are {', '.join(names)}")
        pair = frozenset((a, b))
        if pair in given:
            raise TopologyError(t.source, field_name, f'pair already given as "{given[pair]}"')
        given[pair] = key
        value = t.data[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value <= 0:
            msg = f"must be a positive number of milliseconds, got {value!r}"
            raise TopologyError(t.source, field_name, msg)
        wan[pos[a], pos[b]] = wan[pos[b], pos[a]] = float(value)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if frozenset((a, b)) not in given:
                raise TopologyError(t.source, f'wan."{a}-{b}"', "is required (one-way ms)")
    return wan
