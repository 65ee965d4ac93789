"""DistributedDataParallel over tessera's collectives (the torch.distributed
backend "tessera"), with the modeled interconnect time of every step.

  PYTHONPATH=build/python python3 integrations/torch/example_ddp.py --nproc 2
  PYTHONPATH=build/python python3 integrations/torch/example_ddp.py --nproc 2 --backend gloo

With RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set (torchrun's variables,
`tessera run`, a batch system) it runs as that rank; with --nproc N it
starts N local ranks itself (launch.py: Debian's torchrun of torch 1.13
fails at start on Python 3.11). --bench times --steps steps after
--warmup and prints rank 0's mean step time (scripts/bench_torch_ddp.sh).
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def run(args):
    import torch
    import torch.distributed as dist
    import tessera_torch  # noqa: F401  (registers "tessera")

    torch.set_num_threads(1)
    if args.bind:
        # As tessera bench and mpirun do: local rank i on CPU i of the mask.
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[int(os.environ.get("LOCAL_RANK", "0")) % len(cpus)]})
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    pg = dist.distributed_c10d._get_default_group()
    modeled0 = pg.total_modeled_seconds() if args.backend == "tessera" else 0.0
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        if not args.bench and rank == 0:
            print("step %d loss %.4f" % (step, loss.item()), flush=True)
    if args.backend == "tessera":  # every rank: a collective
        modeled = (pg.total_modeled_seconds() - modeled0) / (args.warmup + args.steps)
        w = dist.all_reduce(torch.ones(1024), async_op=True)
        w.wait()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        line = "%s: %d ranks, %d parameters, step %.3f ms (mean of %d)" % (
            args.backend, world, params, 1e3 * sum(times) / len(times), len(times))
        if args.backend == "tessera":
            line += ", modeled interconnect %.1f us per step, transport %s" % (modeled * 1e6, pg.transport())
            line += "; a 4 KiB all_reduce: wall %.1f us, modeled %.2f us" % (
                w.wall_seconds() * 1e6, w.modeled_seconds() * 1e6)
        print(line, flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="tessera", choices=["tessera", "gloo"])
    ap.add_argument("--nproc", type=int, default=0, help="start this many local ranks (0: be the rank RANK says)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bench", action="store_true", help="print only the timing line")
    ap.add_argument("--bind", type=int, default=1, help="1: bind local rank i to CPU i (default), 0: float")
    args = ap.parse_args()
    if args.nproc and "RANK" not in os.environ:
        from launch import launch
        argv = [os.path.abspath(__file__)] + [a for a in sys.argv[1:]]
        res = launch(argv, args.nproc, env_extra={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
        for r, (code, out) in enumerate(res):
            if code != 0 or r == 0:
                sys.stdout.write(out if code == 0 else "--- rank %d exit %s\n%s" % (r, code, out))
        sys.exit(0 if all(c == 0 for c, _ in res) else 1)
    run(args)


if __name__ == "__main__":
    main()
