"""The DLRM-style model, the synthetic click-through data and the training steps shared by the
accuracy benchmark (perf/accuracy_bench.py) and its real DDP run (perf/accuracy_ddp.py).

Model: dense features -> bottom MLP; one embedding vector per categorical feature; pairwise
dot products of the bottom-MLP output and the embedding vectors, concatenated with the
bottom-MLP output -> top MLP -> click logit (seeds/000 §4, Table 1, scaled down).

Data: a fixed random teacher of the same structure (TEACHER_SEED, independent of the training
seed) labels each sample with Bernoulli(sigmoid(teacher logit)); its logits are scaled so that
the Bayes accuracy is Criteo-like (about 78%) with about 26% clicks. Dense features are log1p of
exponential counts (as DLRM preprocesses Criteo's), categorical ids follow a Zipf law.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

TEACHER_SEED = 20240611  # the task; training seeds only change init and data order
DATA_SEED = 7  # draws of the features (train and test sets are disjoint streams)
CALIBRATION = 1 << 16  # samples that fix the teacher's logit scale
TEACHER_SCALE, TEACHER_SHIFT = 1.4, -1.3  # standardized logit -> a*z + b: ~79% Bayes, ~27% clicks


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of the model (student and teacher)."""
    dense: int = 13
    tables: tuple = (400, 200, 100, 100, 50, 20, 10, 4)
    dim: int = 16
    bottom: tuple = (32,)
    top: tuple = (64, 32)
    zipf: float = 1.05  # exponent of the categorical ids' frequency law


def mlp(sizes, last_relu):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Head(torch.nn.Module):
    """Everything but the embedding tables: the part whose gradients the allreduce carries."""

    def __init__(self, shape):
        super().__init__()
        self.bottom = mlp((shape.dense, *shape.bottom, shape.dim), last_relu=True)
        vectors = len(shape.tables) + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = mlp((shape.dim + pairs, *shape.top, 1), last_relu=False)
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def forward(self, dense, embedded):
        """dense: B x dense features; embedded: B x tables x dim. Returns B logits."""
        x = self.bottom(dense)
        z = torch.cat([x.unsqueeze(1), embedded], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.rows, self.cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(-1)


class DLRM(torch.nn.Module):
    def __init__(self, shape=Shape()):
        super().__init__()
        self.emb = torch.nn.ModuleList(torch.nn.Embedding(n, shape.dim) for n in shape.tables)
        for table in self.emb:  # DLRM's uniform(-1/sqrt(n), 1/sqrt(n)) init
            torch.nn.init.uniform_(table.weight, -1 / math.sqrt(table.num_embeddings),
                                   1 / math.sqrt(table.num_embeddings))
        self.head = Head(shape)

    def embed(self, cats):
        return torch.stack([table(cats[:, t]) for t, table in enumerate(self.emb)], dim=1)

    def forward(self, dense, cats):
        return self.head(dense, self.embed(cats))


# ------------------------------------------------------------------------------------- data

@dataclasses.dataclass
class Dataset:
    dense: torch.Tensor  # float32, samples x dense features
    cats: torch.Tensor  # int64, samples x tables
    labels: torch.Tensor  # float32 0/1
    click_prob: torch.Tensor  # the teacher's probability (for the Bayes bounds)

    def __len__(self):
        return len(self.labels)

    def take(self, index):
        return self.dense[index], self.cats[index], self.labels[index]


def _features(rng, n, shape):
    scales = np.geomspace(0.5, 50, shape.dense)
    dense = np.log1p(rng.exponential(scales, size=(n, shape.dense))).astype(np.float32)
    cats = np.empty((n, len(shape.tables)), np.int64)
    for t, size in enumerate(shape.tables):
        freq = 1.0 / np.arange(1, size + 1) ** shape.zipf
        ids = np.random.default_rng([TEACHER_SEED, t]).permutation(size)  # frequent != small id
        cats[:, t] = ids[rng.choice(size, size=n, p=freq / freq.sum())]
    return torch.from_numpy(dense), torch.from_numpy(cats)


class Teacher:
    """The fixed labelling function: a random DLRM with standardized, rescaled logits."""

    def __init__(self, shape):
        with torch.random.fork_rng():  # the caller's random state stays as it was
            torch.manual_seed(TEACHER_SEED)
            self.model = DLRM(shape)
            for table in self.model.emb:  # embeddings of std 0.5: the interactions matter
                torch.nn.init.normal_(table.weight, 0.0, 2.0 / math.sqrt(shape.dim))
        self.shape = shape
        dense, cats = _features(np.random.default_rng([DATA_SEED, 0]), CALIBRATION, shape)
        raw = self._raw(dense, cats)
        self.mean, self.std = raw.mean(), raw.std()

    @torch.no_grad()
    def _raw(self, dense, cats):
        return torch.cat([self.model(d, c) for d, c in zip(dense.split(65536), cats.split(65536))])

    def click_prob(self, dense, cats):
        z = (self._raw(dense, cats) - self.mean) / self.std
        return torch.sigmoid(TEACHER_SCALE * z + TEACHER_SHIFT)


def make_data(teacher, n, stream):
    """n samples of stream 1 (train) or 2 (test), labels drawn from the teacher."""
    rng = np.random.default_rng([DATA_SEED, stream])
    dense, cats = _features(rng, n, teacher.shape)
    prob = teacher.click_prob(dense, cats)
    labels = torch.from_numpy((rng.random(n) < prob.numpy()).astype(np.float32))
    return Dataset(dense, cats, labels, prob)


def bayes(data):
    """Accuracy and log-loss of the teacher itself on `data`: what no student can beat."""
    p = data.click_prob.double()
    y = data.labels.double()
    acc = ((p > 0.5).double() == y).double().mean()
    loss = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    return float(acc), float(loss)


# ---------------------------------------------------------------------------------- training

def loss_fn(logits, labels):
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)


@torch.no_grad()
def evaluate(model, data, chunk=1 << 16):
    """(mean log-loss, accuracy) over `data`, in float64 sums."""
    loss_sum, correct = 0.0, 0
    for start in range(0, len(data), chunk):
        dense, cats, labels = data.take(slice(start, start + chunk))
        logits = model(dense, cats)
        loss_sum += float(torch.nn.functional.binary_cross_entropy_with_logits(
            logits, labels, reduction="sum").double())
        correct += int(((logits > 0).float() == labels).sum())
    return loss_sum / len(data), correct / len(data)


def rank_gradients(model, dense, cats, labels, nranks, alltoall=None):
    """Gradients of N data-parallel ranks, each from its own micro-batch (a 1/N slice of the
    batch, in rank order). Returns the N x n float32 tensor of the ranks' flat head (MLP)
    gradients, in model.head.parameters() order, and leaves in the embedding tables' .grad
    the average of the ranks' embedding gradients. One vmap over the ranks instead of N
    backward passes.

    The embedding vectors and their gradients travel as a model-parallel DLRM's all-to-alls
    do: exactly without `alltoall` (seeds/000 Table 3); else alltoall.forward(v) gives what
    the ranks receive of the looked-up vectors v (N receivers x micro x tables x dim) and
    alltoall.backward(g) what the tables' owners receive of the ranks' gradients g (N
    senders x micro x tables x dim): seeds/000 Table 2."""
    batch = len(labels)
    if batch % nranks:
        raise ValueError(f"batch {batch} is not a multiple of {nranks} ranks")
    micro = batch // nranks
    params = {k: v.detach() for k, v in model.head.named_parameters()}
    embedded = model.embed(cats)  # through the tables' autograd graph
    received = embedded.detach().view(nranks, micro, *embedded.shape[1:])
    if alltoall is not None:
        received = alltoall.forward(received)

    def micro_loss(p, d, e, y):
        return loss_fn(functional_call(model.head, p, (d, e)), y)

    per_rank = vmap(grad(micro_loss, argnums=(0, 2)), in_dims=(None, 0, 0, 0))
    g_params, g_emb = per_rank(params, dense.view(nranks, micro, -1), received,
                               labels.view(nranks, micro))
    if alltoall is not None:
        g_emb = alltoall.backward(g_emb)
    # the average over ranks of rank means: each sample's vector gradient counts 1/N
    embedded.backward(g_emb.reshape(embedded.shape) / nranks)
    return torch.cat([g_params[k].reshape(nranks, -1) for k in params], dim=1)


def set_flat_grads(module, flat):
    """Writes a flat averaged gradient into the .grad of module's parameters, in
    module.parameters() order (both models' quantized gradients are laid out so)."""
    offset = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def learning_rate(step, steps, base):
    """Linear warm-up over the first 5% of the steps, then linear decay to 10%: the decay is
    what lets the test loss plateau at the end of a fixed step budget."""
    warm = max(1, steps // 20)
    if step < warm:
        return base * (step + 1) / warm
    return base * (1 - 0.9 * (step - warm) / max(1, steps - warm))


# -------------------------------------------------------------------------- the benchmark's task

class Task:
    """The DLRM-style model as perf/accuracy_bench.py trains it: Adam (or plain SGD, the DLRM
    paper's optimizer) on BATCH samples a step, the head's (MLP) gradient quantized, the
    embeddings' averaged exactly or through `alltoall`; test accuracy (higher is better) and
    log-loss reported."""

    name = "dlrm"
    title = "DLRM-style model"
    metrics = ("acc", "loss")
    labels = {"acc": "acc", "loss": "log-loss"}
    BATCH = 1024  # global batch, the same for every N: one baseline trajectory per seed
    LR = {"adam": 0.003, "sgd": 3.0}  # SGD is far slower to converge on this task
    CURVE_SAMPLES = 1 << 16  # the curve's points use the first test samples; the final, all
    PLOT_SPAN = 4  # the plots' loss axis: up to this many times full precision's drop from a
    # third of the run to its end, above the lowest loss

    def __init__(self, steps, test_samples):
        self.teacher = Teacher(Shape())
        self.train = make_data(self.teacher, steps * self.BATCH, stream=1)
        self.test = make_data(self.teacher, test_samples, stream=2)
        self.curve = Dataset(*(t[:self.CURVE_SAMPLES] for t in (
            self.test.dense, self.test.cats, self.test.labels, self.test.click_prob)))

    def facts(self):
        """Bayes accuracy/log-loss, majority-class rate and label entropy of the test set."""
        clicks = float(self.test.labels.mean())
        entropy = -(clicks * math.log(clicks) + (1 - clicks) * math.log(1 - clicks))
        acc, loss = bayes(self.test)
        return {"bayes_acc": acc, "bayes_loss": loss, "majority_rate": max(clicks, 1 - clicks),
                "label_entropy": entropy}

    def __len__(self):
        return len(self.train)

    def model(self):
        return DLRM(Shape())

    def optimizer(self, model, kind):
        cls = torch.optim.SGD if kind == "sgd" else torch.optim.Adam
        return cls(model.parameters(), lr=self.LR[kind])

    def gradients(self, model, index, nranks, alltoall=None):
        return rank_gradients(model, *self.train.take(index), nranks, alltoall)

    def set_grads(self, model, flat):
        set_flat_grads(model.head, flat)

    def layers(self, model):
        """{name: values} of the quantized gradient's parameters, in its order."""
        return {n: p.numel() for n, p in model.head.named_parameters()}

    def evaluate(self, model, curve=False):
        loss, acc = evaluate(model, self.curve if curve else self.test)
        return {"acc": acc, "loss": loss}
