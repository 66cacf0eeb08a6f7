"""The same torch training script (examples/torch ddp.py, fsdp2.py) on three backends, timed side
by side in one run: `shardcheck` (shardcheck.torch.spawn, one thread per rank), PyTorch's threaded
test backend (one thread per rank, the same launch) and gloo (one process per rank,
torch.multiprocessing.spawn over TCP on loopback). Each job is a fresh Python process, timed from
its start to its exit (imports, launch, training, teardown: the whole script), REPEATS times,
in interleaved order; the table gives the median and the ratios to gloo and to threaded.

    .venv/bin/python bench/torch_backends.py [--world 4] [--steps 20] [--repeats 5]"""

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
BACKENDS = ("shardcheck", "threaded", "gloo")
SCRIPTS = ("ddp", "fsdp2")


def job(backend, script, world, steps):
    """Runs one job in this process (the child's side)."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    train = __import__(script).train

    def fn(rank):
        return train(rank, world, steps=steps)

    if backend == "shardcheck":
        import shardcheck.torch as sct

        return sct.spawn(fn, world)[0]
    if backend == "threaded":
        return threaded(fn, world)[0]
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    mp.spawn(gloo_rank, args=(script, world, steps, port), nprocs=world, join=True)
    return None


def gloo_rank(rank, script, world, steps, port):
    import torch.distributed as dist

    sys.path.insert(0, os.path.join(ROOT, "examples", "torch"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    __import__(script).train(rank, world, steps=steps)
    dist.destroy_process_group()


def threaded(fn, world):
    """PyTorch's threaded test backend, launched as its MultiThreadedTestCase does."""
    import threading

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import multi_threaded_pg as mtpg

    mtpg._install_threaded_pg()
    store = dist.HashStore()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    out, errors = [None] * world, []

    def worker(rank):
        dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001  (reported after the join)
            errors.append(e)
            mtpg.ProcessLocalGroup.exception_handle(e)
        finally:
            dist.destroy_process_group()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch._C._distributed_c10d._set_thread_isolation_mode(False)
    mtpg._uninstall_threaded_pg()
    if errors:
        raise errors[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--job", nargs=2, metavar=("BACKEND", "SCRIPT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.job:
        job(a.job[0], a.job[1], a.world, a.steps)
        return 0
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    times = {(b, s): [] for b in BACKENDS for s in SCRIPTS}
    for _ in range(a.repeats):
        for s in SCRIPTS:
            for b in BACKENDS:
                t0 = time.perf_counter()
                subprocess.run([sys.executable, __file__, "--world", str(a.world), "--steps",
                                str(a.steps), "--job", b, s], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[(b, s)].append(time.perf_counter() - t0)
    print(f"world {a.world}, {a.steps} steps, median of {a.repeats} (seconds, whole script)\n")
    print("| script | shardcheck | threaded | gloo | gloo / shardcheck | threaded / shardcheck |")
    print("|---|---|---|---|---|---|")
    for s in SCRIPTS:
        m = {b: statistics.median(times[(b, s)]) for b in BACKENDS}
        print(f"| {s}.py | {m['shardcheck']:.2f} | {m['threaded']:.2f} | {m['gloo']:.2f} | "
              f"{m['gloo'] / m['shardcheck']:.2f} | {m['threaded'] / m['shardcheck']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
