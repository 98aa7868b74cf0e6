"""PyTorch on the GPU, the comparison side of `just bench-gpu`.

1. One training step of the paper's autoencoder (784-500-500-2000-10 encoder with ReLUs,
   L2-normalised code, mirror decoder, mean squared error, Adam 1e-3) at batch 256 and 1024:
   eager (synchronised after every step, median of 200), eager back to back (36 steps, one
   synchronisation), and the whole step captured once as a CUDA graph and replayed (median of
   200 replays).
2. One ProbPair epoch of the smoke `multi3` cell's shapes with 9,000 constraints: 4,000
   training instances of 784 features, constraint batches of 256 paired with instance batches
   of floor(N / ceil(M / 256)), cosine read-out sigma((c - m)/T) with m = tanh(m~),
   T = softplus(T~), weighted BCE + 0.02 x reconstruction, global-norm clipping at 1, Adam
   (1e-3 network, 1e-2 read-out): the same computation as upcc's ProbPair epoch. The values are
   random (timing does not depend on them). Eager, and with each full batch replayed as a
   captured CUDA graph (index buffers refilled per batch, the short last batch eager).

Prints one JSON line per measurement. TF32 is off, as in upcc.
"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
DEV = "cuda"
DIMS = [784, 500, 500, 2000, 10]


def mlp(dims):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class AE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = mlp(DIMS)
        self.decoder = mlp(DIMS[::-1])

    def forward(self, x):
        return self.decoder(F.normalize(self.encoder(x), dim=1))


def sync():
    torch.cuda.synchronize()


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def emit(**kw):
    kw["impl"] = "pytorch " + torch.__version__
    print(json.dumps(kw), flush=True)


def ae_step(batch):
    torch.manual_seed(0)
    model = AE().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    x = torch.rand(batch, 784, device=DEV)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = F.mse_loss(model(x), x)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    sync()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    for _ in range(36):
        step()
    sync()
    back = (time.perf_counter() - t0) * 1e3 / 36
    emit(bench="ae_step", mode="eager", batch=batch, median_ms=round(median(times), 3),
         back_to_back_ms=round(back, 3))
    # Capture the whole step (forward, backward, Adam) once; replay it.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(20):
        graph.replay()
    sync()
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        graph.replay()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    emit(bench="ae_step", mode="cuda_graph", batch=batch, median_ms=round(median(times), 3))


class ProbPair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ae = AE()
        self.m = torch.nn.Parameter(torch.zeros(()))
        self.t = torch.nn.Parameter(torch.tensor(math.log(math.exp(0.1) - 1.0)))


def probpair_epoch(constraints=9000, n=4000, batch=256, lam=0.02):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x_all = torch.rand(n, 784, device=DEV) * 5.1
    a = torch.randint(0, n, (constraints,), generator=g).to(DEV)
    b = torch.randint(0, n, (constraints,), generator=g).to(DEV)
    y = torch.rand(constraints, generator=g).to(DEV)
    w = torch.ones(constraints, device=DEV)
    model = ProbPair().to(DEV)
    opt = torch.optim.Adam([
        {"params": model.ae.parameters(), "lr": 1e-3},
        {"params": [model.m, model.t], "lr": 1e-2},
    ], capturable=True)
    n_batches = math.ceil(constraints / batch)
    inst_bs = n // n_batches
    params = list(model.parameters())

    def loss_of(rows, yb, wb, nb):
        xb = x_all.index_select(0, rows)
        u = F.normalize(model.ae.encoder(xb), dim=1)
        c = (u[:nb] * u[nb:2 * nb]).sum(1)
        logit = (c - torch.tanh(model.m)) / F.softplus(model.t)
        pair = (wb * F.binary_cross_entropy_with_logits(logit, yb, reduction="none")).sum() / nb
        rec = F.mse_loss(model.ae.decoder(u[2 * nb:]), xb[2 * nb:])
        return pair + lam * rec

    def step(rows, yb, wb, nb):
        opt.zero_grad(set_to_none=False)
        loss = loss_of(rows, yb, wb, nb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.detach()

    def batches():
        perm = torch.randperm(constraints, device=DEV)
        iperm = torch.randperm(n, device=DEV)
        for bi in range(n_batches):
            cb = perm[bi * batch:(bi + 1) * batch]
            ib = iperm[bi * inst_bs:(bi + 1) * inst_bs]
            yield torch.cat([a[cb], b[cb], ib]), y[cb], w[cb], len(cb)

    def eager_epoch():
        total = torch.zeros((), device=DEV)
        for rows, yb, wb, nb in batches():
            total += step(rows, yb, wb, nb)
        return total.item()  # one read-back per epoch

    for _ in range(2):
        eager_epoch()
    sync()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        eager_epoch()
        sync()
        times.append(time.perf_counter() - t0)
    emit(bench="probpair_epoch", mode="eager", constraints=constraints, median_s=round(median(times), 4))

    # CUDA graph of one full batch; static buffers refilled per batch.
    rows_s = torch.zeros(2 * batch + inst_bs, dtype=torch.long, device=DEV)
    y_s = torch.zeros(batch, device=DEV)
    w_s = torch.zeros(batch, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(rows_s, y_s, w_s, batch)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss_s = step(rows_s, y_s, w_s, batch)

    def graph_epoch():
        total = torch.zeros((), device=DEV)
        for rows, yb, wb, nb in batches():
            if nb == batch:
                rows_s.copy_(rows)
                y_s.copy_(yb)
                w_s.copy_(wb)
                graph.replay()
                total += loss_s
            else:
                total += step(rows, yb, wb, nb)
        return total.item()

    for _ in range(2):
        graph_epoch()
    sync()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        graph_epoch()
        sync()
        times.append(time.perf_counter() - t0)
    emit(bench="probpair_epoch", mode="cuda_graph", constraints=constraints, median_s=round(median(times), 4))


def main():
    if not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch " + torch.__version__, "error": "no CUDA device"}))
        sys.exit(1)
    emit(bench="device", gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    for batch in [256, 1024]:
        ae_step(batch)
    probpair_epoch()


if __name__ == "__main__":
    main()
