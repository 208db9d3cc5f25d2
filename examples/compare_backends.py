"""Train the demo recommendation model (plain PyTorch: HSTU silu attention, PFFN, PMA) a few steps with
backend="gdpa" and backend="inductor": loss agreement, step time, and a profiler listing of the GDPA
kernels that ran in the forward and the backward (GPU).

    python examples/compare_backends.py --batch 256 --seq 512 --dim 512 --out results/compare.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gdpa_inductor.demo import DemoRecModel


def train(model, x, user, steps, lr=1e-5):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x, user).float().square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def step_ms(model, x, user, iters=20):
    def step():
        model(x, user).float().square().mean().backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def gdpa_kernels(model, x, user):
    """Kernel names containing 'gdpa' seen by the profiler in one training step, with CUDA time (us)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(x, user).float().square().mean().backward()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total, 1) for e in prof.key_averages() if "gdpa" in e.key}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    init = DemoRecModel(args.dim, args.heads, 4, 64, args.seq).to(dev, dtype).state_dict()
    x = torch.randn(args.batch, args.seq, args.dim, device=dev, dtype=dtype)
    user = torch.randn(args.batch, args.dim, device=dev, dtype=dtype)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, shape=vars(args))
    for backend in ("inductor", "gdpa"):
        torch._dynamo.reset()
        model = DemoRecModel(args.dim, args.heads, 4, 64, args.seq).to(dev, dtype)
        model.load_state_dict(init)
        compiled = torch.compile(model, backend=backend)
        result[backend] = dict(losses=train(compiled, x, user, args.steps), step_ms=step_ms(compiled, x, user),
                               gdpa_kernels=gdpa_kernels(compiled, x, user))
        print(backend, result[backend], flush=True)
    result["speedup"] = result["inductor"]["step_ms"] / result["gdpa"]["step_ms"]
    print(f"step: inductor {result['inductor']['step_ms']:.2f} ms, gdpa {result['gdpa']['step_ms']:.2f} ms, "
          f"speed-up {result['speedup']:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
