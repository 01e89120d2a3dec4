"""The hierarchical allreduce (docs/allreduce.md, Hierarchical) on virtual ranks spread
over nodes: what src/engine/hierarchical.cc does, segment by segment.

    nodes[r]  the node (any label) of rank r; Layout groups them as the engine's
              topology discovery does: a node's ranks in rank order (local index l),
              the ranks of local index l across nodes in rank order (node index).

Per segment of m values, with L ranks per node and K nodes:
  1. inside each node, shard k (floor(m / L) values, the last one also the rest) is
     reduced to local rank k: exactly, as the host backend's ReduceScatter and Reduce
     do (the members' values added in rank order, rounded to the data type after
     each addition), or with intra_bits: each member quantizes its values of shard k
     (stream(call, segment, its rank, step k)) and rank k adds the decoded bytes to
     its own float32 values in rank order, SRA's first phase;
  2. the K ranks of local index l allreduce shard l with the flat algorithm `inter`
     (the shard is their segment; their streams are stream(call, segment, rank,
     L + step); avg divides by N);
  3. each node allgathers the decoded shards: every rank outputs the same bytes.
With error feedback a rank's residual holds, at its own shard, the error of the
inter stage's quantization of its node's partial sum (0 where it owns the inter stage's
result, whose error is not fed back), and with intra_bits, at the other shards, the
error of its intra quantization of its own values.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import codec

F32 = np.float32
# One addition in the data type (the exact stage): |fl(a + b) - (a + b)| <= rel |fl(a + b)|
# + tiny (float32 sums that land in the subnormal range are exact; float16 and bfloat16
# subnormals round by at most half their spacing).
_SUM_SLACK = {"float32": (2.0**-24, 0.0), "float16": (2.0**-11, 2.0**-25),
              "bfloat16": (2.0**-8, 2.0**-134)}
_U32 = 2.0**-24  # a float32 addition: u |result|


@dataclass(frozen=True)
class Layout:
    """Which ranks share a node. members[n]: node n's ranks in rank order (nodes in
    the order of their lowest rank)."""
    members: tuple
    nranks: int

    @property
    def uniform(self):
        return len({len(m) for m in self.members}) == 1

    @property
    def local_ranks(self):
        return len(self.members[0])

    @property
    def hierarchical(self):
        """What qncclAlgoAuto needs to pick it: >= 2 nodes of >= 2 ranks, all equal."""
        return self.uniform and len(self.members) >= 2 and self.local_ranks >= 2

    def cross(self, l):
        """The ranks of local index l, one per node, in rank order."""
        return tuple(sorted(m[l] for m in self.members))


def layout(nodes, nranks):
    """The Layout of `nodes` (one label per rank), checked."""
    nodes = list(nodes)
    if len(nodes) != nranks:
        raise ValueError(f"nodes must give the node of each of the {nranks} ranks, got "
                         f"{len(nodes)} labels")
    members = {}
    for r, label in enumerate(nodes):
        members.setdefault(label, []).append(r)
    return Layout(tuple(tuple(m) for m in members.values()), nranks)


def check_uniform(lay):
    if not lay.uniform:
        sizes = ", ".join(str(len(m)) for m in lay.members)
        raise ValueError(f"the hierarchical algorithm needs the same number of ranks on every "
                         f"node; these nodes hold {sizes}")


def shards(m, nlocal):
    """(start, stop) of the L shards of a segment of m values."""
    even = m // nlocal
    return [(k * even, m if k == nlocal - 1 else (k + 1) * even) for k in range(nlocal)]


def node_sum(x, members, name):
    """The exact stage's sum of the members' rows of x (float32 values of `name`): in
    rank order, rounded to the type after each addition; and (float64) the bound on
    its distance from the exact sum."""
    rel, tiny = _SUM_SLACK[name]
    acc = x[members[0]].copy()
    bound = np.zeros(x.shape[1])
    with np.errstate(invalid="ignore", over="ignore"):
        for r in members[1:]:
            acc = codec.to_float32(codec.from_float32(acc + x[r], name), name)
            bound += rel * np.abs(acc.astype(np.float64)) + tiny
    return acc, bound


def _stage(cfg, **changes):
    return dataclasses.replace(cfg, **changes)


def segment(z_in, name, cfg, g, lay, inter, intra_bits, algorithms, qd, qbound, dropped, e=None):
    """One segment: the float32 result (m values) and, with cfg.bounds, its bound (float64);
    with `e` (N x m float32 residuals, read and rewritten) error feedback. z_in: N x m
    widened inputs (without residuals). algorithms, qd, qbound and dropped are the flat
    algorithms and the quantization helpers of qnccl.emulate.allreduce."""
    nlocal, m = lay.local_ranks, z_in.shape[1]
    bounds = shards(m, nlocal)
    out = np.empty(m, F32)
    out_bound = np.zeros(m) if cfg.bounds else None
    stage_in = np.empty((lay.nranks, m), F32)  # row r, shard l(r): node partial sum
    stage_bound = np.zeros((lay.nranks, m)) if cfg.bounds else None
    for members in lay.members:
        rows = list(members)
        if intra_bits == 0:
            acc, acc_bound = node_sum(z_in, members, name)
            for l, r in enumerate(rows):
                lo, hi = bounds[l]
                stage_in[r, lo:hi] = acc[lo:hi]
                if stage_bound is not None:
                    stage_bound[r, lo:hi] = acc_bound[lo:hi]
            continue
        cfg_in = _stage(cfg, bits=intra_bits, stream_ranks=members)
        z = z_in[rows].copy()
        if e is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                z += e[rows]
        local = np.arange(nlocal)[:, None]
        for k, (lo, hi) in enumerate(bounds):  # shard k goes to local rank k
            # every member but k quantizes it, from the shard's start, with step k
            qranks = np.where(local == k, -1, local)
            shard = np.ascontiguousarray(z[:, lo:hi])
            y = qd(shard, qranks, np.full((nlocal, 1), k), [0, hi - lo], cfg_in, g)
            others = [j for j in range(nlocal) if j != k]
            if e is not None:
                e[[rows[j] for j in others], lo:hi] = dropped(shard, y)[others]
            message_bound = qbound(shard, cfg_in) if cfg.bounds else None
            acc = z_in[rows[k], lo:hi].copy()  # the own shard, without its residual
            with np.errstate(invalid="ignore", over="ignore"):
                for j in others:
                    acc += y[j]
                    if stage_bound is not None:
                        stage_bound[rows[k], lo:hi] += (message_bound[j]
                                                        + _U32 * np.abs(acc.astype(np.float64)))
            stage_in[rows[k], lo:hi] = acc
    for l, (lo, hi) in enumerate(bounds):
        ranks = list(lay.cross(l))
        z = stage_in[ranks, lo:hi].copy()
        er = None
        if e is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                z += e[ranks, lo:hi]
            er = np.empty_like(z)
        zb = None if stage_bound is None else stage_bound[ranks, lo:hi]
        out[lo:hi], b = algorithms[inter](_stage(cfg, stream_ranks=tuple(ranks), step_base=nlocal),
                                          np.ascontiguousarray(z), g, er, zb)
        if out_bound is not None:
            out_bound[lo:hi] = b
        if e is not None:
            e[ranks, lo:hi] = er
    return out, out_bound
