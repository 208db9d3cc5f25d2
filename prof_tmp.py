import torch, triton, json, time
from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.kernels.triton import varlen_fwd as vf, varlen_bwd as vb
from gdpa_inductor.kernels.triton.gdpa_fwd import FwdConfig
from gdpa_inductor.kernels.triton.gdpa_bwd import BwdConfig
from gdpa_inductor.kernels.triton.varlen_layout import jagged_side, with_tensor
H, D = 4, 128
def mk(*s): return torch.randn(*s, device="cuda", dtype=torch.bfloat16)
# overhead at tiny size
cu = torch.tensor([0, 16, 32], dtype=torch.int32, device="cuda")
q = mk(32, H, D)
f = lambda: gdpa_varlen(q, q, q, cu, cu, 16, 16)
for _ in range(10): f()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(200): f()
torch.cuda.synchronize(); print("tiny varlen fwd per call us", (time.perf_counter() - t) / 200 * 1e6)
qd = mk(2, H, 16, D)
g = lambda: gdpa(qd, qd, qd)
for _ in range(10): g()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(200): g()
torch.cuda.synchronize(); print("tiny dense fwd per call us", (time.perf_counter() - t) / 200 * 1e6)
gen = torch.Generator().manual_seed(0)
for N, sp in [(256, 1.0), (256, 0.5), (512, 0.5), (512, 1.0)]:
    B = 1152
    lens = torch.full((B,), N, dtype=torch.int32) if sp == 1.0 else torch.randint(1, N + 1, (B,), generator=gen, dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)]).cuda()
    T = int(lens.sum())
    q, k, v, do = mk(T, H, D), mk(T, H, D), mk(T, H, D), mk(T, H, D)
    side_q, side_k = jagged_side(q, cu, N), jagged_side(k, cu, N)
    out = torch.empty_like(q)
    res = {}
    for cfg in [FwdConfig(128, 64, 4, 2), FwdConfig(64, 64, 4, 2), FwdConfig(64, 32, 4, 2), FwdConfig(128, 64, 8, 2), FwdConfig(64, 64, 4, 3), FwdConfig(128, 32, 4, 2)]:
        fn = lambda: vf.gdpa_varlen_fwd_triton(side_q, side_k, v, with_tensor(side_q, out), "gelu_tanh", 0.1, 1.0, False, (-1, -1), 0.01, config=cfg)
        res[str(cfg)] = round(triton.testing.do_bench(fn, warmup=5, rep=50), 4)
    for kvc, qc in [(BwdConfig(32, 64, 4, 3), BwdConfig(128, 64, 8, 2)), (BwdConfig(64, 64, 4, 2), BwdConfig(64, 64, 4, 2)), (BwdConfig(32, 64, 4, 2), BwdConfig(64, 64, 4, 2)), (BwdConfig(64, 128, 8, 3), BwdConfig(128, 64, 8, 2)), (BwdConfig(32, 32, 4, 2), BwdConfig(64, 32, 4, 2))]:
        fn = lambda: vb.gdpa_varlen_bwd_triton(with_tensor(side_q, do), side_q, side_k, v, "gelu_tanh", 0.1, 1.0, False, (-1, -1), 0.01, configs=(kvc, qc))
        res["bwd" + str((kvc, qc))] = round(triton.testing.do_bench(fn, warmup=5, rep=50), 4)
    res["argsort"] = round(triton.testing.do_bench(lambda: torch.argsort(lens.cuda().long() * lens.cuda().long(), descending=True), warmup=5, rep=20), 4)
    print(N, sp, json.dumps(res, indent=0))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            gdpa_varlen(q, k, v, cu, cu, N, N, activation="gelu_tanh")
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
