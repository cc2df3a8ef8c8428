"""Train a small CNN on scikit-learn's bundled 8x8 digits, every forward and backward in halide_ad.

    conv 3x3 (1 -> 16 channels, zero padding) -> relu -> 2x2 max pool -> dense 16x4x4 -> 64 -> relu
    -> dense 64 -> 10 -> log-softmax cross-entropy

One `@hd.func` computes the mean loss of a minibatch; `hd.value_and_grad` over the six parameter
arrays gives the loss and its gradient, from kernels halide_ad derived (no gradient written by
hand, no numpy in the backward pass). Adam runs in numpy. A loss and accuracy curve is saved as
a PNG.

Run:    python examples/train_digits.py            # ~97-98% test accuracy
        python examples/train_digits.py --quick    # a smoke run: one short epoch
Needs:  pip install -e ".[examples]"               # scikit-learn (the data), matplotlib (the plot)
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import halide_ad as hd

CHANNELS, HIDDEN, CLASSES = 16, 64, 10


def logits(x, w1, b1, w2, b2, w3, b3):
    """x: (N, 1, 8, 8) images -> (N, 10) class scores. Traced inside the @hd.funcs below."""
    N, C, H, W = x.shape
    K, _, R, S = w1.shape
    xp = hd.constant_exterior(x)  # zero padding: the conv keeps the 8x8 size
    c, r, s = hd.rdom(C, R, S)
    conv = hd.compute((N, K, H, W), lambda n, k, i, j:
                      hd.relu(hd.sum(xp[n, c, i + r - 1, j + s - 1] * w1[k, c, r, s]) + b1[k]), name="conv")
    p, q = hd.rdom(2, 2)
    pool = hd.compute((N, K, H // 2, W // 2), lambda n, k, i, j:
                      hd.max(conv[n, k, 2 * i + p, 2 * j + q]), name="pool")
    # dense over the pooled (K, 4, 4) block: w2 is (K, 4, 4, HIDDEN), so no reshape is needed
    pk, pi, pj = hd.rdom(*pool.shape[1:])
    hidden = hd.compute((N, w2.shape[-1]), lambda n, o:
                        hd.relu(hd.sum(pool[n, pk, pi, pj] * w2[pk, pi, pj, o]) + b2[o]), name="hidden")
    h = hd.rdom(hidden.shape[1])
    return hd.compute((N, w3.shape[1]), lambda n, o: hd.sum(hidden[n, h] * w3[h, o]) + b3[o], name="logits")


@hd.func
def batch_loss(w1, b1, w2, b2, w3, b3, x, y):
    """Mean cross-entropy of log_softmax(logits) against the integer labels y: (N,)."""
    z = logits(x, w1, b1, w2, b2, w3, b3)
    N, K = z.shape
    k = hd.rdom(K)
    zmax = hd.compute((N,), lambda n: hd.max(z[n, k]), name="zmax")
    lse = hd.compute((N,), lambda n: zmax[n] + hd.log(hd.sum(hd.exp(z[n, k] - zmax[n]))), name="lse")
    n, k = hd.rdom(N, K)
    picked = hd.compute((), lambda: hd.sum(hd.where(y[n] == k, z[n, k], 0.0)), name="picked")
    nll = hd.compute((), lambda: hd.sum(lse[n]), name="nll")
    return (nll - picked) / N


@hd.func
def predict(w1, b1, w2, b2, w3, b3, x):
    return logits(x, w1, b1, w2, b2, w3, b3)


def init_params(rng: np.random.Generator) -> list[np.ndarray]:
    """He initialisation, float32."""
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    flat = CHANNELS * 4 * 4
    return [he((CHANNELS, 1, 3, 3), 9), np.zeros(CHANNELS, np.float32),
            he((CHANNELS, 4, 4, HIDDEN), flat), np.zeros(HIDDEN, np.float32),
            he((HIDDEN, CLASSES), 2 * HIDDEN), np.zeros(CLASSES, np.float32)]  # logits start small


class Adam:
    def __init__(self, params, lr=3e-3, betas=(0.9, 0.999), eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, betas[0], betas[1], eps, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, params, grads) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, g, m, v in zip(params, grads, self.m, self.v, strict=True):
            m += (1 - self.b1) * (g - m)
            v += (1 - self.b2) * (g * g - v)
            p -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)


def progress(done: int, total: int, text: str, width: int = 30) -> None:
    """A one-line text progress bar (no dependency)."""
    filled = width * done // total
    sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text}")
    sys.stdout.flush()
    if done == total:
        sys.stdout.write("\n")


def accuracy(params, x, y, batch: int = 256) -> float:
    """Test accuracy, in fixed-size chunks (the last one padded) so predict compiles once."""
    correct = 0
    for start in range(0, len(x), batch):
        xb = x[start:start + batch]
        pad = batch - len(xb)
        z = predict(*params, np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)]))
        correct += int((z[:len(xb)].argmax(1) == y[start:start + batch]).sum())
    return correct / len(x)


def load_data(seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8) in [0, 1]
    x = (x - x.mean()) / x.std()
    return train_test_split(x, digits.target.astype(np.int64), test_size=0.25, random_state=seed,
                            stratify=digits.target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="train_digits.png", help="where to save the curves")
    parser.add_argument("--quick", action="store_true", help="a smoke run: one epoch of 10 steps")
    args = parser.parse_args()

    x_train, x_test, y_train, y_test = load_data(args.seed)
    rng = np.random.default_rng(args.seed)
    params = init_params(rng)
    opt = Adam(params, lr=args.lr)
    loss_and_grad = hd.value_and_grad(batch_loss, argnums=(0, 1, 2, 3, 4, 5))
    steps = len(x_train) // args.batch  # whole batches only: one shape, one compile
    epochs = 1 if args.quick else args.epochs
    if args.quick:
        steps = 10
    print(f"digits: {len(x_train)} train, {len(x_test)} test; {epochs} epoch(s) of {steps} steps "
          f"of {args.batch}")

    start = time.perf_counter()
    compile_start = time.perf_counter()
    loss_and_grad(*params, x_train[:args.batch], y_train[:args.batch])  # compile forward + gradient
    accuracy(params, x_test[:1], y_test[:1])                               # compile predict
    compile_time = time.perf_counter() - compile_start
    print(f"compiled in {compile_time:.1f} s")

    history = {"step": [], "loss": [], "epoch": [], "test_acc": []}
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        running = 0.0
        for step in range(steps):
            idx = order[step * args.batch:(step + 1) * args.batch]
            loss, grads = loss_and_grad(*params, x_train[idx], y_train[idx])
            opt.step(params, grads)
            running += float(loss)
            history["step"].append(epoch * steps + step)
            history["loss"].append(float(loss))
            progress(step + 1, steps, f"epoch {epoch + 1}/{epochs} loss {running / (step + 1):.4f}")
        acc = accuracy(params, x_test, y_test)
        history["epoch"].append((epoch + 1) * steps)
        history["test_acc"].append(acc)
        print(f"  epoch {epoch + 1}: mean loss {running / steps:.4f}, test accuracy {100 * acc:.2f}%")

    elapsed = time.perf_counter() - start
    print(f"final test accuracy {100 * history['test_acc'][-1]:.2f}% in {elapsed:.1f} s "
          f"({compile_time:.1f} s of it compiling)")
    save_plot(history, args.plot)


def save_plot(history: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(history["step"], history["loss"], lw=0.6, alpha=0.5, label="minibatch")
    window = max(1, len(history["loss"]) // 30)
    smooth = np.convolve(history["loss"], np.ones(window) / window, mode="valid")
    ax1.plot(history["step"][window - 1:], smooth, lw=1.5, label=f"mean of {window}")
    ax1.set(xlabel="step", ylabel="cross-entropy", title="training loss", yscale="log")
    ax1.legend()
    ax2.plot(history["epoch"], [100 * a for a in history["test_acc"]], "o-")
    ax2.set(xlabel="step", ylabel="accuracy (%)", title="test accuracy")
    ax2.grid(alpha=0.3)
    fig.suptitle("halide_ad: CNN on 8x8 digits (forward and backward compiled by halide_ad)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
