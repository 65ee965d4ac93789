"""Tests of the torch.distributed backend "tessera" against gloo (ctest runs
`test_backend.py NAME`; with RANK unset it starts the ranks itself, see
launch.py).

  ddp_matches_gloo   a DDP model trained 3 steps over tessera equals the
                     same over gloo (allclose), at 2 and 3 ranks
  ops_match_gloo     every op and dtype gives exactly gloo's result
                     (reduce_scatter, which gloo lacks: gloo's all_reduce,
                     then this rank's block; AVG: gloo's sum / world size)
  dead_rank_raises   a rank that exits makes the others raise, not hang
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int32,
          torch.int64]
# Gloo (torch 1.13) has no bfloat16 or int16: its reference runs in a wider
# type holding the same values exactly (small integers), then converts back.
GLOO_VIA = {torch.bfloat16: torch.float32, torch.int16: torch.int32}


def via(x):
    # Always a copy: the reference must not alias the tensor tessera reduced in place.
    return x.to(GLOO_VIA.get(x.dtype, x.dtype), copy=True)


def fail(msg):
    print("FAIL rank %s: %s" % (os.environ.get("RANK"), msg), flush=True)
    sys.exit(1)


def init():
    import tessera_torch  # noqa: F401  (registers "tessera")
    dist.init_process_group("gloo")
    return dist.new_group(backend="tessera"), dist.group.WORLD


def exact(a, b, what):
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        fail("%s: tessera %s differs from gloo %s" % (what, a.tolist()[:8], b.tolist()[:8]))


# ---- workers ----

def worker_ddp_matches_gloo():
    tessera, gloo = init()
    results = []
    for pg in (gloo, tessera):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        initial = [p.detach().clone() for p in model.parameters()]
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + dist.get_rank())
        for _ in range(3):
            x = torch.randn(8, 16, generator=g)
            y = torch.randn(8, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
        if all(torch.equal(a, b) for a, b in zip(initial, results[-1])):
            fail("3 DDP steps left the parameters unchanged")
    moved = any(not torch.equal(a, b) for a, b in zip(results[1], results[0]))
    for a, b in zip(results[1], results[0]):
        if not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
            fail("DDP parameters over tessera differ from gloo's by %g" % (a - b).abs().max().item())
    # The ranks' replicas agree (the gradients really were averaged).
    flat = torch.cat([p.reshape(-1) for p in results[1]])
    mine = flat.clone()
    dist.broadcast(flat, 0, group=tessera)
    if not torch.equal(flat, mine):
        fail("replicas differ after 3 DDP steps over tessera")
    print("ok: DDP over tessera equals gloo after 3 steps (max difference %g)%s" % (
        max((a - b).abs().max().item() for a, b in zip(results[1], results[0])),
        "" if moved else " (bit-identical)"), flush=True)


def values(n, rank, dtype, kind):
    i = torch.arange(n, dtype=torch.int64)
    if kind == "prod":
        v = (i + rank) % 3 + 1          # products of at most 3^world: exact, int8 wraps like gloo's
    elif kind == "signed" and dtype not in (torch.uint8,):
        v = (i * 7 + rank * 5) % 23 - 11
    else:
        v = (i * 7 + rank * 5) % 23
    return v.to(dtype)


def worker_ops_match_gloo():
    tessera, gloo = init()
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    for n in (1, 7, 1000, 70000):
        for dt in DTYPES:
            name = "%s n=%d" % (dt, n)
            for op, kind in ((dist.ReduceOp.SUM, "signed"), (dist.ReduceOp.PRODUCT, "prod"),
                             (dist.ReduceOp.MIN, "signed"), (dist.ReduceOp.MAX, "signed")):
                a = values(n, rank, dt, kind)
                b = via(a)
                w = dist.all_reduce(a, op=op, group=tessera, async_op=True)
                w.wait()
                dist.all_reduce(b, op=op, group=gloo)
                exact(a, b.to(dt), "all_reduce %s %s" % (op, name))
                checked += 1
            if dt.is_floating_point:
                a = values(n, rank, dt, "signed")
                b = a.to(torch.float64)
                dist.all_reduce(a, op=dist.ReduceOp.AVG, group=tessera)
                dist.all_reduce(b, group=gloo)
                exact(a, (b / world).to(dt), "all_reduce AVG " + name)
                checked += 1
            # all_gather (list and into one tensor)
            x = values(n, rank, dt, "signed")
            outs_t = [torch.empty_like(x) for _ in range(world)]
            outs_g = [torch.empty_like(via(x)) for _ in range(world)]
            dist.all_gather(outs_t, x, group=tessera)
            dist.all_gather(outs_g, via(x), group=gloo)
            outs_g = [o.to(dt) for o in outs_g]
            for r in range(world):
                exact(outs_t[r], outs_g[r], "all_gather %s block %d" % (name, r))
            flat = torch.empty(world * n, dtype=dt)
            dist.all_gather_into_tensor(flat, x, group=tessera)
            exact(flat, torch.cat(outs_g), "all_gather_into_tensor " + name)
            # reduce_scatter (gloo has none: its all_reduce, then this rank's block)
            ins = [values(n, rank * world + j, dt, "signed") for j in range(world)]
            full = via(torch.cat(ins))
            dist.all_reduce(full, group=gloo)
            want = full[rank * n:(rank + 1) * n].to(dt)
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter(out, ins, group=tessera)
            exact(out, want, "reduce_scatter " + name)
            out2 = torch.empty(n, dtype=dt)
            dist.reduce_scatter_tensor(out2, torch.cat(ins), group=tessera)
            exact(out2, want, "reduce_scatter_tensor " + name)
            # broadcast from every root
            for root in range(world):
                a = values(n, rank + 10 * root, dt, "signed")
                b = via(a)
                dist.broadcast(a, root, group=tessera)
                dist.broadcast(b, root, group=gloo)
                exact(a, b.to(dt), "broadcast root %d %s" % (root, name))
            # send/recv around the ring (even ranks send first)
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            s = values(n, rank, dt, "signed")
            r_t = torch.zeros_like(s)
            if rank % 2 == 0:
                dist.send(s, nxt, group=tessera, tag=3)
                dist.recv(r_t, prv, group=tessera, tag=3)
            else:
                dist.recv(r_t, prv, group=tessera, tag=3)
                dist.send(s, nxt, group=tessera, tag=3)
            exact(r_t, values(n, prv, dt, "signed"), "send/recv " + name)
            checked += 6
    dist.barrier(group=tessera)
    # Work objects report the modeled time beside the wall time.
    w = dist.all_reduce(torch.ones(1 << 16), group=tessera, async_op=True)
    w.wait()
    if not (w.wall_seconds() > 0 and w.modeled_seconds() > 0):
        fail("Work times: wall %r modeled %r" % (w.wall_seconds(), w.modeled_seconds()))
    print("ok: %d checks equal gloo's at %d ranks; last all_reduce wall %.1f us, modeled %.2f us" % (
        checked, world, w.wall_seconds() * 1e6, w.modeled_seconds() * 1e6), flush=True)


def worker_dead_rank_raises():
    import tessera_torch  # noqa: F401
    dist.init_process_group("tessera")
    rank = dist.get_rank()
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == dist.get_world_size() - 1:
        os._exit(3)  # dies without a word
    time.sleep(0.2)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            dist.all_reduce(t)
    except RuntimeError as e:
        s = time.monotonic() - t0
        if "rank %d" % (dist.get_world_size() - 1) not in str(e):
            fail("the error does not name the dead rank: %s" % e)
        print("ok: rank %d raised after %.2f s: %s" % (rank, s, str(e).splitlines()[0]), flush=True)
        os._exit(0)
    fail("all_reduce with a dead peer did not raise")


# ---- parent ----

def main():
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    fn = globals().get("worker_" + name)
    if fn is None:
        sys.exit("usage: test_backend.py ddp_matches_gloo|ops_match_gloo|dead_rank_raises")
    if "RANK" in os.environ:
        return fn()
    try:
        import tessera_torch  # noqa: F401
    except ImportError as e:
        print("skipped: tessera_torch not importable (%s)" % e)
        sys.exit(77)
    from launch import launch
    sizes = {"ddp_matches_gloo": (2, 3), "ops_match_gloo": (2, 3), "dead_rank_raises": (3,)}[name]
    ok = True
    for n in sizes:
        res = launch([os.path.abspath(__file__), name], n, timeout=240)
        for r, (code, out) in enumerate(res):
            want = 3 if (name == "dead_rank_raises" and r == n - 1) else 0
            sys.stdout.write("--- %s, %d ranks, rank %d: exit %s\n%s" % (name, n, r, code, out))
            ok = ok and code == want
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
