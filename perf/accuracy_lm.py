"""The transformer language model, its synthetic corpus and its training step, for the
accuracy benchmark's second model (perf/accuracy_bench.py --model lm).

Corpus: a fixed random source (SOURCE_SEED, independent of the training seed). Each sequence
draws one of TOPICS hidden topics, then its first token uniformly and every next token from the
topic's own bigram table: a sparse Dirichlet draw per (topic, token) row, so a row has a few
likely successors. To predict well a model must use the previous token (the table) and the
whole prefix (which topic this is): in-context inference, what attention is for. The loss no
model can beat is the source's own: -log sum_t P(t | prefix) P_t(next | last), computed exactly
by the forward filter over topics (`bayes`).

Model: a decoder-only pre-LayerNorm transformer (GPT-2's block: causal multi-head attention and
a GELU MLP, each added to the residual stream), learned positions, the output head tied to the
token embedding. Its gradient is one flat buffer of every parameter, as DDP's would be.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from accuracy_model import set_flat_grads

SOURCE_SEED = 20261124  # the corpus; training seeds only change init and data order
TOPICS = 4
ALPHA = 0.1  # Dirichlet concentration of a bigram row: about 1/ALPHA likely successors


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of the model and the corpus: 42,624 parameters, all in one flat gradient."""
    vocab: int = 48
    context: int = 48  # tokens per sequence
    dim: int = 48
    heads: int = 4
    layers: int = 2
    mlp: int = 96


class Block(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.heads = shape.heads
        self.ln1 = torch.nn.LayerNorm(shape.dim)
        self.qkv = torch.nn.Linear(shape.dim, 3 * shape.dim)
        self.proj = torch.nn.Linear(shape.dim, shape.dim)
        self.ln2 = torch.nn.LayerNorm(shape.dim)
        self.up = torch.nn.Linear(shape.dim, shape.mlp)
        self.down = torch.nn.Linear(shape.mlp, shape.dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        # causal attention written out (vmap has no batching rule for the fused CPU kernel)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(d // self.heads)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        a = torch.einsum("bhqk,bkhe->bqhe", scores.masked_fill(future, -math.inf).softmax(-1), v)
        x = x + self.proj(a.reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class LM(torch.nn.Module):
    def __init__(self, shape=Shape()):
        super().__init__()
        self.tok = torch.nn.Embedding(shape.vocab, shape.dim)
        self.pos = torch.nn.Parameter(torch.zeros(shape.context, shape.dim))
        self.blocks = torch.nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.ln = torch.nn.LayerNorm(shape.dim)
        for name, p in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual outputs
            if p.dim() == 2:                      # scaled by 1/sqrt(2 layers)
                std = 0.02 / math.sqrt(2 * shape.layers) if name.endswith(
                    ("proj.weight", "down.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, tokens):
        """tokens: B x T int64. Returns B x T x vocab logits of each next token."""
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T


# ------------------------------------------------------------------------------------- data

class Source:
    """The fixed random corpus source: TOPICS bigram tables over the vocabulary."""

    def __init__(self, shape):
        rng = np.random.default_rng([SOURCE_SEED, 0])
        self.shape = shape
        self.tables = rng.dirichlet(np.full(shape.vocab, ALPHA), size=(TOPICS, shape.vocab))

    def sample(self, n, stream):
        """n sequences of stream 1 (train), 2 (validation): int64 n x context tensor."""
        rng = np.random.default_rng([SOURCE_SEED, stream])
        v, t = self.shape.vocab, self.shape.context
        topic = rng.integers(TOPICS, size=n)
        out = np.empty((n, t), np.int64)
        out[:, 0] = rng.integers(v, size=n)
        cdf = np.cumsum(self.tables, axis=2)
        for i in range(1, t):
            rows = cdf[topic, out[:, i - 1]]
            out[:, i] = np.minimum((rows < rng.random((n, 1))).sum(axis=1), v - 1)
        return torch.from_numpy(out)

    def bayes(self, tokens):
        """The source's own mean loss (nats per predicted token) on `tokens`: what no model can
        beat. The topic posterior after each token is updated exactly (forward filter)."""
        x = tokens.numpy()
        n, t = x.shape
        log_post = np.full((n, TOPICS), -math.log(TOPICS))
        total = 0.0
        for i in range(1, t):
            p = self.tables[:, x[:, i - 1], x[:, i]].T  # n x topics: P_t(x_i | x_{i-1})
            joint = log_post + np.log(p)
            top = joint.max(axis=1, keepdims=True)
            norm = top[:, 0] + np.log(np.exp(joint - top).sum(axis=1))
            total -= norm.sum()
            log_post = joint - norm[:, None]
        return total / (n * (t - 1))

    def bigram(self, tokens):
        """The mean loss of the best predictor that ignores the topic (the topics' average
        bigram table): a model below it has learned to infer the topic from the prefix."""
        x = tokens.numpy()
        p = self.tables.mean(axis=0)[x[:, :-1], x[:, 1:]]
        return float(-np.log(p).mean())


# ---------------------------------------------------------------------------------- training

def loss_fn(logits, tokens):
    """Mean cross-entropy of each next token (positions 1..T-1 predicted from their prefix)."""
    return torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, logits.shape[-1]),
                                             tokens[..., 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, tokens, chunk=256):
    """(mean validation loss in nats per token, perplexity)."""
    total = 0.0
    for start in range(0, len(tokens), chunk):
        batch = tokens[start:start + chunk]
        total += float(loss_fn(model(batch), batch).double()) * len(batch)
    loss = total / len(tokens)
    return loss, math.exp(loss)


def rank_gradients(model, tokens, nranks):
    """Gradients of N data-parallel ranks, each from its own micro-batch (a 1/N slice of the
    batch, in rank order): the N x n float32 tensor of their flat gradients, in
    model.parameters() order. One vmap over the ranks."""
    batch = len(tokens)
    if batch % nranks:
        raise ValueError(f"batch {batch} is not a multiple of {nranks} ranks")
    params = {k: v.detach() for k, v in model.named_parameters()}

    def micro_loss(p, x):
        return loss_fn(functional_call(model, p, (x,)), x)

    g = vmap(grad(micro_loss), in_dims=(None, 0))(params, tokens.view(nranks, batch // nranks, -1))
    return torch.cat([g[k].reshape(nranks, -1) for k in params], dim=1)


# -------------------------------------------------------------------------- the benchmark's task

class Task:
    """The language model as perf/accuracy_bench.py trains it: AdamW on BATCH sequences a
    step, the whole model's gradient quantized as one buffer, validation loss and perplexity
    reported (lower is better for both)."""

    name = "lm"
    title = "decoder-only transformer LM"
    metrics = ("loss", "ppl")  # what the tables report: δ of each, relative
    labels = {"loss": "val. loss", "ppl": "perplexity"}
    BATCH = 32  # sequences of Shape.context tokens
    LR = {"adam": 0.01, "sgd": 0.5}  # AdamW (weight decay 0.01, betas 0.9/0.95) or plain SGD
    PLOT_SPAN = 1  # the plots' loss axis (as the DLRM's): the LM's loss still falls steeply

    def __init__(self, steps, eval_sequences, curve_sequences=256):
        self.shape = Shape()
        self.source = Source(self.shape)
        self.train = self.source.sample(steps * self.BATCH, stream=1)
        self.test = self.source.sample(eval_sequences, stream=2)
        self.curve = self.test[:curve_sequences]

    def facts(self):
        """Losses on the validation set: the source's own (what no model can beat), the best
        topic-blind predictor's and the uniform guess's."""
        return {"bayes_loss": float(self.source.bayes(self.test)),
                "bigram_loss": self.source.bigram(self.test),
                "uniform_loss": math.log(self.shape.vocab)}

    def __len__(self):
        return len(self.train)

    def model(self):
        return LM(self.shape)

    def optimizer(self, model, kind):
        if kind == "sgd":
            return torch.optim.SGD(model.parameters(), lr=self.LR["sgd"])
        return torch.optim.AdamW(model.parameters(), lr=self.LR["adam"], weight_decay=0.01,
                                 betas=(0.9, 0.95))

    def gradients(self, model, index, nranks, alltoall=None):
        assert alltoall is None, "the LM has no all-to-all"
        return rank_gradients(model, self.train[index], nranks)

    def set_grads(self, model, flat):
        set_flat_grads(model, flat)

    def layers(self, model):
        """{name: values} of the quantized gradient's parameters (all), in its order."""
        return {n: p.numel() for n, p in model.named_parameters()}

    def evaluate(self, model, curve=False):
        loss, ppl = evaluate(model, self.curve if curve else self.test)
        return {"loss": loss, "ppl": ppl}
