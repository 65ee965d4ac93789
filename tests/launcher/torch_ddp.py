# A stock torch.distributed program, as people launch it with torchrun:
# init_process_group("gloo") with the default env:// (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT), one all-reduce and one DDP backward, each
# checked against its exact value. tests/launcher/torch_test.sh starts it
# under `tessera run`; RAISE_ON_RANK and KILL_ON_RANK inject failures.
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
if os.environ.get("RAISE_ON_RANK") == str(rank):
    raise RuntimeError(f"rank {rank} raises as asked")
if os.environ.get("KILL_ON_RANK") == str(rank) and restart == "0":
    os.kill(os.getpid(), signal.SIGKILL)

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t.item()

# y = w x with w = 1 and x = rank + 1: each rank's gradient is x, and DDP
# averages them: (world + 1) / 2.
model = torch.nn.Linear(1, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(1.0)
ddp = DistributedDataParallel(model)
ddp(torch.tensor([[float(rank + 1)]])).sum().backward()
grad = model.weight.grad.item()
assert grad == (world + 1) / 2, grad

print(f"rank {rank} of {world}: all_reduce {t.item():g} grad {grad:g} restart {restart}", flush=True)
dist.barrier()
dist.destroy_process_group()
