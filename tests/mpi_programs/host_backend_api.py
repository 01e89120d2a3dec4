"""The host backend's NCCL API on every rank of this MPI job, against numpy.

Every collective x every type x every op (and PreMulSum), in place and out of
place, for several counts; grouped send/recv in both orders, nested groups,
collectives inside a group, lone send/recv; ncclCommSplit; communicators of a
subset of the world made from an id while the other ranks do nothing; the
query functions; the ranks of an ncclCommInitAll in this process (a clique),
their collectives and messages in groups from one thread. Inputs are small
integers (times 0.5 for floats), so sums, products and averages are exact or
rounded once, whatever order MPI reduces in, and results must match numpy bit
for bit.

Usage (under tests/mpi.py): host_backend_api.py
"""

import numpy as np

from host_backend_lib import (NULL, OPS, TYPES, WORLD, Failures, check, ffi, init_rank, lib,
                              new_id, ptr, run, world_comm)

COUNTS = (0, 1, 13, 3000)
SIGNED = {"int8", "int32", "int64", "float16", "float32", "float64", "bfloat16"}
NOCOLOR = -1  # NCCL_SPLIT_NOCOLOR (a macro: not in the cffi declarations)
FLOATS = {"float16", "float32", "float64", "bfloat16"}
PREMUL_SCALAR = {name: (0.5 if name in FLOATS else 3) for name in TYPES}

F = Failures()
RANK, N = WORLD.rank, WORLD.size


def values(name, op, count, case, rank):
    """Rank `rank`'s input of a case: identical on every rank that computes it."""
    rng = np.random.default_rng([case, rank])
    signed = name in SIGNED
    if op == "prod":
        raw = rng.choice([1, 2, -1] if signed else [1, 2], count)
    elif op in ("max", "min"):
        raw = rng.integers(-50 if signed else 0, 51 if signed else 101, count)
    else:
        raw = rng.integers(-3 if signed else 0, 4 if signed else 7, count)
    raw = raw * 0.5 if name in FLOATS and op != "prod" else raw
    return raw.astype(TYPES[name][1])


def reduce_expected(name, op, arrays):
    """numpy's result of reducing `arrays` (one per rank) with `op`."""
    dtype = TYPES[name][1]
    if name in FLOATS:
        wide = np.stack([a.astype(np.float64) for a in arrays])
    else:
        wide = np.stack([a.astype(np.int64) for a in arrays])
    if op == "prod" and name not in FLOATS:  # wraps around like the type
        return np.multiply.reduce(np.stack(arrays), axis=0, dtype=dtype)
    if op == "premul":
        wide = wide * PREMUL_SCALAR[name]
    result = {"sum": np.sum, "premul": np.sum, "avg": np.sum, "prod": np.prod, "max": np.max,
              "min": np.min}[op](wide, axis=0)
    if op != "avg":
        return result.astype(dtype)
    n = len(arrays)
    if name not in FLOATS:  # truncating division
        return (np.sign(result) * (np.abs(result) // n)).astype(dtype)
    if name == "float64":
        return (result / n).astype(dtype)
    # float16/bfloat16 divide in float32, then round once to the type
    return (result.astype(np.float32) / np.float32(n)).astype(dtype)


def same(actual, expected):
    return actual.shape == expected.shape and actual.tobytes() == expected.tobytes()


def sentinel(count, name):
    """An output buffer of 0x5A bytes: elements a call forgets to write stay wrong."""
    dtype = np.dtype(TYPES[name][1])
    return np.frombuffer(b"\x5a" * (count * dtype.itemsize), dtype).copy()


def red_op(comm, name, op):
    """(ncclRedOp_t, cleanup) for `op`; PreMulSum ops are created per use."""
    if op != "premul":
        return OPS[op], lambda: None
    scalar = np.array([PREMUL_SCALAR[name]], TYPES[name][1])
    handle = ffi.new("ncclRedOp_t*")
    check(lib.ncclRedOpCreatePreMulSum(handle, ptr(scalar), TYPES[name][0],
                                       lib.ncclScalarHostImmediate, comm), "PreMulSum")
    F.expect(handle[0] >= lib.ncclNumOps, f"PreMulSum op {handle[0]} < ncclNumOps")
    return handle[0], lambda: check(lib.ncclRedOpDestroy(handle[0], comm), "ncclRedOpDestroy")


# ---- reducing collectives ---------------------------------------------------

def all_reduce(comm, name, op, count, in_place, case):
    xs = [values(name, op, count, case, r) for r in range(N)]
    nccl_type, (nccl_op, done) = TYPES[name][0], red_op(comm, name, op)
    send = xs[RANK].copy()
    recv = send if in_place else sentinel(count, name)
    check(lib.ncclAllReduce(ptr(send), ptr(recv), count, nccl_type, nccl_op, comm, NULL),
          "ncclAllReduce")
    done()
    return [(recv, reduce_expected(name, op, xs))] + ([] if in_place else [(send, xs[RANK])])


def reduce(comm, name, op, count, in_place, case):
    xs = [values(name, op, count, case, r) for r in range(N)]
    root = case % N
    nccl_type, (nccl_op, done) = TYPES[name][0], red_op(comm, name, op)
    send = xs[RANK].copy()
    recv = send if in_place else sentinel(count, name)
    check(lib.ncclReduce(ptr(send), ptr(recv), count, nccl_type, nccl_op, root, comm, NULL),
          "ncclReduce")
    done()
    if RANK != root:
        return [] if in_place else [(send, xs[RANK])]
    return [(recv, reduce_expected(name, op, xs))] + ([] if in_place else [(send, xs[RANK])])


def reduce_scatter(comm, name, op, count, in_place, case):
    xs = [values(name, op, count * N, case, r) for r in range(N)]
    nccl_type, (nccl_op, done) = TYPES[name][0], red_op(comm, name, op)
    send = xs[RANK].copy()
    mine = slice(RANK * count, (RANK + 1) * count)
    if in_place:
        recv, recv_ptr = send, ptr(send, RANK * count)
    else:
        recv = sentinel(count, name)
        recv_ptr = ptr(recv)
    check(lib.ncclReduceScatter(ptr(send), recv_ptr, count, nccl_type, nccl_op, comm, NULL),
          "ncclReduceScatter")
    done()
    expected = reduce_expected(name, op, [x[mine] for x in xs])
    if in_place:
        return [(send[mine], expected)]
    return [(recv, expected), (send, xs[RANK])]


# ---- data movement ----------------------------------------------------------

def all_gather(comm, name, count, in_place, case):
    xs = [values(name, "sum", count, case, r) for r in range(N)]
    recv = sentinel(count * N, name)
    if in_place:
        recv[RANK * count:(RANK + 1) * count] = xs[RANK]
        send_ptr = ptr(recv, RANK * count)
    else:
        send = xs[RANK].copy()
        send_ptr = ptr(send)
    check(lib.ncclAllGather(send_ptr, ptr(recv), count, TYPES[name][0], comm, NULL),
          "ncclAllGather")
    return [(recv, np.concatenate(xs))]


def broadcast(comm, name, count, in_place, case):
    xs = [values(name, "sum", count, case, r) for r in range(N)]
    root = case % N
    send = xs[RANK].copy()
    recv = send if in_place else sentinel(count, name)
    check(lib.ncclBroadcast(ptr(send), ptr(recv), count, TYPES[name][0], root, comm, NULL),
          "ncclBroadcast")
    return [(recv, xs[root])]


def bcast(comm, name, count, in_place, case):
    del in_place  # ncclBcast is always in place
    xs = [values(name, "sum", count, case, r) for r in range(N)]
    root = (case + 1) % N
    buf = xs[RANK].copy()
    check(lib.ncclBcast(ptr(buf), count, TYPES[name][0], root, comm, NULL), "ncclBcast")
    return [(buf, xs[root])]


def all_to_all(comm, name, count, in_place, case):
    xs = [values(name, "sum", count * N, case, r) for r in range(N)]
    send = xs[RANK].copy()
    recv = send if in_place else sentinel(count * N, name)
    check(lib.ncclAlltoAll(ptr(send), ptr(recv), count, TYPES[name][0], comm, NULL),
          "ncclAlltoAll")
    expected = np.concatenate([x[RANK * count:(RANK + 1) * count] for x in xs])
    return [(recv, expected)] + ([] if in_place else [(send, xs[RANK])])


def collective_matrix(comm):
    case = 0
    for name in TYPES:
        for in_place in (False, True):
            for count in COUNTS:
                for fn in (all_reduce, reduce, reduce_scatter):
                    for op in (*OPS, "premul"):
                        case += 1
                        for actual, expected in fn(comm, name, op, count, in_place, case):
                            F.expect(same(actual, expected),
                                     f"{fn.__name__} {name} {op} count={count} "
                                     f"in_place={in_place}: got {actual[:8]} want {expected[:8]}")
                for fn in (all_gather, broadcast, bcast, all_to_all):
                    case += 1
                    for actual, expected in fn(comm, name, count, in_place, case):
                        F.expect(same(actual, expected),
                                 f"{fn.__name__} {name} count={count} in_place={in_place}: "
                                 f"got {actual[:8]} want {expected[:8]}")


# ---- groups and point-to-point ----------------------------------------------

def payload(rank, tag, count=257):
    return (np.arange(count, dtype=np.float32) + 1000 * rank + tag)


def ring_exchange(comm, send_first):
    right, left = (RANK + 1) % N, (RANK - 1) % N
    x, out = payload(RANK, 1), np.zeros(257, np.float32)
    ops = [lambda: lib.ncclSend(ptr(x), x.size, lib.ncclFloat32, right, comm, NULL),
           lambda: lib.ncclRecv(ptr(out), out.size, lib.ncclFloat32, left, comm, NULL)]
    check(lib.ncclGroupStart())
    for op in (ops if send_first else ops[::-1]):
        check(op(), "p2p")
    check(lib.ncclGroupEnd(), "ncclGroupEnd")
    F.expect(same(out, payload(left, 1)), f"ring exchange send_first={send_first}")


def ordered_messages_and_self(comm):
    """Several messages to one peer arrive in order; a rank can send to itself."""
    right, left = (RANK + 1) % N, (RANK - 1) % N
    outs = [np.zeros(257, np.float32) for _ in range(4)]
    xs = [payload(RANK, tag) for tag in range(4)]
    check(lib.ncclGroupStart())
    for k in range(3):
        check(lib.ncclRecv(ptr(outs[k]), 257, lib.ncclFloat32, left, comm, NULL))
    check(lib.ncclRecv(ptr(outs[3]), 257, lib.ncclFloat32, RANK, comm, NULL))
    for k in range(3):
        check(lib.ncclSend(ptr(xs[k]), 257, lib.ncclFloat32, right, comm, NULL))
    check(lib.ncclSend(ptr(xs[3]), 257, lib.ncclFloat32, RANK, comm, NULL))
    check(lib.ncclGroupEnd(), "ncclGroupEnd")
    for k in range(3):
        F.expect(same(outs[k], payload(left, k)), f"message {k} from the left out of order")
    F.expect(same(outs[3], payload(RANK, 3)), "self send/recv")


def nested_groups(comm):
    right, left = (RANK + 1) % N, (RANK - 1) % N
    x, out = payload(RANK, 7), np.zeros(257, np.float32)
    check(lib.ncclGroupStart())
    check(lib.ncclGroupStart())
    check(lib.ncclRecv(ptr(out), 257, lib.ncclFloat32, left, comm, NULL))
    check(lib.ncclGroupEnd())
    F.expect(not out.any(), "an inner ncclGroupEnd ran the group's operations")
    check(lib.ncclSend(ptr(x), 257, lib.ncclFloat32, right, comm, NULL))
    check(lib.ncclGroupEnd(), "outer ncclGroupEnd")
    F.expect(same(out, payload(left, 7)), "nested groups: received data")


def collectives_in_group(comm):
    right, left = (RANK + 1) % N, (RANK - 1) % N
    a, a_sum = payload(RANK, 0, 100), np.zeros(100, np.float32)
    b = payload(RANK, 5, 100)
    x, out = payload(RANK, 3), np.zeros(257, np.float32)
    gathered = np.zeros(100 * N, np.float32)
    check(lib.ncclGroupStart())
    check(lib.ncclAllReduce(ptr(a), ptr(a_sum), 100, lib.ncclFloat32, lib.ncclSum, comm, NULL))
    check(lib.ncclRecv(ptr(out), 257, lib.ncclFloat32, left, comm, NULL))
    check(lib.ncclAllReduce(ptr(b), ptr(b), 100, lib.ncclFloat32, lib.ncclMax, comm, NULL))
    check(lib.ncclSend(ptr(x), 257, lib.ncclFloat32, right, comm, NULL))
    check(lib.ncclAllGather(ptr(a), ptr(gathered), 100, lib.ncclFloat32, comm, NULL))
    F.expect(not a_sum.any(), "a collective inside a group ran before ncclGroupEnd")
    check(lib.ncclGroupEnd(), "ncclGroupEnd")
    F.expect(same(a_sum, sum(payload(r, 0, 100) for r in range(N))), "grouped allreduce sum")
    F.expect(same(b, payload(N - 1, 5, 100)), "grouped in-place allreduce max")
    F.expect(same(gathered, np.concatenate([payload(r, 0, 100) for r in range(N)])),
             "grouped allgather")
    F.expect(same(out, payload(left, 3)), "p2p inside a group with collectives")


def lone_send_recv(comm):
    """Send and receive outside a group, each a group of its own."""
    partner = RANK ^ 1
    if partner >= N:
        return
    x, out = payload(RANK, 9), np.zeros(257, np.float32)
    send = lambda: check(lib.ncclSend(ptr(x), 257, lib.ncclFloat32, partner, comm, NULL))
    recv = lambda: check(lib.ncclRecv(ptr(out), 257, lib.ncclFloat32, partner, comm, NULL))
    for step in ((send, recv) if RANK % 2 == 0 else (recv, send)):
        step()
    F.expect(same(out, payload(partner, 9)), "lone send/recv")


# ---- communicators ----------------------------------------------------------

def queries(comm, nranks, rank, device=-1):
    out = ffi.new("int*")
    check(lib.ncclCommCount(comm, out))
    F.expect(out[0] == nranks, f"ncclCommCount {out[0]} != {nranks}")
    check(lib.ncclCommUserRank(comm, out))
    F.expect(out[0] == rank, f"ncclCommUserRank {out[0]} != {rank}")
    check(lib.ncclCommCuDevice(comm, out))
    F.expect(out[0] == device, f"ncclCommCuDevice {out[0]} != {device}")
    err = ffi.new("ncclResult_t*")
    check(lib.ncclCommGetAsyncError(comm, err))
    F.expect(err[0] == lib.ncclSuccess, "async error on a healthy communicator")


def sum_of_ranks(comm, contributions, what):
    """Allreduce-sums this rank's `contributions` value; expects `sum(everyone's)`."""
    x = np.array([contributions[0]], np.int64)
    check(lib.ncclAllReduce(ptr(x), ptr(x), 1, lib.ncclInt64, lib.ncclSum, comm, NULL))
    F.expect(x[0] == contributions[1], f"{what}: sum {x[0]} != {contributions[1]}")


def split(comm):
    color = NOCOLOR if (RANK == N - 1 and N > 1) else RANK % 2
    new = ffi.new("ncclComm_t*")
    check(lib.ncclCommSplit(comm, color, -RANK, new, ffi.NULL), "ncclCommSplit")
    if color == NOCOLOR:
        F.expect(new[0] == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator")
        return
    members = [r for r in range(N) if r % 2 == color and not (r == N - 1 and N > 1)]
    members.sort(reverse=True)  # key = -rank
    queries(new[0], len(members), members.index(RANK))
    sum_of_ranks(new[0], (RANK, sum(members)), f"split color {color}")
    check(lib.ncclCommDestroy(new[0]), "ncclCommDestroy")


def subset(members, root):
    """Ranks `members` (world) form a communicator from `root`'s id; NCCL ranks
    in reverse world order. Others do nothing."""
    if RANK not in members:
        return
    uid = new_id(root, members, tag=100 + root)
    nccl_rank = sorted(members, reverse=True).index(RANK)
    code, comm = init_rank(len(members), uid, nccl_rank)
    check(code, "ncclCommInitRank (subset)")
    queries(comm, len(members), nccl_rank)
    sum_of_ranks(comm, (RANK, sum(members)), f"subset {members}")
    check(lib.ncclCommDestroy(comm))


def init_all():
    comm = ffi.new("ncclComm_t*")
    check(lib.ncclCommInitAll(comm, 1, NULL), "ncclCommInitAll")
    queries(comm[0], 1, 0, device=0)
    sum_of_ranks(comm[0], (5, 5), "ncclCommInitAll(1)")
    check(lib.ncclCommDestroy(comm[0]))


# ---- ranks in one process ---------------------------------------------------

def clique(ndev=3):
    """ncclCommInitAll of `ndev` ranks in this process (devices 4, 5, ...): every collective,
    types and ops, in and out of place, and messages around a ring, each a group over all
    the ranks' communicators from this one thread, against numpy; ncclCommSplit refused."""
    comms = ffi.new("ncclComm_t[]", ndev)
    devices = ffi.new("int[]", [4 + i for i in range(ndev)])
    check(lib.ncclCommInitAll(comms, ndev, devices), "ncclCommInitAll (clique)")
    for r in range(ndev):
        queries(comms[r], ndev, r, device=4 + r)

    def group(calls):
        check(lib.ncclGroupStart())
        for call in calls:
            check(call(), "a call of the clique's group")
        check(lib.ncclGroupEnd(), "ncclGroupEnd (clique)")

    case = 10000
    for name, count, in_place in ((n, c, p) for n in ("float32", "int32", "bfloat16")
                                  for c in (1, 13, 3000) for p in (False, True)):
        nccl_type = TYPES[name][0]
        for op in ("sum", "avg", "max", "premul"):
            case += 1
            xs = [values(name, op, count * ndev, case, r) for r in range(ndev)]
            ops = [red_op(comms[r], name, op) for r in range(ndev)]
            sends = [x.copy() for x in xs]
            recvs = [s if in_place else sentinel(count * ndev, name) for s in sends]
            group([lambda r=r: lib.ncclAllReduce(ptr(sends[r]), ptr(recvs[r]), count * ndev,
                                                 nccl_type, ops[r][0], comms[r], NULL)
                   for r in range(ndev)])
            want = reduce_expected(name, op, xs)
            for r in range(ndev):
                F.expect(same(recvs[r], want), f"clique allreduce {name} {op} count={count} "
                                               f"in_place={in_place} rank {r}")
            sends = [x.copy() for x in xs]
            root = case % ndev
            recvs = [s if in_place else sentinel(count * ndev, name) for s in sends]
            group([lambda r=r: lib.ncclReduce(ptr(sends[r]), ptr(recvs[r]), count * ndev,
                                              nccl_type, ops[r][0], root, comms[r], NULL)
                   for r in range(ndev)])
            F.expect(same(recvs[root], want), f"clique reduce {name} {op} root {root}")
            sends = [x.copy() for x in xs]
            outs = [sends[r][r * count:(r + 1) * count] if in_place else sentinel(count, name)
                    for r in range(ndev)]
            group([lambda r=r: lib.ncclReduceScatter(ptr(sends[r]), ptr(outs[r]), count,
                                                     nccl_type, ops[r][0], comms[r], NULL)
                   for r in range(ndev)])
            for r in range(ndev):
                F.expect(same(outs[r], reduce_expected(name, op, [x[r * count:(r + 1) * count]
                                                                  for x in xs])),
                         f"clique reduce-scatter {name} {op} count={count} rank {r}")
            for _, done in ops:
                done()
        case += 1
        xs = [values(name, "sum", count * ndev, case, r) for r in range(ndev)]
        gathered = [sentinel(count * ndev, name) for _ in range(ndev)]
        if in_place:
            for r in range(ndev):
                gathered[r][r * count:(r + 1) * count] = xs[r][:count]
        ins = [ptr(gathered[r], r * count) if in_place else ptr(xs[r]) for r in range(ndev)]
        group([lambda r=r: lib.ncclAllGather(ins[r], ptr(gathered[r]), count, nccl_type,
                                             comms[r], NULL) for r in range(ndev)])
        want = np.concatenate([x[:count] for x in xs])
        for r in range(ndev):
            F.expect(same(gathered[r], want), f"clique allgather {name} count={count} rank {r}")
        sends = [x.copy() for x in xs]
        recvs = [s if in_place else sentinel(count * ndev, name) for s in sends]
        group([lambda r=r: lib.ncclAlltoAll(ptr(sends[r]), ptr(recvs[r]), count, nccl_type,
                                            comms[r], NULL) for r in range(ndev)])
        for r in range(ndev):
            want = np.concatenate([x[r * count:(r + 1) * count] for x in xs])
            F.expect(same(recvs[r], want), f"clique all-to-all {name} count={count} rank {r}")
        root = case % ndev
        sends = [x.copy() for x in xs]
        recvs = [s if in_place else sentinel(count * ndev, name) for s in sends]
        group([lambda r=r: lib.ncclBroadcast(ptr(sends[r]), ptr(recvs[r]), count * ndev,
                                             nccl_type, root, comms[r], NULL)
               for r in range(ndev)])
        for r in range(ndev):
            F.expect(same(recvs[r], xs[root]), f"clique broadcast {name} root {root} rank {r}")
    # three messages from every rank to the next, received in order
    xs = [[payload(r, tag) for tag in range(3)] for r in range(ndev)]
    outs = [[np.zeros(257, np.float32) for _ in range(3)] for _ in range(ndev)]
    calls = []
    for r in range(ndev):
        for tag in range(3):
            calls.append(lambda r=r, tag=tag: lib.ncclRecv(ptr(outs[r][tag]), 257, lib.ncclFloat32,
                                                           (r - 1) % ndev, comms[r], NULL))
            calls.append(lambda r=r, tag=tag: lib.ncclSend(ptr(xs[r][tag]), 257, lib.ncclFloat32,
                                                           (r + 1) % ndev, comms[r], NULL))
    group(calls)
    for r in range(ndev):
        for tag in range(3):
            F.expect(same(outs[r][tag], payload((r - 1) % ndev, tag)),
                     f"clique message {tag} to rank {r}")
    new = ffi.new("ncclComm_t*")
    code = lib.ncclCommSplit(comms[0], 0, 0, new, ffi.NULL)
    F.expect(code == lib.ncclInvalidUsage and b"ranks are in this process" in
             ffi.string(lib.ncclGetLastError(comms[0])), f"ncclCommSplit of a clique: {code}")
    for r in range(ndev):
        check(lib.ncclCommDestroy(comms[r]))


def main():
    version = ffi.new("int*")
    check(lib.ncclGetVersion(version))
    F.expect(version[0] == 23203, f"ncclGetVersion {version[0]}")
    comm = world_comm()
    queries(comm, N, RANK)
    collective_matrix(comm)
    for send_first in (True, False):
        ring_exchange(comm, send_first)
    ordered_messages_and_self(comm)
    nested_groups(comm)
    collectives_in_group(comm)
    lone_send_recv(comm)
    split(comm)
    if N > 1:
        subset(list(range(1, N)), root=1)
        WORLD.Barrier()
    if N >= 4:  # two subsets at once, each with its own root
        subset(list(range(0, N, 2)), root=0)
        subset(list(range(1, N, 2)), root=N - 1)
    init_all()
    clique()
    check(lib.ncclCommFinalize(comm), "ncclCommFinalize")
    check(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return F.report()


if __name__ == "__main__":
    run(main)
