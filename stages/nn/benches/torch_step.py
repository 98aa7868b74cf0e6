"""One training step of the paper's autoencoder in PyTorch, for `just bench`.

784-500-500-2000-10 encoder with ReLUs, L2-normalised code, mirror decoder, mean squared
error, Adam 1e-3: the same step as `cargo run --release -p upcc-nn --example ae_step`.
Prints one JSON line per batch size: the median of 30 timed steps after 5 warm-up steps.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

THREADS = 2
torch.set_num_threads(THREADS)
torch.manual_seed(0)
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


def main():
    batches = [int(a) for a in sys.argv[1:]] or [256, 1024]
    weights = sum(a * b for a, b in zip(DIMS[:-1], DIMS[1:])) * 2
    for batch in batches:
        model = AE()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.rand(batch, 784)
        times = []
        for step in range(35):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = F.mse_loss(model(x), x)
            loss.backward()
            opt.step()
            if step >= 5:
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        median = times[len(times) // 2]
        gflops = 6.0 * weights * batch / (median * 1e-3) / 1e9
        print(json.dumps({"impl": "pytorch " + torch.__version__, "batch": batch, "threads": THREADS,
                          "median_ms": round(median, 2), "gflops": round(gflops, 1)}))


if __name__ == "__main__":
    main()
