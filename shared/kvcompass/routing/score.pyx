# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=False
# cython: embedsignature=True, binding=True, auto_pickle=False
# distutils: extra_compile_args = -O2 -ffp-contract=off
"""The joint score (paper §3.4), with every per-worker constant resolved once per edge.

score(r) = WAN(o,r) + T̂q(r) + (1+λ)·β_r·(L − b_r·m_r) + γ·b_r·m_r·1[t_r = dram]

- WAN(o, r): the round trip from the edge's region to r's (the request goes there, its
  tokens come back), the same RTT that places the first remote level n1 = RTT/β_r, so
  on an idle pool a remote holder wins exactly when its match is worth the trip. With a
  remote margin m (``RoutingConfig.remote_margin_rtt``, 0 in the paper) a worker in
  another region is charged (1 + m)·RTT.
- T̂q(r): the edge's queue estimate (:mod:`kvcompass.routing.queues`).
- λ = min(λmax, min_r T̂q(r)/τ): the capacity price (see ``RoutingConfig.tau_ms``).
- β_r: worker r's prefill ms per token; b_r its cache belief; m_r, t_r its longest match
  and tier from the index.
- γ: the topology's DRAM→VRAM reload ms per token, which the topology derives as KV
  bytes per token ÷ PCIe host-to-device bandwidth (128 KiB / 50 GB/s on testbed-3region).

Compiled (Cython): every router decision scores and ranks every worker of the topology,
and in Python that was a third of a decision on 64 workers. The arithmetic is the
Python expressions' own, term by term in their order, in C doubles with contraction
off (``-ffp-contract=off``): the same floats, so the same decisions. The signatures are
in ``score.pyi``.
"""

from array import array

cimport cpython.array
from libc.string cimport memcpy, memmove

from kvcompass.index.layout import Tier
from kvcompass.routing.policy import Candidate

__all__ = ["JointScore"]

cdef long _DRAM = int(Tier.DRAM)
cdef tuple _TIERS = tuple(Tier)  # by field value: cheaper than Tier(value)
cdef object _ABSENT = Tier.ABSENT
#: What Candidate(...) calls once its Python __new__ has bound the arguments: half the time.
cdef object _new_candidate = tuple.__new__
#: The type of :meth:`JointScore.choose`'s scores, cloned.
cdef cpython.array.array _DOUBLES = array("d")


cdef class JointScore:
    """Scores all workers of a topology for requests arriving in ``origin_region``."""

    cdef readonly Py_ssize_t n_workers
    cdef readonly object workers
    cdef readonly str origin_region
    cdef readonly tuple ids
    cdef readonly tuple regions
    cdef readonly tuple remote
    cdef readonly tuple wan
    cdef readonly tuple beta
    cdef readonly double gamma
    cdef readonly bint load_aware
    cdef readonly bint xregion_reuse
    cdef readonly double lambda_max
    cdef readonly double tau_ms
    # The tuples above as C arrays, for the per-request loops.
    cdef double[::1] _wan
    cdef double[::1] _beta
    cdef unsigned char[::1] _remote
    # The local workers, then the remote ones: tie_order's groups before rotation.
    cdef long long[::1] _groups
    cdef Py_ssize_t _n_local
    # Scratch of rank: the order being sorted and a merge buffer.
    cdef long long[::1] _order
    cdef long long[::1] _merge
    cdef double[::1] _keys
    cdef double[::1] _queues

    def __init__(
        self,
        topology,
        str origin_region,
        ablations,
        double lambda_max,
        double tau_ms,
        double remote_margin_rtt=0.0,
    ):
        workers = topology.workers
        cdef Py_ssize_t n = len(workers)
        self.n_workers = n
        self.workers = range(n)
        self.origin_region = origin_region
        self.ids = tuple([w.id for w in workers])
        self.regions = tuple([w.region for w in workers])
        self.remote = tuple([w.region != origin_region for w in workers])
        self.wan = tuple([
            topology.rtt_ms(origin_region, w.region) * (1.0 + remote_margin_rtt * far)
            for w, far in zip(workers, self.remote, strict=True)
        ])
        self.beta = tuple([w.beta_ms_per_token for w in workers])
        self.gamma = topology.gamma_ms_per_token if ablations.tier_aware else 0.0
        self.load_aware = ablations.load_aware
        self.xregion_reuse = ablations.xregion_reuse
        self.lambda_max = lambda_max
        self.tau_ms = tau_ms
        self._wan = _doubles(self.wan)
        self._beta = _doubles(self.beta)
        self._remote = bytearray(self.remote)
        # Stable sorts over a tie order break exact score ties local region first, then
        # by a rotating start within each group (see :meth:`tie_order`).
        local = [w for w in range(n) if not self.remote[w]]
        remote = [w for w in range(n) if self.remote[w]]
        self._groups = array("q", local + remote)
        self._n_local = len(local)
        self._order = _indices(n)
        self._merge = _indices(n)
        self._keys = _doubles((0.0,) * n)
        self._queues = _doubles((0.0,) * n)

    def price(self, queues):
        """λ = min(λmax, min_r T̂q(r) / τ); 0 without load awareness."""
        return self._price(queues)

    cdef double _price(self, object queues) except? -1.0:
        if not self.load_aware:
            return 0.0
        cdef list q = _as_list(queues)
        cdef Py_ssize_t i, n = len(q)
        if n == 0:
            raise ValueError("price() of no queues")
        cdef double least = q[0]
        cdef double v
        for i in range(1, n):  # min()'s own rule: a later value wins only if smaller
            v = q[i]
            if v < least:
                least = v
        v = least / self.tau_ms
        return v if v < self.lambda_max else self.lambda_max

    def credited(self, Py_ssize_t worker, Py_ssize_t matched):
        """The match the score credits: remote ones count 0 without cross-region reuse."""
        return matched if self.xregion_reuse or not self._remote[worker] else 0

    def scores(
        self,
        Py_ssize_t prompt_tokens,
        lengths,
        tiers,
        belief,
        queues,
        double lam,
    ):
        """Every worker's score; without load awareness, ``queues`` holds only the
        failed workers' +inf (``QueueEstimates.blocked``)."""
        self._score_all(
            prompt_tokens, _as_list(lengths), _as_list(tiers), _as_list(belief),
            _as_list(queues), lam,
        )  # fmt: skip
        cdef double[::1] keys = self._keys
        return [keys[w] for w in range(self.n_workers)]

    cdef int _score_all(
        self,
        Py_ssize_t prompt_tokens,
        list m_list,
        list t_list,
        list b_list,
        list q_list,
        double lam,
    ) except -1:
        """Every worker's score into ``_keys`` and its queue into ``_queues``."""
        cdef Py_ssize_t n = self.n_workers
        if len(q_list) != n:
            raise ValueError(f"{len(q_list)} queues for {n} workers")
        cdef double k = 1.0 + lam
        cdef double full = k * <double>prompt_tokens
        cdef double gamma = self.gamma
        cdef bint xregion = self.xregion_reuse
        cdef double[::1] wan = self._wan
        cdef double[::1] beta = self._beta
        cdef unsigned char[::1] remote = self._remote
        cdef double[::1] keys = self._keys
        cdef double[::1] qs = self._queues
        cdef Py_ssize_t w, holders = min(len(m_list), n)
        cdef long m
        cdef double s, e, q
        for w in range(n):
            q = q_list[w]
            s = wan[w] + q + beta[w] * full
            if w < holders:
                m = m_list[w]
                if m and (xregion or not remote[w]):
                    e = <double>b_list[w] * <double>m
                    s += (gamma * e if <long>t_list[w] == _DRAM else 0.0) - k * beta[w] * e
            keys[w] = s
            qs[w] = q
        return 0

    def choose(
        self,
        Py_ssize_t prompt_tokens,
        lengths,
        tiers,
        belief,
        queues,
        Py_ssize_t top,
        Py_ssize_t turn=0,
    ):
        """:meth:`price`, :meth:`scores` and the first ``top`` of :meth:`rank` in one
        call: (λ, every worker's score as an ``array('d')``, the best ``top`` workers
        best first). A decision reads only its best few, so the rest are not ranked:
        each is picked by one pass over the tie order, which gives what the stable
        sort gave."""
        cdef list q_list = _as_list(queues)
        cdef double lam = self._price(q_list)
        self._score_all(
            prompt_tokens, _as_list(lengths), _as_list(tiers), _as_list(belief), q_list, lam
        )
        cdef Py_ssize_t n = self.n_workers
        if top < 1:
            raise ValueError(f"choose() needs top >= 1, got {top}")
        cdef Py_ssize_t head = top + 1 if top + 1 < n else n
        cdef long long* best = &self._merge[0]
        cdef const double* keys = &self._keys[0]
        cdef const double* qs = &self._queues[0]
        cdef Py_ssize_t i
        self._write_tie_order(turn)
        # As rank(): by score; by (score, remote, queue) if the head holds a tie of
        # workers whose queues differ.
        self._first(head, best, False)
        if _ties_unequal_queues(best, head, keys, qs):
            self._first(head, best, True)
        cdef cpython.array.array scores = cpython.array.clone(_DOUBLES, n, False)
        memcpy(scores.data.as_doubles, keys, n * sizeof(double))
        return lam, scores, [best[i] for i in range(top if top < n else n)]

    cdef void _first(self, Py_ssize_t k, long long* out, bint full) noexcept:
        """The first ``k`` workers of the stable sort of the tie order (``_order``) by
        :func:`_before`: each worker, in tie order, goes in front of every kept one it
        sorts strictly before, so equal ones keep the tie order's."""
        cdef const long long* order = &self._order[0]
        cdef const double* keys = &self._keys[0]
        cdef const double* qs = &self._queues[0]
        cdef const unsigned char* remote = &self._remote[0]
        cdef Py_ssize_t p, j, kept = 0
        cdef long long w
        for p in range(self.n_workers):
            w = order[p]
            j = kept
            while j > 0 and _before(w, out[j - 1], keys, qs, remote, full):
                j -= 1
            if j >= k:
                continue
            if kept < k:
                kept += 1
            memmove(&out[j + 1], &out[j], (kept - 1 - j) * sizeof(long long))
            out[j] = w

    def tie_order(self, Py_ssize_t turn):
        """Every worker, local region first, each group rotated to start ``turn`` places on.

        Exact ties are common (every idle worker without a match scores the same) and the
        paper breaks none: always taking the lowest index piles a lightly loaded pool's
        work, and then its caches and their future hits, on the first workers of each
        region. Rotating the start per decision spreads equal workers evenly, as the
        Oracle does.
        """
        self._write_tie_order(turn)
        return tuple([self._order[i] for i in range(self.n_workers)])

    def rank(self, scores, queues, Py_ssize_t top, Py_ssize_t turn=0):
        """Worker indices best first (the first ``top`` at least are exactly ordered).

        Ties: local region first, then lower queue, then :meth:`tie_order` for ``turn``
        (turn 0: lower index).
        """
        cdef list s_list = _as_list(scores)
        cdef list q_list = _as_list(queues)
        cdef Py_ssize_t n = self.n_workers
        if len(s_list) != n or len(q_list) != n:
            raise ValueError(f"{len(s_list)} scores and {len(q_list)} queues for {n} workers")
        cdef double[::1] keys = self._keys
        cdef double[::1] qs = self._queues
        cdef long long[::1] order = self._order
        cdef Py_ssize_t i
        for i in range(n):
            keys[i] = s_list[i]
            qs[i] = q_list[i]
        self._write_tie_order(turn)
        _merge_sort(&order[0], &self._merge[0], &keys[0], &qs[0], &self._remote[0], n, False)
        cdef Py_ssize_t head = top + 1 if top + 1 < n else n
        if _ties_unequal_queues(&order[0], head, &keys[0], &qs[0]):
            _merge_sort(&order[0], &self._merge[0], &keys[0], &qs[0], &self._remote[0], n, True)
        return [order[i] for i in range(n)]

    cdef void _write_tie_order(self, Py_ssize_t turn):
        """The tie order for ``turn`` into ``_order``: each group of ``_groups``
        rotated to start ``turn`` places on."""
        cdef long long[::1] order = self._order
        cdef long long[::1] group = self._groups
        cdef Py_ssize_t i, start, n_local = self._n_local, n_remote = self.n_workers - n_local
        if n_local:
            start = turn % n_local
            for i in range(n_local):
                order[i] = group[(start + i) % n_local]
        if n_remote:
            start = turn % n_remote
            for i in range(n_remote):
                order[n_local + i] = group[n_local + (start + i) % n_remote]

    def candidates(
        self,
        workers,
        Py_ssize_t prompt_tokens,
        lengths,
        tiers,
        belief,
        queues,
        double lam,
        scores,
        indexed=None,
    ):
        """The terms of ``workers``, in that order; ``scores`` is :meth:`scores`' list
        (each worker's entry is the sum of its terms). ``indexed``: the index's own
        lengths, where ``lengths`` may add pending credit (a longer length is pending).
        One loop, not a call per worker: the request path builds three."""
        cdef double k = 1.0 + lam
        cdef double gamma = self.gamma
        cdef bint xregion = self.xregion_reuse
        cdef double[::1] beta = self._beta
        cdef unsigned char[::1] remote = self._remote
        cdef list out = []
        cdef Py_ssize_t w
        cdef long m
        cdef double b, e, reload
        for w in workers:
            m = lengths[w]
            b = belief[w]
            if m and (xregion or not remote[w]):
                tier = _TIERS[tiers[w]]
                e = b * <double>m
                reload = gamma * e if tier is _TIERS[_DRAM] else 0.0
            else:
                m, tier, e, reload = 0, _ABSENT, 0.0, 0.0
            terms = (
                w,
                self.ids[w],
                self.regions[w],
                self.wan[w],
                queues[w],
                m,
                tier,
                b,
                k * beta[w] * (<double>prompt_tokens - e),
                reload,
                scores[w],
                indexed is not None and m > indexed[w],
            )
            out.append(_new_candidate(Candidate, terms))
        return tuple(out)


cdef inline bint _ties_unequal_queues(
    const long long* order, Py_ssize_t head, const double* keys, const double* queues
) noexcept:
    """Whether two neighbours of ``order[:head]`` tie on score but not on queue: the
    rank then orders by (score, remote, queue), not by score alone."""
    cdef Py_ssize_t i
    for i in range(head - 1):
        if keys[order[i]] == keys[order[i + 1]] and queues[order[i]] != queues[order[i + 1]]:
            return True
    return False


cdef inline list _as_list(object values):
    return values if type(values) is list else list(values)


cdef double[::1] _doubles(tuple values):
    return array("d", values)


cdef long long[::1] _indices(Py_ssize_t n):
    return array("q", range(n))


cdef inline bint _before(
    long long a,
    long long b,
    const double* keys,
    const double* queues,
    const unsigned char* remote,
    bint full,
) noexcept:
    """Whether ``a`` sorts strictly before ``b``: by score, or with ``full`` by (score,
    remote, queue), the keys of the Python sorts this replaces."""
    if keys[a] != keys[b]:
        return keys[a] < keys[b]
    if not full:
        return False
    if remote[a] != remote[b]:
        return remote[a] < remote[b]
    return queues[a] < queues[b]


cdef void _merge_sort(
    long long* order,
    long long* buffer,
    const double* keys,
    const double* queues,
    const unsigned char* remote,
    Py_ssize_t n,
    bint full,
) noexcept:
    """Stable bottom-up merge sort of ``order[:n]``: a stable sort's result is unique,
    so this gives exactly what ``sorted`` gave."""
    cdef Py_ssize_t width = 1, lo, mid, hi, i, j, k
    cdef long long* src = order
    cdef long long* dst = buffer
    cdef long long* swap
    while width < n:
        lo = 0
        while lo < n:
            mid = lo + width if lo + width < n else n
            hi = lo + 2 * width if lo + 2 * width < n else n
            i, j, k = lo, mid, lo
            while i < mid and j < hi:
                # Take from the right run only if strictly before: ties keep their order.
                if _before(src[j], src[i], keys, queues, remote, full):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
                k += 1
            while i < mid:
                dst[k] = src[i]
                i += 1
                k += 1
            while j < hi:
                dst[k] = src[j]
                j += 1
                k += 1
            lo = hi
        swap = src
        src = dst
        dst = swap
        width *= 2
    if src != order:
        memcpy(order, src, n * sizeof(long long))
